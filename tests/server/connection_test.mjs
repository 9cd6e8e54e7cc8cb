// The connection layer (app/server/connections.cpp) through raw TCP sockets,
// as a hostile or careless client would use it: body limits that hold for
// chunked bodies, framing answered at once, slow and idle connections that
// cannot keep /health from answering, pipelining, and a client's disconnect
// that cancels its own job only, while one that half-closes gets its answer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BINARY, makeHome, startServer, removeHome } from './server_util.mjs';

let home, server;
before(async () => {
  home = makeHome();
  server = await startServer(home, ['--max-body-bytes', String(1 << 20), '--header-timeout', '1', '--body-timeout', '1']);
});
after(async () => {
  await server?.stop();
  removeHome(home);
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(cond, ms, what) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`no ${what} within ${ms} ms`);
    await sleep(10);
  }
}

// A raw TCP client: what arrived, whether the server closed, and wait() for
// the next thing that happens (data, drain, close, error).
async function connect(url, options = {}) {
  const { hostname, port } = new URL(url);
  const sock = net.connect({ host: hostname, port: Number(port), ...options });
  // The requests below say `Host: x`; the server answers only its own
  // address and port (app/server/access.cpp), so each socket names it.
  const named = (s) => (typeof s === 'string' ? s.replace(/Host: x(\r?\n)/g, `Host: ${hostname}:${port}$1`) : s);
  const [write, end] = [sock.write.bind(sock), sock.end.bind(sock)];
  sock.write = (s, ...rest) => write(named(s), ...rest);
  sock.end = (s, ...rest) => (s === undefined ? end() : end(named(s), ...rest));
  const c = { sock, data: '', closed: false, error: null, waiters: [] };
  const wakeAll = () => c.waiters.splice(0).forEach((r) => r());
  c.wait = () => new Promise((r) => c.waiters.push(r));
  sock.on('data', (d) => { c.data += d.toString('latin1'); wakeAll(); });
  sock.on('drain', wakeAll);
  sock.on('error', (e) => { c.error = e; wakeAll(); });
  sock.on('close', () => { c.closed = true; wakeAll(); });
  await new Promise((resolve, reject) => { sock.once('connect', resolve); sock.once('error', reject); });
  return c;
}

// The responses in BYTES (Content-Length framed, as every answer here is).
function responses(bytes) {
  const out = [];
  let rest = bytes;
  for (;;) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) return out;
    const head = rest.slice(0, end);
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
    if (rest.length < end + 4 + length) return out;
    const body = rest.slice(end + 4, end + 4 + length);
    out.push({ status: Number(head.slice(9, 12)), head, body, json: body.startsWith('{') ? JSON.parse(body) : null });
    rest = rest.slice(end + 4 + length);
  }
}
const firstResponse = async (c, ms, what) => {
  await until(() => responses(c.data).length > 0 || c.closed, ms, what);
  const r = responses(c.data)[0];
  assert.ok(r, `${what}: the server closed without an answer (got ${JSON.stringify(c.data.slice(0, 200))})`);
  return r;
};
const peakRssKiB = (pid) => Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);
const queue = (verb) => execFileSync(BINARY, ['queue', verb], { env: { ...process.env, ATELIER_HOME: home }, stdio: 'ignore' });
const jobs = async () => (await (await fetch(server.url + '/v1/jobs')).json()).data;
const completion = (prompt) => {
  const body = JSON.stringify({ model: 'stories260k', prompt, max_tokens: 4, temperature: 0 });
  return `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n` +
         `Connection: close\r\n\r\n${body}`;
};

