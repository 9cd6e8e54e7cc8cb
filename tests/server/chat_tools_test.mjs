// Reasoning and tool calls through /v1/chat/completions, driven by the openai
// JS SDK, against a synthetic model carrying Qwen3's real chat template
// (tests/text/templates). A random model writes no <think> block or call of
// its own, so the answers are forced: ATELIER_TEST_FORCED_OUTPUT names a file
// whose text the model "prefers" token by token (generation.h). What this
// tests is everything after the logits: the template's rendering of tools and
// earlier turns, the JSON-schema constraint on a call's arguments (it
// overrules a forced text that breaks the schema), the parsing of reasoning
// and calls out of a stream whose markers arrive split over many tokens, and
// the response shapes the SDK reads. It does not test that a model chooses to call.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { BINARY, startServer } from './server_util.mjs';

const TEMPLATE = join(dirname(fileURLToPath(import.meta.url)), '..', 'text', 'templates', 'Qwen-Qwen3-0.6B.jinja');
let home, server, client, forcedFile;

before(async () => {
  home = mkdtempSync(join(tmpdir(), 'atelier-chat-tools-'));
  const env = { ...process.env, ATELIER_HOME: home };
  const model = join(home, 'qwen3-synth.gguf');
  // 42M: a context of 1024 tokens holds the tools' system prompt.
  execFileSync(BINARY, ['models', 'synth', '--params', '42M', '--type', 'q8_0', '--chat-template', TEMPLATE, '-o', model], { env, stdio: 'ignore' });
  execFileSync(BINARY, ['models', 'import', model, '--name', 'qwen3-synth'], { env, stdio: 'ignore' });
  forcedFile = join(home, 'forced.txt');
  process.env.ATELIER_TEST_FORCED_OUTPUT = forcedFile;
  server = await startServer(home, ['-m', 'qwen3-synth', '--max-tokens', '300']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'anything', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  await server?.stop();
  if (home) rmSync(home, { recursive: true, force: true });
});

// Requests run one at a time (node:test runs a file's tests in order), each after its forced text is written.
const force = (text) => writeFileSync(forcedFile, text);

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};
const USER = [{ role: 'user', content: 'what is the weather in paris?' }];
const ANSWER = '<think>\nthe user wants the weather.\nI should call the tool.\n</think>\n\nlet me look.\n' +
               '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>';

async function jobPrompt(completionId) {
  const r = await fetch(`${server.url}/v1/jobs/${completionId.replace('chatcmpl-', '')}`);
  assert.equal(r.status, 200);
  return (await r.json()).request.prompt;
}

test('non-streamed: reasoning_content, content and tool_calls with finish_reason tool_calls', async () => {
  force(ANSWER);
  const r = await client.chat.completions.create({ model: 'qwen3-synth', messages: USER, tools: [WEATHER], temperature: 0, max_tokens: 200 });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, 'the user wants the weather.\nI should call the tool.');
  assert.equal(m.content, 'let me look.\n');
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.match(m.tool_calls[0].id, /^call_/);
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris' });
  // The tools reached the template: Qwen3's system block lists them.
  const prompt = await jobPrompt(r.id);
  assert.ok(prompt.includes('<tools>\n{"type": "function", "function": {"name": "get_weather"'), prompt.slice(0, 400));
});

test('streamed: delta.reasoning_content, then content, then tool_calls the SDK assembles', async () => {
  force(ANSWER);
  const stream = await client.chat.completions.create({ model: 'qwen3-synth', messages: USER, tools: [WEATHER], temperature: 0,
                                                        max_tokens: 200, stream: true });
  let reasoning = '', content = '', reasoningChunks = 0, finish = null, sawContentBeforeReasoningEnded = false;
  const calls = [];
  for await (const c of stream) {
    const ch = c.choices[0];
    if (!ch) continue;
    if (ch.delta.reasoning_content) {
      reasoning += ch.delta.reasoning_content;
      ++reasoningChunks;
      if (content) sawContentBeforeReasoningEnded = true;
    }
    if (ch.delta.content) content += ch.delta.content;
    for (const tc of ch.delta.tool_calls ?? []) {
      if (tc.id) calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: tc.function.arguments ?? '' };
      else calls[tc.index].arguments += tc.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(reasoning, 'the user wants the weather.\nI should call the tool.');
  assert.ok(reasoningChunks > 3, `reasoning streamed in pieces (${reasoningChunks})`);
  assert.ok(!sawContentBeforeReasoningEnded);
  assert.equal(content, 'let me look.\n');
  assert.ok(!content.includes('<'), 'no marker leaks into the content');
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].arguments), { city: 'Paris' });

  // The SDK's own stream helper assembles the same message.
  force(ANSWER);
  const helper = client.chat.completions.stream({ model: 'qwen3-synth', messages: USER, tools: [WEATHER], temperature: 0, max_tokens: 200 });
  const done = await helper.finalChatCompletion();
  assert.equal(done.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(done.choices[0].message.tool_calls[0].function.arguments), { city: 'Paris' });
});

