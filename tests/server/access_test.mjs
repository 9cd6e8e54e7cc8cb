// What a client may reach through the API (issue 31): files only inside what
// the user shared (outputs by name in the output folder, models by store
// reference or under --models-dir), no file's bytes in an error, no request
// from another web page or host name (Content-Type, Origin, Host), CORS
// without credentials for "*", an API key compared whole, and clear errors.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, lstatSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { BINARY, FIXTURES, JSON_TYPE, makeHome, startServer, removeHome } from './server_util.mjs';

let home, server, modelsDir, outputDir, victim;
const SECRET = 'sk-SECRET-0123456789abcdef';

before(async () => {
  home = makeHome();
  execFileSync(BINARY, ['models', 'import', join(FIXTURES, 'image/quickdraw-cvae.safetensors'), '--name', 'quickdraw', '--kind', 'image'],
               { env: { ...process.env, ATELIER_HOME: home }, stdio: ['ignore', 'ignore', 'inherit'] });
  modelsDir = join(home, 'models');
  mkdirSync(modelsDir);
  copyFileSync(join(FIXTURES, 'text/stories260K.gguf'), join(modelsDir, 'stories.gguf'));
  // A file a client must never read through an error: an unterminated JSON string, outside and inside the shared folder.
  mkdirSync(join(home, 'private'));
  writeFileSync(join(home, 'private/secret.json'), `"${SECRET}`);
  writeFileSync(join(modelsDir, 'secret.json'), `"${SECRET}`);
  writeFileSync(join(modelsDir, 'notes.safetensors'), `${SECRET}\n`);
  victim = join(home, 'private/victim.txt');
  writeFileSync(victim, 'keep me');
  const dataDir = join(home, 'data');
  outputDir = join(dataDir, 'images');
  server = await startServer(home, ['-m', 'stories260k', '--models-dir', modelsDir, '--data-dir', dataDir]);
  copyFileSync(join(FIXTURES, 'image/taef2-llama-cute.recon.png'), join(outputDir, 'picture.png'));
});

after(async () => {
  await server?.stop();
  removeHome(home);
});

const post = async (path, body, headers = JSON_TYPE, url = server.url) => {
  const r = await fetch(url + path, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, text, body: json, headers: r.headers };
};
const imageJob = (extra) => ({ kind: 'image', model: 'quickdraw', prompt: 'airplane', width: 64, height: 64, ...extra });