test('a chunked body over --max-body-bytes gets 413 before it is read; the server does not hold it', { timeout: 30000 }, async () => {
  const peakBefore = peakRssKiB(server.child.pid);
  const c = await connect(server.url);
  c.sock.write('POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n');
  const chunk = Buffer.concat([Buffer.from('10000\r\n'), Buffer.alloc(1 << 16, 0x20), Buffer.from('\r\n')]);
  // 128 MiB offered, sent as the server takes it, until it answers.
  for (let sent = 0; sent < 128 << 20 && !c.data && !c.closed && !c.error; sent += 1 << 16)
    if (!c.sock.write(chunk)) await c.wait();
  if (!c.data && !c.closed && !c.error) c.sock.write('0\r\n\r\n');
  const r = await firstResponse(c, 10000, 'answer to a 128 MiB chunked body');
  assert.equal(r.status, 413, r.body);
  assert.equal(r.json.error.code, 'body_too_large');
  assert.match(r.json.error.message, /1048576 bytes \(--max-body-bytes\)/);
  assert.match(r.head, /\r\nConnection: close/i);
  const grownMiB = (peakRssKiB(server.child.pid) - peakBefore) / 1024;
  assert.ok(grownMiB < 48, `the server's peak memory grew by ${grownMiB.toFixed(0)} MiB for a refused body`);
  c.sock.destroy();
  assert.equal((await fetch(server.url + '/health')).status, 200);
});

test('bad chunked framing is a 400 that says what is wrong', { timeout: 10000 }, async () => {
  for (const [body, words] of [['zz\r\nab\r\n0\r\n\r\n', /hexadecimal/], ['2\r\nabcd\r\n0\r\n\r\n', /longer than its size/],
                               ['0\r\nX-Trailer: 1\r\n\r\n', /trailer/]]) {
    const c = await connect(server.url);
    c.sock.write(`POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${body}`);
    const r = await firstResponse(c, 3000, 'answer to a malformed chunked body');
    assert.equal(r.status, 400, body);
    assert.equal(r.json.error.code, 'bad_chunked_body');
    assert.match(r.json.error.message, words);
    c.sock.destroy();
  }
});

test('a Content-Length of 1e11 is answered 413 at once, before the key or the body', { timeout: 10000 }, async () => {
  const c = await connect(server.url);
  const start = Date.now();
  c.sock.write('POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000000000\r\n\r\n{"a":');
  const r = await firstResponse(c, 2000, 'answer to Content-Length: 100000000000');
  assert.equal(r.status, 413);
  assert.match(r.json.error.message, /Content-Length 100000000000.*1048576 bytes/);
  await until(() => c.closed, 3000, 'close after the 413');
  assert.ok(Date.now() - start < 3000);
});

test('framing that cannot be trusted is refused with words: bad lengths, other transfer codings', { timeout: 10000 }, async () => {
  const cases = [
    ['Content-Length: 1e11', 400, 'bad_content_length'],
    ['Content-Length: -5', 400, 'bad_content_length'],
    ['Content-Length: 5\r\nContent-Length: 6', 400, 'bad_content_length'],
    ['Transfer-Encoding: gzip, chunked', 501, 'unsupported_transfer_encoding'],
    ['Transfer-Encoding: chunked\r\nContent-Length: 5', 400, 'ambiguous_body_length'],
  ];
  for (const [headers, status, code] of cases) {
    const c = await connect(server.url);
    c.sock.write(`POST /v1/jobs HTTP/1.1\r\nHost: x\r\n${headers}\r\n\r\n`);
    const r = await firstResponse(c, 2000, `answer to ${headers}`);
    assert.equal(r.status, status, headers);
    assert.equal(r.json.error.code, code, headers);
    c.sock.destroy();
  }
});

test('a head that does not parse and a body cut short are told so', { timeout: 10000 }, async () => {
  const garbage = await connect(server.url);
  garbage.sock.write('HELLO THERE\r\n\r\n');
  let r = await firstResponse(garbage, 2000, 'answer to a head that is no request');
  assert.equal(r.status, 400);
  assert.equal(r.json.error.code, 'bad_request_head');
  garbage.sock.destroy();
  const bareLf = await connect(server.url);
  bareLf.sock.write('GET /health HTTP/1.1\nHost: x\n\n');
  r = await firstResponse(bareLf, 2000, 'answer to a head with bare LF line ends');
  assert.equal(r.status, 400);
  assert.match(r.json.error.message, /CRLF/);
  bareLf.sock.destroy();
  const cut = await connect(server.url, { allowHalfOpen: true });
  cut.sock.end('POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model":');
  r = await firstResponse(cut, 2000, 'answer to a body cut short');
  assert.equal(r.status, 400);
  assert.equal(r.json.error.code, 'incomplete_body');
  assert.match(r.json.error.message, /91 bytes before the end of the request body \(Content-Length 100\)/);
  cut.sock.destroy();
});

