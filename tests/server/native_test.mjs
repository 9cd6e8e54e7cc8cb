// The native /v1/jobs routes (engine requests in their JSON form, SSE of the
// engine's events) and llama-server's extras, against the fixtures' golden
// token ids and text; the body size limit.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { FIXTURES, JSON_TYPE, makeHome, startServer, removeHome } from './server_util.mjs';

// No CUDA module, whatever this machine has: --device auto then runs on the CPU.
process.env.ATELIER_CUDA_MODULE = '/nonexistent/libatelier_cuda.so';

let home, server;
before(async () => {
  home = makeHome();
  server = await startServer(home, ['-m', 'stories260k', '--max-body-bytes', '65536']);
});
after(async () => {
  await server?.stop();
  removeHome(home);
});

const goldenIds = readFileSync(join(FIXTURES, 'text/golden-once-upon-a-time-greedy.ids'), 'utf8').trim().split(/\s+/).map(Number);
const goldenText = readFileSync(join(FIXTURES, 'text/golden-once-upon-a-time-greedy.txt'), 'utf8').replace(/\n$/, '');
const post = (path, body, method = 'POST') =>
  fetch(server.url + path, { method, headers: JSON_TYPE, body: typeof body === 'string' ? body : JSON.stringify(body) });

// Reads an SSE response to its end: the parsed data lines, [DONE] excluded.
async function events(response) {
  const text = await response.text();
  return text.split('\n\n').filter((b) => b.startsWith('data: ') && b !== 'data: [DONE]').map((b) => JSON.parse(b.slice(6)));
}

test('/tokenize and /detokenize agree with the golden ids', async () => {
  const t = await (await post('/tokenize', { content: 'Once upon a time', add_special: true })).json();
  assert.deepEqual(t.tokens, goldenIds.slice(0, 5));
  const d = await (await post('/detokenize', { tokens: goldenIds.slice(1) })).json();
  assert.equal(d.content.replace(/^ /, ''), goldenText);
  const bad = await post('/detokenize', { tokens: [1, 99999] });
  assert.equal(bad.status, 400);
});

test('/health, /props', async () => {
  assert.deepEqual(await (await fetch(server.url + '/health')).json(), { status: 'ok' });
  const props = await (await fetch(server.url + '/props')).json();
  assert.equal(props.model_alias, 'stories260k@1');
  assert.ok(props.default_generation_settings.n_ctx > 0);
  // Issue 33: which device runs the jobs, and why (here: --device auto with no GPU).
  assert.equal(props.device.name, 'cpu');
  assert.equal(props.device.automatic, true);
  assert.match(props.device.why, /^auto: .*running on the CPU$/);
  assert.match(props.device.precision, /^weights:file act:f32 kv:/);
  assert.match(props.build_info, /^atelier \d+\.\d+\.\d+ \(git /);
  // ... and the device's figures in Prometheus' names.
  const metrics = await (await fetch(server.url + '/metrics')).text();
  assert.match(metrics, /^atelier_device_info\{device="cpu"\} 1$/m);
  assert.match(metrics, /^atelier_device_memory_total_bytes\{device="cpu"\} \d/m);
  assert.match(metrics, /^atelier_device_losses_total 0$/m);
  assert.doesNotMatch(metrics, /atelier_gpu_utilization_ratio/);  // the CPU has no sensors
});

test('POST /v1/jobs queues an engine request; its events stream as SSE and end with the result', async () => {
  const r = await post('/v1/jobs', { model: 'stories260k', prompt: 'Once upon a time', max_new_tokens: 60,
                                     sampling: { temperature: 0 } });
  assert.equal(r.status, 201);
  const job = await r.json();
  assert.ok(['queued', 'running', 'completed'].includes(job.state));
  const evs = await events(await fetch(`${server.url}/v1/jobs/${job.id}/events`));
  const done = evs.find((e) => e.type === 'completed') ?? null;
  const state = evs[0];
  assert.equal(state.type, 'state');
  const info = await (await fetch(`${server.url}/v1/jobs/${job.id}`)).json();
  assert.equal(info.state, 'completed');
  assert.equal('Once upon a time' + info.text, goldenText);
  // Where and how it ran, beside the model digest.
  assert.equal(info.device, 'cpu');
  assert.match(info.precision, /^weights:file act:f32/);
  assert.match(info.engine_build, /^atelier /);
  if (done) {  // subscribed before it finished: the tokens and the result came as events
    assert.equal(done.text, info.text);
    assert.deepEqual(done.ids, goldenIds.slice(5));
  }
});

test('DELETE /v1/jobs/{id} cancels a running job; a finished one is 409, an unknown one 404', async () => {
  const job = await (await post('/v1/jobs', { model: 'stories260k', prompt: 'Once', max_new_tokens: 480, ignore_eos: true })).json();
  const stream = fetch(`${server.url}/v1/jobs/${job.id}/events`);
  const del = await post(`/v1/jobs/${job.id}`, '', 'DELETE');
  assert.equal(del.status, 200);
  const evs = await events(await stream);
  // The stream ends with the cancel event, or, when the job was cancelled
  // before the stream read it, with its state.
  const last = evs.at(-1);
  assert.ok(last.type === 'cancelled' || (last.type === 'state' && last.state === 'cancelled'), JSON.stringify(evs));
  assert.equal((await (await fetch(`${server.url}/v1/jobs/${job.id}`)).json()).state, 'cancelled');
  assert.equal((await post(`/v1/jobs/${job.id}`, '', 'DELETE')).status, 409);
  assert.equal((await post('/v1/jobs/999999', '', 'DELETE')).status, 404);
});

test('bad native requests are refused with the field named; nothing is queued', async () => {
  const before = (await (await fetch(server.url + '/v1/jobs')).json()).data.length;
  const typo = await post('/v1/jobs', { model: 'stories260k', prompt: 'x', max_new_tokenz: 5 });
  assert.equal(typo.status, 400);
  assert.match((await typo.json()).error.message, /max_new_tokenz/);
  const tooMany = await post('/v1/jobs', { model: 'stories260k', prompt: 'x', max_new_tokens: 100000 });
  assert.equal(tooMany.status, 400);
  assert.equal((await (await fetch(server.url + '/v1/jobs')).json()).data.length, before);
});

test('a body over --max-body-bytes gets 413 in the error shape; the server keeps serving', async () => {
  const r = await post('/v1/completions', { model: 'stories260k', prompt: 'x'.repeat(100000) });
  assert.equal(r.status, 413);
  assert.equal((await r.json()).error.code, 'body_too_large');
  assert.equal((await fetch(server.url + '/health')).status, 200);
});

test('an unknown route is a 404 in the error shape', async () => {
  const r = await fetch(server.url + '/v1/nothing');
  assert.equal(r.status, 404);
  assert.equal((await r.json()).error.code, 'unknown_route');
});
