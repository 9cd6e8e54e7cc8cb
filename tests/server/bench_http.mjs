// Benchmark (not a test): N concurrent streaming clients (the openai SDK)
// against `atelier serve`, each asking -n new tokens (end of sequence
// ignored) for a prompt of random words; the figures beside `atelier bench
// serve` (the same engine without HTTP) at the same concurrency, run here in
// the same session, so the server's overhead is a ratio.
//   node tests/server/bench_http.mjs MODEL.gguf [--concurrency 1,8,16,32] [-n 64] [--words 24]
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';

const args = process.argv.slice(2);
const opt = (name, dflt) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : dflt; };
const model = args[0];
const levels = opt('--concurrency', '1,8,16,32').split(',').map(Number);
const genTokens = Number(opt('-n', '64'));
const words = Number(opt('--words', '24'));
const binary = process.env.ATELIER_BINARY ?? 'build/app/atelier';

const vocab = ('time once upon little girl named lily she loved play outside park one day saw big red ball wanted ' +
               'it was too high boy dog cat tree sun happy sad friend mom said went home').split(' ');
let rng = 12345;
const rand = () => (rng = (rng * 1103515245 + 12345) % 2147483648) / 2147483648;
const prompt = () => Array.from({ length: words }, () => vocab[Math.floor(rand() * vocab.length)]).join(' ');
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : 0; };

const home = mkdtempSync(join(tmpdir(), 'atelier-bench-http-'));
const child = spawn(binary, ['serve', '--port', '0', '-m', model, '--max-connections', '80'],
                    { env: { ...process.env, ATELIER_HOME: home }, stdio: ['ignore', 'pipe', 'inherit'] });
const url = await new Promise((resolve) => {
  let out = '';
  child.stdout.on('data', (d) => { out += d; const m = out.match(/listening on (\S+)/); if (m) resolve(m[1]); });
});
for (;;) { const r = await fetch(url + '/health').catch(() => null); if (r?.status === 200) break; await new Promise((r) => setTimeout(r, 100)); }
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'bench', maxRetries: 0, timeout: 600000 });

async function one() {
  const t0 = performance.now();
  let last = 0, first = 0, tokens = 0;
  const gaps = [];
  const stream = await client.completions.create({ prompt: prompt(), max_tokens: genTokens, ignore_eos: true, temperature: 0.8,
                                                   stream: true });
  for await (const c of stream) {
    if (!c.choices.length || !c.choices[0].text) continue;
    const now = performance.now();
    if (!first) first = now - t0; else gaps.push(now - last);
    last = now;
    ++tokens;  // one chunk per token event (merged events count once: a lower bound)
  }
  return { ttft: first, gaps, tokens };
}

const results = [];
await Promise.all(Array.from({ length: 2 }, one));  // warm-up: the model loaded, pages touched
for (const n of levels) {
  const t0 = performance.now();
  const runs = await Promise.all(Array.from({ length: n }, one));
  const s = (performance.now() - t0) / 1000;
  results.push({ concurrency: n, requests_per_s: n / s, tokens_per_s: (n * genTokens) / s,
                 ttft_p50_ms: pct(runs.map((r) => r.ttft), 0.5), ttft_p99_ms: pct(runs.map((r) => r.ttft), 0.99),
                 itl_p50_ms: pct(runs.flatMap((r) => r.gaps), 0.5), itl_p99_ms: pct(runs.flatMap((r) => r.gaps), 0.99),
                 chunks_per_request: runs.reduce((a, r) => a + r.tokens, 0) / n });
}
child.kill('SIGTERM');
await new Promise((r) => child.once('exit', r));
rmSync(home, { recursive: true, force: true });

// The engine alone, same model, levels, tokens; one round each (a loaded machine: the medians of 3 rounds took too long).
const engine = JSON.parse(execFileSync(binary, ['bench', 'serve', '-m', model, '--concurrency', levels.join(','), '-n', String(genTokens),
                                                '-p', String(Math.round(words * 1.3) + 1), '--rounds', '1', '--json'],
                                       { stdio: ['ignore', 'pipe', 'inherit'] }).toString());
const byLevel = new Map((engine.levels ?? engine).map((l) => [l.concurrency, l]));
console.log('clients  http tok/s  req/s  TTFT p50/p99 ms  ITL p50/p99 ms | bench serve tok/s  TTFT p50  ITL p50 | http/engine');
for (const r of results) {
  const e = byLevel.get(r.concurrency) ?? {};
  const etps = e.tokens_per_s ?? NaN;
  console.log(`${String(r.concurrency).padStart(7)}  ${r.tokens_per_s.toFixed(1).padStart(10)}  ${r.requests_per_s.toFixed(2).padStart(5)}  ` +
              `${r.ttft_p50_ms.toFixed(0).padStart(6)}/${r.ttft_p99_ms.toFixed(0).padEnd(6)}  ${r.itl_p50_ms.toFixed(1).padStart(6)}/${r.itl_p99_ms.toFixed(1).padEnd(6)} | ` +
              `${etps.toFixed(1).padStart(17)}  ${(e.ttft_ms_p50 ?? NaN).toFixed(0).padStart(8)}  ${(e.itl_ms_p50 ?? NaN).toFixed(1).padStart(7)} | ${(r.tokens_per_s / etps).toFixed(2)}`);
}
console.log(JSON.stringify({ http: results, engine }, null, 0));