test('a PUT or POST without a length has no body: answered at once', { timeout: 10000 }, async () => {
  for (const [request, status] of [['PUT /v1/jobs', 404], ['POST /v1/jobs', 400]]) {
    const c = await connect(server.url);
    c.sock.write(`${request} HTTP/1.1\r\nHost: x\r\n\r\n`);
    const r = await firstResponse(c, 2000, `answer to ${request} without a length`);
    assert.equal(r.status, status, r.body);
    c.sock.destroy();
  }
});

test('a request head or body that trickles in gets 408 after --header-timeout / --body-timeout', { timeout: 10000 }, async () => {
  const head = await connect(server.url);
  head.sock.write('GET /health HTTP/1.1\r\n');
  const trickle = setInterval(() => head.sock.write('X'), 200);  // a header byte every 200 ms, as slowloris does
  try {
    const r = await firstResponse(head, 4000, '408 for a slow head');
    assert.equal(r.status, 408);
    assert.match(r.json.error.message, /--header-timeout/);
  } finally {
    clearInterval(trickle);
    head.sock.destroy();
  }
  const body = await connect(server.url);
  body.sock.write('POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model"');
  const r = await firstResponse(body, 4000, '408 for a slow body');
  assert.equal(r.status, 408);
  assert.match(r.json.error.message, /--body-timeout/);
  body.sock.destroy();
});

test('pipelined requests are answered in order on one connection', { timeout: 10000 }, async () => {
  const c = await connect(server.url);
  const body = '{"content":"Once upon a time"}';
  c.sock.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n' +
               `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}` +
               'GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  await until(() => c.closed, 3000, 'three answers and a close');
  assert.deepEqual(responses(c.data).map((r) => r.status), [200, 400, 404]);  // no model given: /tokenize says so
});

test('80 slowloris sockets and 300 idle ones do not keep /health from answering', { timeout: 60000 }, async () => {
  const floodedHome = mkdtempSync(join(tmpdir(), 'atelier-serve-test-'));
  const flooded = await startServer(floodedHome);  // the defaults: --max-connections 256, --header-timeout 10
  const attackers = [];
  try {
    for (let i = 0; i < 80; ++i) {
      const c = await connect(flooded.url);
      c.sock.write('GET /health HTTP/1.1\r\nHost: x\r\n');  // a head that never ends
      attackers.push(c);
    }
    for (let i = 0; i < 300; ++i) attackers.push(await connect(flooded.url));
    const health = await connect(flooded.url);
    const start = Date.now();
    health.sock.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    const r = await firstResponse(health, 2000, '/health under 380 slow and idle connections');
    assert.equal(r.status, 200);
    assert.ok(Date.now() - start < 2000);
    // The cap: the connections that waited longest were closed to make room,
    // the slow heads with a 503 that says why.
    await until(() => attackers.filter((c) => c.closed).length >= attackers.length - 255, 3000, 'eviction down to the cap');
    for (const c of attackers.slice(0, 80).filter((a) => a.closed)) {
      const evicted = responses(c.data)[0];
      assert.equal(evicted?.status, 503, c.data);
      assert.equal(evicted.json.error.code, 'connection_evicted');
    }
  } finally {
    attackers.forEach((c) => c.sock.destroy());
    await flooded.stop();
    removeHome(floodedHome);
  }
});

