// `atelier serve` driven by the real openai JS SDK (pinned in package-lock.json)
// and by plain fetch where the SDK would hide what is sent. Expected texts come
// from the fixtures' greedy golden or from the server's own other route for the
// same request (stream vs. non-stream), never from a value copied in here.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, existsSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { FIXTURES, JSON_TYPE, makeHome, startServer, removeHome } from './server_util.mjs';

let home, server, client;

before(async () => {
  home = makeHome();
  server = await startServer(home, ['-m', 'stories260k', '--max-tokens', '500', '--cors', 'http://studio.example']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'anything', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  await server?.stop();
  removeHome(home);
});

const golden = readFileSync(join(FIXTURES, 'text/golden-once-upon-a-time-greedy.txt'), 'utf8').replace(/\n$/, '');

async function job(id) {
  const r = await fetch(`${server.url}/v1/jobs/${id}`);
  assert.equal(r.status, 200);
  return r.json();
}

test('models.list() lists the store model by the reference to use', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes('stories260k'), `got ${ids}`);
});

test('completions, greedy, echo: the fixture golden byte for byte, with usage and finish_reason', async () => {
  const r = await client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 60,
                                              temperature: 0, echo: true });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].text, golden);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.deepEqual(r.usage, { prompt_tokens: 5, completion_tokens: 60, total_tokens: 65 });  // the golden's .ids: 65 ids, BOS + 4 prompt
  assert.match(r.system_fingerprint, /^fp_[0-9a-f]{12}$/);
});

test('streamed completions give the same text as the golden, then the usage chunk and [DONE]', async () => {
  const stream = await client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 60,
                                                   temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    ++chunks;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal('Once upon a time' + text, golden);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 60);
  assert.ok(chunks > 10, `tokens arrive as they are sampled (${chunks} chunks)`);
});

test('chat: non-streaming and streaming agree; the first delta carries the role', async () => {
  const body = { model: 'stories260k', messages: [{ role: 'system', content: 'Tell stories.' },
                                                  { role: 'user', content: [{ type: 'text', text: 'A story about Lily' }] }],
                 max_tokens: 40, temperature: 0 };
  const whole = await client.chat.completions.create(body);
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.choices[0].message.role, 'assistant');
  assert.ok(whole.choices[0].message.content.length > 0);
  assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
  // The prompt the server counted is what /apply-template renders, tokenized with BOS.
  const rendered = await (await fetch(server.url + '/apply-template', { method: 'POST', headers: JSON_TYPE, body: JSON.stringify(body) })).json();
  const tokens = await (await fetch(server.url + '/tokenize', { method: 'POST', headers: JSON_TYPE,
                                                                body: JSON.stringify({ content: rendered.prompt, add_special: true }) })).json();
  assert.equal(whole.usage.prompt_tokens, tokens.tokens.length);
  assert.equal(whole.usage.completion_tokens + whole.usage.prompt_tokens, whole.usage.total_tokens);

  const stream = await client.chat.completions.create({ ...body, stream: true });
  let text = '', first = null, finishes = 0;
  for await (const c of stream) {
    assert.equal(c.object, 'chat.completion.chunk');
    first ??= c.choices[0].delta;
    text += c.choices[0]?.delta?.content ?? '';
    if (c.choices[0]?.finish_reason) ++finishes;
  }
  assert.equal(first.role, 'assistant');
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finishes, 1);
});

test('chat.completions.stream(...).finalChatCompletion() assembles the same message', async () => {
  const body = { model: 'stories260k', messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 30, temperature: 0 };
  const whole = await client.chat.completions.create(body);
  const runner = client.chat.completions.stream(body);
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.content, whole.choices[0].message.content);
  assert.equal(final.choices[0].finish_reason, whole.choices[0].finish_reason);
});

test('n: 2 gives two real choices, each its own job, streamed and not', async () => {
  const body = { model: 'stories260k', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 20, temperature: 1, seed: 7, n: 2 };
  const r = await client.chat.completions.create(body);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  assert.notEqual(r.choices[0].message.content, r.choices[1].message.content);
  const texts = ['', ''];
  const finished = [0, 0];
  for await (const c of await client.chat.completions.create({ ...body, stream: true }))
    for (const ch of c.choices) {
      texts[ch.index] += ch.delta.content ?? '';
      if (ch.finish_reason) finished[ch.index]++;
    }
  assert.deepEqual(finished, [1, 1]);
  assert.deepEqual(texts, r.choices.map((c) => c.message.content));
});