test('a named tool_choice forces the call, and the schema overrules arguments that break it', async () => {
  // The forced text gives city a number; the tool's schema wants one of two strings.
  force('{"name":"get_weather","arguments":{"city":42}}');
  const tool = structuredClone(WEATHER);
  tool.function.parameters.properties.city = { enum: ['Paris', 'Lyon'] };
  const r = await client.chat.completions.create({ model: 'qwen3-synth', messages: USER, tools: [tool], temperature: 0,
                                                   max_tokens: 100, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  const calls = r.choices[0].message.tool_calls;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'get_weather');
  const args = JSON.parse(calls[0].function.arguments);
  assert.ok(['Paris', 'Lyon'].includes(args.city), JSON.stringify(args));
});

test('with tool_choice auto the constraint waits for the call: free text (not JSON) before it is untouched', async () => {
  force('Checking{not:json}.\n<tool_call>\n{"name":"get_weather","arguments":{"city":"Lyon"}}\n</tool_call>');
  const r = await client.chat.completions.create({ model: 'qwen3-synth', messages: USER, tools: [WEATHER], temperature: 0, max_tokens: 120 });
  const m = r.choices[0].message;
  assert.equal(m.content, 'Checking{not:json}.\n');  // a constraint active from the start would have refused it
  assert.equal(m.tool_calls?.length, 1, JSON.stringify(m));
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Lyon' });
});

test('tool_choice required with a forced answer that is no call still yields a valid call', async () => {
  force('just text, no call');
  const r = await client.chat.completions.create({ model: 'qwen3-synth', messages: USER, tools: [WEATHER], temperature: 0,
                                                   max_tokens: 100, tool_choice: 'required' });
  const calls = r.choices[0].message.tool_calls;
  assert.equal(calls?.length, 1, JSON.stringify(r.choices[0].message));
  assert.equal(calls[0].function.name, 'get_weather');
  assert.equal(typeof JSON.parse(calls[0].function.arguments).city, 'string');
});

test('a tool result continues the conversation through the template; earlier reasoning stays out', async () => {
  force('Sunny and mild.');  // (the synthetic vocabulary spells a space before a digit or capital oddly: none here)
  const messages = [
    ...USER,
    { role: 'assistant', content: 'let me look.', reasoning_content: 'SECRET-REASONING',
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp":21}' },
    { role: 'user', content: 'thanks!' },
  ];
  const r = await client.chat.completions.create({ model: 'qwen3-synth', messages, tools: [WEATHER], temperature: 0, max_tokens: 60 });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.content, 'Sunny and mild.');
  assert.equal(r.choices[0].message.tool_calls, undefined);
  const prompt = await jobPrompt(r.id);
  assert.ok(prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'), prompt);
  assert.ok(prompt.includes('<|im_start|>user\n<tool_response>\n{"temp":21}\n</tool_response><|im_end|>'), prompt);
  assert.ok(!prompt.includes('SECRET-REASONING'), 'a turn before the last question keeps its reasoning out');
});

test('reasoning_format none leaves the block inline; tool_choice none renders no tools and parses no call', async () => {
  force(ANSWER);
  const inline = await fetch(server.url + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'qwen3-synth', messages: USER, temperature: 0, max_tokens: 200, reasoning_format: 'none' }),
  }).then((r) => r.json());
  assert.equal(inline.choices[0].message.reasoning_content, undefined);
  assert.equal(inline.choices[0].message.content, ANSWER);

  force(ANSWER);
  const none = await client.chat.completions.create({ model: 'qwen3-synth', messages: USER, tools: [WEATHER], temperature: 0,
                                                      max_tokens: 200, tool_choice: 'none' });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.equal(none.choices[0].finish_reason, 'stop');
  assert.ok(none.choices[0].message.content.includes('<tool_call>'));
  assert.ok(!(await jobPrompt(none.id)).includes('<tools>'));
});

test('bad tools and tool_choice get a 400 naming the field', async () => {
  for (const [body, param] of [
    [{ tools: [{ type: 'function', function: {} }] }, 'tools[0].function.name'],
    [{ tools: 'get_weather' }, 'tools'],
    [{ tools: [WEATHER], tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tools: [WEATHER], tool_choice: 'sometimes' }, 'tool_choice'],
  ]) {
    const r = await fetch(server.url + '/v1/chat/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'qwen3-synth', messages: USER, max_tokens: 5, ...body }),
    });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.equal((await r.json()).error.param, param);
  }
});

test('streamed tool-call arguments come in fragments as the model writes them, and the SDK accumulates them', async () => {
  force(ANSWER);
  const stream = await client.chat.completions.create({ model: 'qwen3-synth', messages: USER, tools: [WEATHER], temperature: 0,
                                                        max_tokens: 200, stream: true });
  let nameChunks = 0, argChunks = 0, args = '', sawArgsBeforeFinish = false, finished = false;
  for await (const c of stream) {
    const ch = c.choices[0];
    if (!ch) continue;
    for (const tc of ch.delta.tool_calls ?? []) {
      assert.equal(tc.index, 0);
      if (tc.function?.name) {
        ++nameChunks;
        assert.equal(args, '', 'the name comes before any argument');
      } else {
        ++argChunks;
        args += tc.function.arguments;
        if (!finished) sawArgsBeforeFinish = true;
      }
    }
    if (ch.finish_reason) finished = true;
  }
  assert.equal(nameChunks, 1);
  assert.ok(argChunks > 3, `arguments in ${argChunks} fragments, not one piece once the call is whole`);
  assert.ok(sawArgsBeforeFinish);
  assert.deepEqual(JSON.parse(args), { city: 'Paris' });
  // The SDK's own accumulation (ChatCompletionStream) gives the same call.
  force(ANSWER);
  const done = await client.chat.completions.stream({ model: 'qwen3-synth', messages: USER, tools: [WEATHER], temperature: 0,
                                                      max_tokens: 200 }).finalChatCompletion();
  assert.equal(done.choices[0].message.tool_calls[0].function.arguments, args);
});
