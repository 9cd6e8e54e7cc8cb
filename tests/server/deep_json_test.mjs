// Issue 31, item 2: JSON nested thousands deep, through every route that
// reads it. A json_schema nested 8,000 levels killed `serve` (SIGSEGV in the
// schema compiler) on /v1/completions, /v1/chat/completions and /v1/jobs; an
// ignored field nested 100,000 deep killed it on /sdapi/v1/txt2img (the
// request is echoed back, and dumping it recursed per level). Each is now a
// 400 that names the nesting limit, and the server keeps answering.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { BINARY, FIXTURES, makeHome, startServer, removeHome } from './server_util.mjs';

let home, server;
before(async () => {
  home = makeHome();
  // An image model, so txt2img gets as far as echoing the request (where the crash was).
  execFileSync(BINARY, ['models', 'import', join(FIXTURES, 'image/quickdraw-cvae.safetensors'), '--name', 'quickdraw'],
               { env: { ...process.env, ATELIER_HOME: home }, stdio: ['ignore', 'ignore', 'inherit'] });
  server = await startServer(home, ['-m', 'stories260k', '--max-body-bytes', String(8 << 20)]);
});
after(async () => {
  await server?.stop();
  removeHome(home);
});

const post = (path, body) =>
  fetch(server.url + path, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                             body: typeof body === 'string' ? body : JSON.stringify(body) });

// A schema of array items DEPTH deep (its JSON nests DEPTH + 1 levels).
const itemsSchema = (depth) => '{"type":"array","items":'.repeat(depth) + '{"type":"string"}' + '}'.repeat(depth);
const deepSchema = itemsSchema(8000);  // ~200 KB, as in the issue

async function expect400(response, words) {
  const text = await response.text();
  assert.equal(response.status, 400, text.slice(0, 300));
  const body = JSON.parse(text);
  assert.match(body.error.message, words, body.error.message);
  // Still serving.
  assert.equal((await fetch(server.url + '/health')).status, 200);
}

test('/v1/completions: a json_schema nested 8,000 deep is a 400 naming the limit', async () => {
  // Built as text: JSON.stringify of the parsed schema would recurse too, in node.
  const body = `{"model":"stories260k","prompt":"Once","max_tokens":8,` +
               `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":${deepSchema}}}}`;
  await expect400(await post('/v1/completions', body), /more than 64 levels deep/);
});

test('/v1/chat/completions: the same, and a schema nested past the schema limit but not the JSON limit', async () => {
  const body = (schema) => `{"model":"stories260k","messages":[{"role":"user","content":"hi"}],"max_tokens":200,` +
                           `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":${schema}}}}`;
  await expect400(await post('/v1/chat/completions', body(deepSchema)), /more than 64 levels deep/);
  await expect400(await post('/v1/chat/completions', body(itemsSchema(40))), /nests more than 32 levels deep/);
});

test('/v1/jobs: a json_schema string nested 8,000 deep is a 400 naming the limit', async () => {
  const r = await post('/v1/jobs', { model: 'stories260k', prompt: 'Once', max_new_tokens: 8, json_schema: deepSchema });
  await expect400(r, /json_schema: the JSON schema nests objects and arrays more than 64 levels deep/);
});

test('/sdapi/v1/txt2img and img2img: an ignored field nested 100,000 deep is a 400, not a crash', async () => {
  const deep = '{"a":['.repeat(100000) + ']}'.repeat(100000);
  const fields = '"prompt":"airplane","width":32,"height":32,"override_settings":{"sd_model_checkpoint":"quickdraw"}';
  for (const route of ['/sdapi/v1/txt2img', '/sdapi/v1/img2img']) {
    await expect400(await post(route, `{${fields},"alwayson_scripts":${deep}}`),
                    /the request body nests objects and arrays more than 64 levels deep/);
  }
  // 64 levels is still a request: the picture is drawn and the request echoed.
  const ok = '['.repeat(62) + ']'.repeat(62);
  const r = await post('/sdapi/v1/txt2img', `{${fields},"alwayson_scripts":{"x":${ok}}}`);
  const text = await r.text();
  assert.equal(r.status, 200, text.slice(0, 300));
  assert.equal(JSON.parse(text).images.length, 1);
});