test('seed: the same seed gives the same text, another seed another text', async () => {
  const ask = (seed) => client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 40,
                                                    temperature: 1.0, top_k: 0, top_p: 1, min_p: 0, seed });
  const [a, b, c] = [await ask(123), await ask(123), await ask(124)];
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.notEqual(a.choices[0].text, c.choices[0].text);
  assert.equal(a.system_fingerprint, b.system_fingerprint);
});

test('stop strings end the text before them, with finish_reason stop', async () => {
  const r = await client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 60,
                                              temperature: 0, stop: ['Lily', 'zzz'] });
  assert.equal(r.choices[0].text, golden.slice('Once upon a time'.length, golden.indexOf('Lily')));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('aborting a stream cancels its job: the queue shows it cancelled', async () => {
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
      { model: 'stories260k', messages: [{ role: 'user', content: 'Tell a long story' }], max_tokens: 480,
        ignore_eos: true, stream: true }, { signal: controller.signal });
  let id = null, chunks = 0;
  try {  // the SDK ends the iteration quietly on an abort (some versions throw APIUserAbortError)
    for await (const c of stream) {
      id = c.id;
      if (++chunks === 3) {
        controller.abort();
        break;
      }
    }
  } catch (e) {
    if (e.name !== 'APIUserAbortError' && e.name !== 'AbortError') throw e;
  }
  const jobId = Number(id.replace('chatcmpl-', ''));
  let state = '';
  for (let i = 0; i < 100 && state !== 'cancelled'; ++i) {
    state = (await job(jobId)).state;
    if (state !== 'cancelled') await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(state, 'cancelled');
  assert.ok((await job(jobId)).stats.new_tokens < 480);
});

test('malformed requests get 400 in OpenAI\'s shape, naming the field', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'stories260k', messages: [{ role: 'user', content: 'x' }], temperature: 'hot' }),
                       (e) => e.status === 400 && e.param === 'temperature' && /temperature/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'stories260k', messages: [{ role: 'user', content: 'x' }], n: 0 }),
                       (e) => e.status === 400 && e.param === 'n');
  await assert.rejects(client.completions.create({ model: 'stories260k', prompt: 'x', max_tokens: 100000 }),
                       (e) => e.status === 400 && e.param === 'max_tokens');
  await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
                       (e) => e.status === 404 && e.code === 'model_not_found');
  const raw = await fetch(server.url + '/v1/chat/completions', { method: 'POST', headers: JSON_TYPE, body: '{"messages": [' });
  assert.equal(raw.status, 400);
  const err = (await raw.json()).error;
  assert.equal(err.type, 'invalid_request_error');
  assert.ok(err.message.length > 0);
  const noMessages = await fetch(server.url + '/v1/chat/completions', { method: 'POST', headers: JSON_TYPE, body: '{"model": "stories260k"}' });
  assert.equal(noMessages.status, 400);
  assert.equal((await noMessages.json()).error.param, 'messages');
});

test('unknown fields are ignored', async () => {
  const r = await client.chat.completions.create({ model: 'stories260k', messages: [{ role: 'user', content: 'Hi' }],
                                                   max_tokens: 5, temperature: 0, some_client_extra: { a: 1 }, user: 'me' });
  assert.equal(r.choices.length, 1);
});

