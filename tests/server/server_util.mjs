// Starts `atelier serve` on a free loopback port with its own ATELIER_HOME
// (the fixture model imported into a fresh store) and stops it afterwards.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const BINARY = process.env.ATELIER_BINARY;
export const FIXTURES = process.env.ATELIER_FIXTURES_DIR;
// JSON routes take JSON only (415 otherwise); fetch labels a string body text/plain.
export const JSON_TYPE = { 'Content-Type': 'application/json' };
if (!BINARY || !FIXTURES) throw new Error('set ATELIER_BINARY and ATELIER_FIXTURES_DIR (ctest does)');

export function makeHome() {
  const home = mkdtempSync(join(tmpdir(), 'atelier-serve-test-'));
  execFileSync(BINARY, ['models', 'import', join(FIXTURES, 'text/stories260K.gguf'), '--name', 'stories260k'],
               { env: { ...process.env, ATELIER_HOME: home }, stdio: ['ignore', 'ignore', 'inherit'] });
  return home;
}

// Resolves once the server printed its address and /health says 200.
export async function startServer(home, args = []) {
  const child = spawn(BINARY, ['serve', '--port', '0', '--threads', '1', ...args],
                      { env: { ...process.env, ATELIER_HOME: home }, stdio: ['ignore', 'pipe', 'inherit'] });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)/);
      if (m) resolve(m[1]);
    });
    child.on('exit', (code) => reject(new Error(`atelier serve exited with ${code}: ${out}`)));
  });
  for (let i = 0; i < 300; ++i) {
    const r = await fetch(url + '/health').catch(() => null);
    if (r && r.status === 200) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url,
    child,
    async stop() {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

export function removeHome(home) { rmSync(home, { recursive: true, force: true }); }
