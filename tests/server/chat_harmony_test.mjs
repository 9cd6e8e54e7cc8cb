// gpt-oss's harmony format through /v1/chat/completions, driven by the openai
// JS SDK: a synthetic model carrying gpt-oss's real chat template
// (tests/text/templates/openai-gpt-oss-120b.jinja) and its control tokens
// (<|channel|>, <|message|>, <|start|>, <|end|>, <|call|>, <|return|>,
// <|constrain|>) as single vocabulary tokens, answers forced through
// ATELIER_TEST_FORCED_OUTPUT (see chat_tools_test.mjs). The markers are
// control tokens the detokenizer used to print as nothing, so the parser never
// saw a channel; they now reach it (as llama.cpp renders them), <|end|> ends a
// message but not the answer, and no marker reaches the user's content.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { BINARY, startServer } from './server_util.mjs';

const TEMPLATE = join(dirname(fileURLToPath(import.meta.url)), '..', 'text', 'templates', 'openai-gpt-oss-120b.jinja');
const MARKERS = ['<|start|>', '<|end|>', '<|message|>', '<|channel|>', '<|constrain|>', '<|return|>', '<|call|>'];
let home, server, client, forcedFile;

before(async () => {
  home = mkdtempSync(join(tmpdir(), 'atelier-chat-harmony-'));
  const env = { ...process.env, ATELIER_HOME: home };
  const model = join(home, 'gpt-oss-synth.gguf');
  execFileSync(BINARY, ['models', 'synth', '--params', '42M', '--type', 'q8_0', '--chat-template', TEMPLATE,
                        ...MARKERS.flatMap((m) => ['--special-token', m]), '-o', model], { env, stdio: 'ignore' });
  execFileSync(BINARY, ['models', 'import', model, '--name', 'gpt-oss-synth'], { env, stdio: 'ignore' });
  forcedFile = join(home, 'forced.txt');
  process.env.ATELIER_TEST_FORCED_OUTPUT = forcedFile;
  server = await startServer(home, ['-m', 'gpt-oss-synth', '--max-tokens', '400']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'anything', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  await server?.stop();
  if (home) rmSync(home, { recursive: true, force: true });
});

const force = (text) => writeFileSync(forcedFile, text);
const USER = [{ role: 'user', content: 'what is the weather in paris?' }];
const WEATHER = {
  type: 'function',
  function: { name: 'get_weather', description: 'The current weather in a city',
              parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
};
// As OpenAI's harmony guide shows an answer (the prompt ends with <|start|>assistant).
const ANSWER = '<|channel|>analysis<|message|>the user asks about weather. no tools: answer directly.<|end|>' +
               '<|start|>assistant<|channel|>final<|message|>it is probably mild.<|return|>';
// The call in the form the template writes earlier calls (the synthetic vocabulary has no token for a lone
// space, so " <|constrain|>" would come out as the bytes of U+2581).
const CALL = '<|channel|>analysis<|message|>need the tool.<|end|>' +
             '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"paris"}<|call|>';

test('the analysis channel is reasoning_content, the final channel the content, no marker in either', async () => {
  force(ANSWER);
  const r = await client.chat.completions.create({ model: 'gpt-oss-synth', messages: USER, temperature: 0, max_tokens: 200 });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, 'the user asks about weather. no tools: answer directly.');
  assert.equal(m.content, 'it is probably mild.');
  assert.equal(r.choices[0].finish_reason, 'stop');  // <|end|> ended the analysis, <|return|> the answer
});

test('streamed: reasoning then content deltas, markers never in them', async () => {
  force(ANSWER);
  const stream = await client.chat.completions.create({ model: 'gpt-oss-synth', messages: USER, temperature: 0,
                                                        max_tokens: 200, stream: true });
  let reasoning = '', content = '';
  for await (const c of stream) {
    const d = c.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    content += d.content ?? '';
  }
  assert.equal(reasoning, 'the user asks about weather. no tools: answer directly.');
  assert.equal(content, 'it is probably mild.');
  for (const marker of MARKERS) assert.ok(!(reasoning + content).includes(marker), marker);
});

test('a tool call in the commentary channel, its arguments streamed in fragments the SDK accumulates', async () => {
  force(CALL);
  const r = await client.chat.completions.create({ model: 'gpt-oss-synth', messages: USER, tools: [WEATHER], temperature: 0, max_tokens: 200 });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.reasoning_content, 'need the tool.');
  assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(r.choices[0].message.tool_calls[0].function.arguments), { city: 'paris' });

  force(CALL);
  const stream = await client.chat.completions.create({ model: 'gpt-oss-synth', messages: USER, tools: [WEATHER], temperature: 0,
                                                        max_tokens: 200, stream: true });
  let fragments = 0, name = null, args = '';
  for await (const c of stream) {
    for (const tc of c.choices[0]?.delta?.tool_calls ?? []) {
      if (tc.function?.name) name = tc.function.name;
      else if (tc.function?.arguments) { args += tc.function.arguments; ++fragments; }
    }
  }
  assert.equal(name, 'get_weather');
  assert.deepEqual(JSON.parse(args), { city: 'paris' });
  assert.ok(fragments > 2, `arguments in ${fragments} fragments`);
  // The earlier call and its result continue the conversation through the template, reasoning as `thinking`.
  force('<|channel|>final<|message|>sunny.<|return|>');
  const next = await client.chat.completions.create({
    model: 'gpt-oss-synth', tools: [WEATHER], temperature: 0, max_tokens: 60,
    messages: [...USER, { role: 'assistant', content: '', reasoning_content: 'need the tool.',
                          tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"paris"}' } }] },
               { role: 'tool', tool_call_id: 'c1', content: '{"temp":21}' }],
  });
  assert.equal(next.choices[0].message.content, 'sunny.');
  const job = await fetch(`${server.url}/v1/jobs/${next.id.replace('chatcmpl-', '')}`).then((x) => x.json());
  assert.ok(job.request.prompt.includes('<|start|>assistant<|channel|>analysis<|message|>need the tool.<|end|>'), job.request.prompt);
  assert.ok(job.request.prompt.includes('<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>'), job.request.prompt);
});