test('16 concurrent streaming clients are decoded in shared batches (the batch-size metric shows it)', async () => {
  const metric = async () => {
    const text = await (await fetch(server.url + '/metrics')).text();
    const bucket = (le) => Number(text.match(new RegExp(`atelier_batch_size_bucket\\{le="${le}"\\} (\\S+)`))[1]);
    const value = (re) => Number(text.match(re)[1]);
    return { upTo8: bucket(8), all: value(/atelier_batch_size_count (\S+)/), text,
             sequenceSteps: value(/^atelier_batch_size_sum (\S+)/m),
             completed: value(/^atelier_jobs_finished_total\{state="completed"\} (\S+)/m),
             running: value(/^atelier_jobs_running (\S+)/m), kvUsed: value(/^atelier_kv_blocks\{state="used"\} (\S+)/m) };
  };
  const before = await metric();
  // Paused while the 16 arrive (through the queue database, as another
  // process would), so their arrival spread on a loaded machine cannot keep
  // them apart; resumed once all 16 wait.
  const cli = (...args) => execFileSync(process.env.ATELIER_BINARY, args, { env: { ...process.env, ATELIER_HOME: home } }).toString();
  cli('queue', 'pause');
  const one = async () => {
    let n = 0;
    // Long enough (300 tokens) that all 16 overlap even when a loaded machine spreads their arrival.
    for await (const c of await client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 300,
                                                            ignore_eos: true, stream: true }))
      n += c.choices.length && c.choices[0].text ? 1 : 0;
    return n;
  };
  const running = Promise.all(Array.from({ length: 16 }, one));
  for (let i = 0; i < 600; ++i) {
    const queued = cli('queue', 'list', '--json').split('\n').filter((l) => l.includes('"queued"')).length;
    if (queued >= 16) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  cli('queue', 'resume');
  const counts = await running;
  assert.ok(counts.every((n) => n > 0));
  // The last chunk can reach a client before its job's end is counted: wait for the counts to settle.
  let afterM = await metric();
  for (let i = 0; i < 100 && (afterM.running > 0 || afterM.completed - before.completed < 16); ++i) {
    await new Promise((r) => setTimeout(r, 50));
    afterM = await metric();
  }
  const bigSteps = (afterM.all - afterM.upTo8) - (before.all - before.upTo8);
  assert.ok(bigSteps > 0, `some steps decoded more than 8 sequences (steps with > 8: ${bigSteps})`);
  // The values these 16 jobs caused: 16 more completed, and 16 x 300 tokens
  // sampled, each in a step's batch (a job's first token may come from its
  // prompt's step instead); nothing left running or holding KV blocks.
  assert.equal(afterM.completed - before.completed, 16);
  const sequenceSteps = afterM.sequenceSteps - before.sequenceSteps;
  assert.ok(sequenceSteps >= 16 * 299 && sequenceSteps <= 16 * 300, `sequences summed over the steps: ${sequenceSteps}`);
  assert.equal(afterM.running, 0, 'jobs still running');
  assert.equal(afterM.kvUsed, 0, 'KV blocks still in use');
});