test('at the cap, with every connection trickling a body, the slowest is closed so /health answers', { timeout: 30000 }, async () => {
  const smallHome = mkdtempSync(join(tmpdir(), 'atelier-serve-test-'));
  const small = await startServer(smallHome, ['--max-connections', '8']);
  const slow = [];
  try {
    for (let i = 0; i < 8; ++i) {
      const c = await connect(small.url);
      c.sock.write('POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{');
      slow.push(c);
    }
    await sleep(300);  // each waits on its body now (no event says so)
    const health = await connect(small.url);
    health.sock.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    const r = await firstResponse(health, 2000, '/health with 8 of 8 connections trickling bodies');
    assert.equal(r.status, 200);
    await until(() => slow.some((c) => c.closed), 2000, 'a slow body closed to make room');
    const evicted = responses(slow.find((c) => c.closed).data)[0];
    assert.equal(evicted?.status, 503);
    assert.equal(evicted.json.error.code, 'connection_evicted');
  } finally {
    slow.forEach((c) => c.sock.destroy());
    await small.stop();
    removeHome(smallHome);
  }
});

test('stopping the server cancels the jobs it waits on and tells their clients so', { timeout: 30000 }, async () => {
  const stopHome = makeHome();
  execFileSync(BINARY, ['queue', 'pause'], { env: { ...process.env, ATELIER_HOME: stopHome }, stdio: 'ignore' });
  const stopping = await startServer(stopHome);
  const c = await connect(stopping.url);
  try {
    c.sock.write(completion('stopped'));
    const list = async () => (await (await fetch(stopping.url + '/v1/jobs')).json()).data;
    await until(async () => (await list()).some((j) => j.state === 'queued'), 5000, 'the queued job');
    const exited = new Promise((r) => stopping.child.once('exit', r));
    stopping.child.kill('SIGTERM');
    const r = await firstResponse(c, 5000, 'the answer of a request the server stopped under');
    assert.equal(r.status, 503, r.body);
    assert.equal(r.json.error.code, 'server_stopping');
    await exited;
  } finally {
    c.sock.destroy();
    if (stopping.child.exitCode === null) stopping.child.kill('SIGKILL');
    removeHome(stopHome);
  }
});

test('two clients on the same port of 127.0.0.1 and 127.0.0.2: closing one cancels only its job', { timeout: 30000 }, async () => {
  queue('pause');  // the jobs wait in the queue, so each client's request is in flight when it matters
  let a, b;
  try {
    a = await connect(server.url, { localAddress: '127.0.0.1' });
    b = await connect(server.url, { localAddress: '127.0.0.2', localPort: a.sock.localPort });
    assert.equal(a.sock.localPort, b.sock.localPort);
    a.sock.write(completion('from A'));
    b.sock.write(completion('from B'));
    const mine = async (who) => (await jobs()).find((j) => j.request.prompt === `from ${who}`);
    await until(async () => (await mine('A'))?.state === 'queued' && (await mine('B'))?.state === 'queued', 5000, 'two queued jobs');
    a.sock.destroy();
    await until(async () => (await mine('A')).state === 'cancelled', 5000, "A's job cancelled after A closed");
    queue('resume');
    const r = await firstResponse(b, 10000, "B's answer");
    assert.equal(r.status, 200, r.body);
    assert.equal(r.json.choices.length, 1);
    assert.equal((await mine('B')).state, 'completed');
  } finally {
    queue('resume');
    a?.sock.destroy();
    b?.sock.destroy();
  }
});

test('a client that half-closes after its request still gets its answer', { timeout: 30000 }, async () => {
  queue('pause');
  let c;
  try {
    c = await connect(server.url, { allowHalfOpen: true });
    c.sock.end(completion('half-closed'));  // the request, then FIN: nothing more to send, still reading
    const mine = async () => (await jobs()).find((j) => j.request.prompt === 'half-closed');
    await until(async () => (await mine())?.state === 'queued', 5000, 'the queued job');
    // A cancel would come within the server's 200 ms check of its client: no
    // event says it did not happen, so watch the job for three checks' time.
    for (const end = Date.now() + 700; Date.now() < end; await sleep(50)) assert.equal((await mine()).state, 'queued');
    queue('resume');
    const r = await firstResponse(c, 10000, 'the answer to a half-closed client');
    assert.equal(r.status, 200, r.body);
    assert.equal(r.json.choices.length, 1);
  } finally {
    queue('resume');
    c?.sock.destroy();
  }
});