// A request with headers fetch will not set (Host) or will rewrite.
function raw(url, { method = 'GET', path = '/v1/models', headers = {}, body } = {}) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, method, path, headers, setHost: !('Host' in headers) }, (res) => {
      let data = '';
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, text: data }));
    });
    req.on('error', reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

async function waitFinished(id) {
  for (let i = 0; i < 600; ++i) {
    const j = await (await fetch(`${server.url}/v1/jobs/${id}`)).json();
    if (['completed', 'failed', 'cancelled'].includes(j.state)) return j;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`job ${id} did not finish`);
}

test('outputs: only a new name inside the output folder; absolute, "..", links and existing files refused', async () => {
  for (const output of [victim, '../private/victim.txt', 'sub/../../private/victim.txt', '/tmp/../' + victim]) {
    const r = await post('/v1/jobs', imageJob({ output }));
    assert.equal(r.status, 403, `${output}: ${r.text}`);
    assert.equal(r.body.error.param, 'output');
    assert.match(r.body.error.message, /output folder/);
  }
  symlinkSync(victim, join(outputDir, 'link.png'));
  const link = await post('/v1/jobs', imageJob({ output: 'link.png' }));
  assert.equal(link.status, 403, link.text);
  assert.match(link.body.error.message, /symbolic link/);
  mkdirSync(join(outputDir, 'linked'), { recursive: true });
  symlinkSync(join(home, 'private'), join(outputDir, 'linked/dir'));
  assert.equal((await post('/v1/jobs', imageJob({ output: 'linked/dir/victim.txt' }))).status, 403);
  // Two images are written as NAME-1, NAME-2: a link at either is refused too.
  symlinkSync(victim, join(outputDir, 'pair-2.png'));
  assert.equal((await post('/v1/jobs', imageJob({ output: 'pair.png', batch_count: 2 }))).status, 403);

  const ok = await post('/v1/jobs', imageJob({ output: 'named.png' }));
  assert.equal(ok.status, 201, ok.text);
  const done = await waitFinished(ok.body.id);
  assert.equal(done.state, 'completed', JSON.stringify(done));
  assert.deepEqual(done.files, [join(outputDir, 'named.png')]);
  assert.deepEqual([...readFileSync(join(outputDir, 'named.png')).subarray(1, 4)], [0x50, 0x4e, 0x47]);  // "PNG"
  const again = await post('/v1/jobs', imageJob({ output: 'named.png' }));
  assert.equal(again.status, 409, again.text);
  assert.equal(again.body.error.code, 'output_exists');

  assert.equal(readFileSync(victim, 'utf8'), 'keep me');
  assert.ok(lstatSync(join(outputDir, 'link.png')).isSymbolicLink());
});

test('a missing folder in the output folder is a 404 that says so (not model_not_found)', async () => {
  const r = await post('/v1/jobs', imageJob({ output: 'no-such-folder/x.png' }));
  assert.equal(r.status, 404, r.text);
  assert.equal(r.body.error.code, 'output_folder_not_found');
  assert.match(r.body.error.message, /folder 'no-such-folder' does not exist/);
});

test('models: store references or files under --models-dir; anything else 403 whether it exists or not', async () => {
  const outside = ['/etc/passwd', '/etc/no-such-file-here', '/proc/self/mem', join(home, 'private/secret.json'),
                   modelsDir + '/../private/secret.json', '../private/secret.json', 'x/../../private/secret.json'];
  for (const model of outside) {
    for (const [path, body] of [['/v1/completions', { model, prompt: 'x', max_tokens: 1 }],
                                ['/tokenize', { model, content: 'x' }],
                                ['/v1/jobs', { model, prompt: 'x', max_new_tokens: 1 }],
                                ['/v1/jobs', imageJob({ model })]]) {
      const r = await post(path, body);
      assert.equal(r.status, 403, `${path} ${model}: ${r.text}`);
      assert.equal(r.body.error.code, 'path_not_allowed');
      assert.match(r.body.error.message, /--models-dir/);
    }
  }
  // The image job's other files: the model folders for decoders and vocabularies, the output folder for pictures.
  for (const field of ['tokenizer', 'preview_decoder']) {
    const r = await post('/v1/jobs', imageJob({ [field]: '/etc/passwd' }));
    assert.equal(r.status, 403, `${field}: ${r.text}`);
    assert.equal(r.body.error.param, field);
  }
  for (const field of ['init_image', 'mask']) {
    for (const value of ['/etc/passwd', '../private/victim.txt']) {
      const r = await post('/v1/jobs', imageJob({ init_image: 'picture.png', [field]: value }));
      assert.equal(r.status, 403, `${field} ${value}: ${r.text}`);
      assert.equal(r.body.error.param, field);
    }
  }
  const missing = await post('/v1/jobs', imageJob({ init_image: 'not-there.png' }));
  assert.equal(missing.status, 404, missing.text);
  assert.equal(missing.body.error.param, 'init_image');

  // Shared: by a path relative to --models-dir, or its absolute path.
  for (const model of ['stories.gguf', join(modelsDir, 'stories.gguf')]) {
    const r = await post('/v1/completions', { model, prompt: 'Once upon a time', max_tokens: 2, temperature: 0 });
    assert.equal(r.status, 200, `${model}: ${r.text}`);
  }
  const job = await post('/v1/jobs', { model: 'stories.gguf', prompt: 'Once', max_new_tokens: 2 });
  assert.equal(job.status, 201, job.text);
  assert.equal(job.body.request.model, join(modelsDir, 'stories.gguf'));
});

test('an error never quotes a file\'s bytes', async () => {
  for (const model of [join(home, 'private/secret.json'), join(modelsDir, 'secret.json'), 'secret.json', 'notes.safetensors']) {
    for (const [path, body] of [['/tokenize', { model, content: 'x' }], ['/detokenize', { model, tokens: [1] }],
                                ['/v1/completions', { model, prompt: 'x', max_tokens: 1 }]]) {
      const r = await post(path, body);
      assert.ok(r.status >= 400, `${path} ${model}: ${r.status}`);
      assert.ok(!r.text.includes('SECRET') && !r.text.includes('sk-'), `${path} ${model} echoed the file: ${r.text}`);
    }
  }
  // A job that fails on the file says why without its bytes either.
  const job = await post('/v1/jobs', { model: 'notes.safetensors', prompt: 'x', max_new_tokens: 1 });
  if (job.status === 201) {
    const done = await waitFinished(job.body.id);
    assert.ok(!JSON.stringify(done).includes('SECRET'), JSON.stringify(done));
  } else {
    assert.ok(!job.text.includes('SECRET'), job.text);
  }
});

test('bodies must be JSON: text/plain, forms and a missing type are 415; a bodiless POST is fine', async () => {
  const body = JSON.stringify({ model: 'stories260k', prompt: 'x', max_tokens: 1 });
  for (const type of ['text/plain', 'text/plain;charset=UTF-8', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x',
                      'application/jsonx', undefined]) {
    const headers = type === undefined ? {} : { 'Content-Type': type };
    const r = await raw(server.url, { method: 'POST', path: '/v1/completions', headers, body });
    assert.equal(r.status, 415, `${type}: ${r.text}`);
    assert.equal(JSON.parse(r.text).error.code, 'unsupported_media_type');
  }
  // The job the issue names: a cross-site "simple" request that would write a file.
  const simple = await post('/v1/jobs', JSON.stringify(imageJob({ output: 'simple.png' })), { 'Content-Type': 'text/plain' });
  assert.equal(simple.status, 415);
  assert.ok(!existsSync(join(outputDir, 'simple.png')));
  assert.equal((await post('/v1/completions', body, { 'Content-Type': 'application/json; charset=utf-8' })).status, 200);
  assert.equal((await post('/v1/completions', body, { 'Content-Type': 'Application/JSON' })).status, 200);
  assert.equal((await raw(server.url, { method: 'POST', path: '/sdapi/v1/interrupt' })).status, 200);
});

test('requests from another web page are refused; the server\'s own page is not', async () => {
  const body = JSON.stringify({ model: 'stories260k', prompt: 'x', max_tokens: 1 });
  for (const origin of ['http://evil.example', 'null', 'http://localhost.evil.example']) {
    const r = await post('/v1/completions', body, { ...JSON_TYPE, Origin: origin });
    assert.equal(r.status, 403, `${origin}: ${r.text}`);
    assert.equal(r.body.error.code, 'origin_not_allowed');
    assert.equal(r.headers.get('access-control-allow-origin'), null);
  }
  const u = new URL(server.url);
  const own = await post('/v1/completions', body, { ...JSON_TYPE, Origin: `http://${u.host}` });
  assert.equal(own.status, 200, own.text);
});

test('Host must name this server (DNS rebinding), or an --allow-host name', async () => {
  const port = new URL(server.url).port;
  for (const host of [`localhost:${port}`, `127.0.0.1:${port}`, `[::1]:${port}`, `LOCALHOST:${port}`]) {
    assert.equal((await raw(server.url, { headers: { Host: host } })).status, 200, host);
  }
  for (const host of [`evil.example:${port}`, 'evil.example', `localhost:${Number(port) + 1}`, 'localhost', `localhost.evil.example:${port}`,
                      `127.0.0.1.nip.io:${port}`, `localhost:${port}x`, `[::1]x:${port}`, `localhost:${port}:${port}`]) {
    const r = await raw(server.url, { headers: { Host: host } });
    assert.equal(r.status, 403, `${host}: ${r.text}`);
    assert.equal(JSON.parse(r.text).error.code, 'host_not_allowed');
    assert.match(JSON.parse(r.text).error.message, /--allow-host/);
  }
  const r = await raw(server.url, { method: 'POST', path: '/v1/jobs', headers: { Host: `evil.example:${port}`, ...JSON_TYPE },
                                    body: JSON.stringify(imageJob({ output: 'rebound.png' })) });
  assert.equal(r.status, 403);
  assert.ok(!existsSync(join(outputDir, 'rebound.png')));

  const named = await startServer(home, ['--allow-host', 'atelier.local', '--data-dir', join(home, 'named')]);
  try {
    const p = new URL(named.url).port;
    assert.equal((await raw(named.url, { headers: { Host: `atelier.local:${p}` } })).status, 200);
    assert.equal((await raw(named.url, { headers: { Host: `other.local:${p}` } })).status, 403);
  } finally {
    await named.stop();
  }
});

test('auth: a prefix, a longer string and a same-length wrong key are all 401; /metrics needs the key', async () => {
  const keyed = await startServer(home, ['--api-key', 'sekrit', '--data-dir', join(home, 'keyed')]);
  try {
    for (const auth of ['Bearer sek', 'Bearer sekri', 'Bearer sekritt', 'Bearer sekrix', 'Bearer Sekrit', 'Bearer ',
                        'Basic ' + Buffer.from('u:sek').toString('base64'), 'Basic ' + Buffer.from('u:sekrit2').toString('base64'),
                        'sekrit']) {
      const r = await fetch(keyed.url + '/v1/models', { headers: { Authorization: auth } });
      assert.equal(r.status, 401, auth);
    }
    assert.equal((await fetch(keyed.url + '/v1/models', { headers: { Authorization: 'Bearer sekrit' } })).status, 200);
    assert.equal((await fetch(keyed.url + '/metrics')).status, 401);
    assert.equal((await fetch(keyed.url + '/metrics', { headers: { Authorization: 'Bearer sek' } })).status, 401);
    assert.equal((await fetch(keyed.url + '/metrics', { headers: { Authorization: 'Bearer sekrit' } })).status, 200);
  } finally {
    await keyed.stop();
  }
});

test('an empty API key is an error at start, from the flag or the environment', () => {
  for (const [args, env, named] of [[['--api-key', ''], {}, '--api-key'], [[], { ATELIER_API_KEY: '' }, 'ATELIER_API_KEY']]) {
    const r = spawnSync(BINARY, ['serve', '--port', '0', '--data-dir', join(home, 'empty-key'), ...args],
                        { env: { ...process.env, ATELIER_HOME: home, ...env }, encoding: 'utf8', timeout: 20000 });
    assert.equal(r.status, 2, `${named}: rc ${r.status} ${r.stderr}`);
    assert.match(r.stderr, new RegExp(`${named} is empty`));
    assert.match(r.stderr, /give a key/);
  }
});

test('CORS: "*" answers "*" without credentials; a listed origin is reflected exactly; others get nothing', async () => {
  const any = await startServer(home, ['--cors', '*', '--data-dir', join(home, 'cors-any')]);
  const listed = await startServer(home, ['--cors', 'http://studio.example', '--data-dir', join(home, 'cors-listed')]);
  try {
    for (const origin of ['http://evil.example', 'null', 'http://studio.example']) {
      for (const method of ['GET', 'OPTIONS']) {
        const r = await fetch(any.url + '/v1/models', { method, headers: { Origin: origin, 'Access-Control-Request-Method': 'POST' } });
        assert.equal(r.headers.get('access-control-allow-origin'), '*', `${method} ${origin}`);
        assert.equal(r.headers.get('access-control-allow-credentials'), null, `${method} ${origin}`);
      }
    }
    const ok = await fetch(listed.url + '/v1/models', { headers: { Origin: 'http://studio.example' } });
    assert.equal(ok.headers.get('access-control-allow-origin'), 'http://studio.example');
    assert.equal(ok.headers.get('access-control-allow-credentials'), 'true');
    for (const origin of ['http://evil.example', 'null', 'http://studio.example.evil', 'http://STUDIO.example', 'https://studio.example']) {
      for (const method of ['GET', 'OPTIONS']) {
        const r = await fetch(listed.url + '/v1/models', { method, headers: { Origin: origin, 'Access-Control-Request-Method': 'POST' } });
        assert.equal(r.headers.get('access-control-allow-origin'), null, `${method} ${origin}`);
        assert.equal(r.headers.get('access-control-allow-credentials'), null, `${method} ${origin}`);
      }
    }
  } finally {
    await any.stop();
    await listed.stop();
  }
});

test('sd_model_checkpoint: a path outside, a file that is no image model and a text model are refused; images keep working', async () => {
  const before = await (await fetch(server.url + '/sdapi/v1/options')).json();
  for (const [value, status] of [['/etc/passwd', 403], ['/proc/self/mem', 403], [join(home, 'private/secret.json'), 403],
                                 ['../private/secret.json', 403], [join(modelsDir, 'secret.json'), 400], ['notes.safetensors', 400],
                                 ['stories.gguf', 400], ['stories260k', 400], ['no-such-model', 404]]) {
    const r = await post('/sdapi/v1/options', { sd_model_checkpoint: value });
    assert.equal(r.status, status, `${value}: ${r.text}`);
    assert.equal(r.body.error.param, 'sd_model_checkpoint');
    assert.ok(!r.text.includes('SECRET'), r.text);
    assert.deepEqual(await (await fetch(server.url + '/sdapi/v1/options')).json(), before, `${value} changed the options`);
    const t2i = await post('/sdapi/v1/txt2img', { prompt: 'airplane', width: 64, height: 64, steps: 1 });
    assert.equal(t2i.status, 200, `${value}: ${t2i.text}`);
    const own = await post('/sdapi/v1/txt2img', { prompt: 'airplane', width: 64, height: 64, override_settings: { sd_model_checkpoint: value } });
    assert.equal(own.status, status, `override ${value}: ${own.text}`);
    assert.equal(own.body.error.param, 'override_settings.sd_model_checkpoint');
  }
});

test('?limit out of range says the range', async () => {
  for (const limit of ['99999999999', '0', '-3', '10001']) {
    const r = await fetch(`${server.url}/v1/jobs?limit=${limit}`);
    assert.equal(r.status, 400, limit);
    assert.match((await r.json()).error.message, /from 1 to 10000/);
  }
  const bad = await (await fetch(`${server.url}/v1/jobs?limit=ten`)).json();
  assert.match(bad.error.message, /whole number from 1 to 10000/);
  assert.equal((await fetch(`${server.url}/v1/jobs?limit=10000`)).status, 200);
});