test('/metrics is valid Prometheus text (promtool check metrics)', { skip: !existsSync('/usr/bin/promtool') && 'promtool not installed' }, async () => {
  const text = await (await fetch(server.url + '/metrics')).text();
  execFileSync('promtool', ['check', 'metrics'], { input: text });  // throws, with promtool's complaints, on a problem
  assert.match(text, /# TYPE atelier_batch_size histogram/);
});

test('CORS: an allowed origin gets its preflight and the header; another does not', async () => {
  const pre = await fetch(server.url + '/v1/chat/completions', { method: 'OPTIONS',
    headers: { Origin: 'http://studio.example', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, content-type' } });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get('access-control-allow-origin'), 'http://studio.example');
  assert.match(pre.headers.get('access-control-allow-headers'), /authorization/);
  const other = await fetch(server.url + '/v1/models', { headers: { Origin: 'http://evil.example' } });
  assert.equal(other.headers.get('access-control-allow-origin'), null);
});

test('auth: with --api-key, a wrong or missing key is 401; the key as Bearer or Basic password works', async () => {
  const keyed = await startServer(home, ['-m', 'stories260k', '--api-key', 'sekrit', '--data-dir', join(home, 'keyed')]);
  try {
    const bad = new OpenAI({ baseURL: keyed.url + '/v1', apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401 && e.code === 'invalid_api_key');
    const none = await fetch(keyed.url + '/v1/models');
    assert.equal(none.status, 401);
    const good = new OpenAI({ baseURL: keyed.url + '/v1', apiKey: 'sekrit', maxRetries: 0 });
    const r = await good.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 3, temperature: 0 });
    assert.equal(r.choices.length, 1);
    const basic = await fetch(keyed.url + '/sdapi/v1/samplers',
                              { headers: { Authorization: 'Basic ' + Buffer.from('user:sekrit').toString('base64') } });
    assert.notEqual(basic.status, 401);
    const basicWrong = await fetch(keyed.url + '/v1/models',
                                   { headers: { Authorization: 'Basic ' + Buffer.from('user:nope').toString('base64') } });
    assert.equal(basicWrong.status, 401);
    assert.equal((await fetch(keyed.url + '/health')).status, 200);  // load balancers probe without a key
  } finally {
    await keyed.stop();
  }
});

test('response_format json_schema: the output parses and validates (ajv), streamed and not; json_object gives an object', async () => {
  const schema = {
    type: 'object',
    properties: { name: { type: 'string' }, age: { type: 'integer' }, happy: { type: 'boolean' },
                  mood: { enum: ['happy', 'sad'] }, scores: { type: 'array', items: { type: 'number' } },
                  pet: { type: 'object', properties: { kind: { type: 'string' } }, required: ['kind'], additionalProperties: false } },
    required: ['name', 'age', 'happy', 'mood', 'scores', 'pet'], additionalProperties: false,
  };
  const validate = new Ajv().compile(schema);
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      model: 'stories260k', messages: [{ role: 'user', content: 'Describe Lily as JSON' }], max_tokens: 480, seed, temperature: 1,
      response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } } });
    assert.equal(r.choices[0].finish_reason, 'stop');
    const value = JSON.parse(r.choices[0].message.content);
    assert.ok(validate(value), JSON.stringify(validate.errors) + ' ' + r.choices[0].message.content);
  }
  const runner = client.chat.completions.stream({
    model: 'stories260k', messages: [{ role: 'user', content: 'JSON please' }], max_tokens: 480, seed: 9,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema } } });
  assert.ok(validate(JSON.parse((await runner.finalChatCompletion()).choices[0].message.content)));
  const obj = await client.chat.completions.create({ model: 'stories260k', messages: [{ role: 'user', content: 'x' }],
                                                     max_tokens: 480, seed: 4, response_format: { type: 'json_object' } });
  const parsed = JSON.parse(obj.choices[0].message.content);
  assert.equal(typeof parsed, 'object');
  assert.ok(parsed !== null && !Array.isArray(parsed));
  await assert.rejects(client.chat.completions.create({ model: 'stories260k', messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^a' } } } }),
    (e) => e.status === 400 && e.param === 'response_format' && /pattern/.test(e.message));
});

test('logprobs: greedy tokens are the most likely ones, the pieces spell the text, probabilities are proper', async () => {
  const r = await client.chat.completions.create({ model: 'stories260k', messages: [{ role: 'user', content: 'Hi' }],
                                                   max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  assert.equal(content.map((t) => t.token).join(''), r.choices[0].message.content);
  for (const t of content) {
    assert.equal(t.top_logprobs.length, 3);
    assert.equal(t.top_logprobs[0].token, t.token);  // greedy: the sampled token is the likeliest
    assert.equal(t.top_logprobs[0].logprob, t.logprob);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob);
    assert.ok(t.top_logprobs.reduce((s, x) => s + Math.exp(x.logprob), 0) <= 1 + 1e-5);
    assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
  }
  // Streamed: the SDK assembles the same logprobs (they come with each choice's finish chunk).
  const final = await client.chat.completions.stream({ model: 'stories260k', messages: [{ role: 'user', content: 'Hi' }],
                                                       max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 }).finalChatCompletion();
  assert.deepEqual(final.choices[0].logprobs.content, content);
  // Legacy completions: the golden's greedy tokens, offsets into the text.
  const c = await client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 10, temperature: 0, logprobs: 2 });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.join(''), c.choices[0].text);
  assert.equal(c.choices[0].text, golden.slice('Once upon a time'.length).slice(0, c.choices[0].text.length));
  lp.text_offset.forEach((o, i) => assert.equal(o, lp.tokens.slice(0, i).join('').length));
  lp.top_logprobs.forEach((top, i) => assert.equal(Math.max(...Object.values(top)), lp.token_logprobs[i]));
});
