// AUTOMATIC1111's /sdapi/v1 contract, replaying the request bodies that
// SillyTavern, Open WebUI and the webuiapi scripts send, on narrow synthetic
// SD 1.5 checkpoints (64x64, 2 steps). The PNG is read by a parser here, not
// by the server's, and its "parameters" chunk checked against the request.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { inflateSync } from 'node:zlib';
import { join } from 'node:path';
import { BINARY, FIXTURES, makeHome, startServer, removeHome } from './server_util.mjs';

let home, server;

function atelier(args) {
  return execFileSync(BINARY, args, { env: { ...process.env, ATELIER_HOME: home }, stdio: ['ignore', 'pipe', 'inherit'] }).toString();
}

before(async () => {
  home = makeHome();
  for (const [name, seed] of [['tinysd', 1], ['tinysd-b', 2]]) {
    const file = join(home, `${name}.safetensors`);
    atelier(['models', 'synth', '--arch', 'sd15', '--width-mult', '0.1', '--type', 'f32', '--seed', String(seed), '-o', file]);
    atelier(['models', 'import', file, join(FIXTURES, 'clip/bpe_simple_vocab_16e6.txt.gz'), '--name', name,
             '--role', 'model', '--role', 'tokenizer', '--kind', 'image']);
  }
  server = await startServer(home);
});

after(async () => {
  await server?.stop();
  removeHome(home);
});

const post = async (path, body) => {
  const r = await fetch(server.url + path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
};
const get = async (path) => (await fetch(server.url + path)).json();

// PNG chunks by the book: signature, then length, type, data, CRC.
function pngChunks(buf) {
  assert.deepEqual([...buf.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  const chunks = [];
  for (let at = 8; at < buf.length;) {
    const len = buf.readUInt32BE(at);
    chunks.push({ type: buf.toString('latin1', at + 4, at + 8), data: buf.subarray(at + 8, at + 8 + len) });
    at += 12 + len;
  }
  return chunks;
}
function pngInfo(b64) {
  const chunks = pngChunks(Buffer.from(b64, 'base64'));
  const ihdr = chunks.find((c) => c.type === 'IHDR').data;
  const texts = {};
  for (const c of chunks.filter((c) => c.type === 'tEXt')) {
    const nul = c.data.indexOf(0);
    texts[c.data.toString('latin1', 0, nul)] = c.data.toString('latin1', nul + 1);
  }
  const pixels = inflateSync(Buffer.concat(chunks.filter((c) => c.type === 'IDAT').map((c) => c.data)));
  return { width: ihdr.readUInt32BE(0), height: ihdr.readUInt32BE(4), texts, pixels };
}

// What SillyTavern's stable-diffusion extension posts to txt2img (its "auto" source).
const sillyTavernBody = (seed) => ({
  prompt: 'a lighthouse at dusk, (masterpiece:1.2)', negative_prompt: 'lowres, blurry', sampler_name: 'Euler a',
  scheduler: 'Automatic', steps: 2, cfg_scale: 7, width: 64, height: 64, restore_faces: false, enable_hr: false,
  hr_upscaler: 'Latent', hr_scale: 2, hr_additional_modules: [], denoising_strength: 0.7, hr_second_pass_steps: 0,
  seed, n_iter: 1, batch_size: 1, override_settings: { CLIP_stop_at_last_layers: 1 }, override_settings_restore_afterwards: true,
  clip_skip: 1, save_images: true, send_images: true, do_not_save_grid: false, do_not_save_samples: false, alwayson_scripts: {},
});

test('SillyTavern: txt2img gives a PNG whose parameters chunk is the request, and A1111\'s info keys', async () => {
  const models = await get('/sdapi/v1/sd-models');
  const tiny = models.find((m) => m.model_name === 'tinysd');
  assert.ok(tiny && /^[0-9a-f]{10}$/.test(tiny.hash) && tiny.sha256.startsWith(tiny.hash) && tiny.title.includes(tiny.hash));
  const { status, body } = await post('/sdapi/v1/txt2img', { ...sillyTavernBody(1234),
                                                            override_settings: { sd_model_checkpoint: tiny.title } });
  assert.equal(status, 200);
  assert.equal(body.images.length, 1);
  const png = pngInfo(body.images[0]);
  assert.deepEqual([png.width, png.height], [64, 64]);
  const p = png.texts.parameters;
  assert.ok(p.startsWith('a lighthouse at dusk, (masterpiece:1.2)\nNegative prompt: lowres, blurry\n'), p);
  for (const part of ['Steps: 2', 'Sampler: Euler a', 'CFG scale: 7', 'Seed: 1234', 'Size: 64x64', `Model hash: ${tiny.hash}`])
    assert.ok(p.includes(part), `${part} in ${p}`);
  const info = JSON.parse(body.info);
  for (const key of ['prompt', 'all_prompts', 'negative_prompt', 'seed', 'all_seeds', 'sampler_name', 'cfg_scale', 'steps',
                     'width', 'height', 'sd_model_name', 'sd_model_hash', 'infotexts', 'job_timestamp'])
    assert.ok(key in info, key);
  assert.equal(info.seed, 1234);
  assert.equal(info.sd_model_hash, tiny.hash);
  assert.deepEqual(info.infotexts, [p]);
  assert.equal(body.parameters.prompt, 'a lighthouse at dusk, (masterpiece:1.2)');
});

test('the same seed gives the same image; batch_size x n_iter images with consecutive seeds', async () => {
  const a = await post('/sdapi/v1/txt2img', sillyTavernBody(77));
  const b = await post('/sdapi/v1/txt2img', sillyTavernBody(77));
  assert.equal(a.body.images[0], b.body.images[0]);
  const batch = await post('/sdapi/v1/txt2img', { ...sillyTavernBody(77), batch_size: 2, n_iter: 2 });
  assert.equal(batch.body.images.length, 4);
  const info = JSON.parse(batch.body.info);
  assert.deepEqual(info.all_seeds, [77, 78, 79, 80]);
  assert.equal(new Set(batch.body.images).size, 4);
  // Image 0 of the batch is the seed-77 image alone (the pixels; the PNGs' request chunks differ).
  assert.ok(pngInfo(batch.body.images[0]).pixels.equals(pngInfo(a.body.images[0]).pixels));
  info.infotexts.forEach((t, i) => assert.ok(t.includes(`Seed: ${77 + i}`), t));
});

test('webuiapi: txt2img with every field it sends, and img2img with a data-URL init image and mask', async () => {
  const t2i = {
    enable_hr: false, denoising_strength: 0.7, firstphase_width: 0, firstphase_height: 0, hr_scale: 2, hr_upscaler: 'Latent',
    hr_second_pass_steps: 0, hr_resize_x: 0, hr_resize_y: 0, prompt: 'a red fox', styles: [], seed: 5, subseed: -1,
    subseed_strength: 0, seed_resize_from_h: 0, seed_resize_from_w: 0, sampler_name: 'DPM++ 2M', scheduler: 'Karras',
    batch_size: 1, n_iter: 1, steps: 2, cfg_scale: 5.5, width: 64, height: 64, restore_faces: false, tiling: false,
    do_not_save_samples: false, do_not_save_grid: false, negative_prompt: '', eta: 1.0, s_min_uncond: 0, s_churn: 0,
    s_tmax: 0, s_tmin: 0, s_noise: 1, override_settings: {}, override_settings_restore_afterwards: true, script_args: [],
    sampler_index: 'Euler a', script_name: null, send_images: true, save_images: false, alwayson_scripts: {},
  };
  const r = await post('/sdapi/v1/txt2img', t2i);
  assert.equal(r.status, 200);
  const p = pngInfo(r.body.images[0]).texts.parameters;
  for (const part of ['Sampler: DPM++ 2M', 'Schedule type: Karras', 'CFG scale: 5.5', 'Seed: 5']) assert.ok(p.includes(part), p);

  const mask = Buffer.from(r.body.images[0], 'base64');  // any picture works as a mask; white repaints
  const i2i = await post('/sdapi/v1/img2img', {
    init_images: ['data:image/png;base64,' + r.body.images[0]], resize_mode: 0, denoising_strength: 0.5, image_cfg_scale: 0,
    mask: mask.toString('base64'), mask_blur: 4, inpainting_fill: 1, inpaint_full_res: true, inpaint_full_res_padding: 0,
    inpainting_mask_invert: 0, initial_noise_multiplier: 1, prompt: 'a red fox', seed: 6, sampler_name: 'Euler', steps: 2,
    cfg_scale: 7, width: 64, height: 64, include_init_images: false, send_images: true, save_images: false,
  });
  assert.equal(i2i.status, 200, JSON.stringify(i2i.body));
  const info = JSON.parse(i2i.body.info);
  assert.equal(info.denoising_strength, 0.5);
  const png = pngInfo(i2i.body.images[0]);
  assert.deepEqual([png.width, png.height], [64, 64]);
  assert.ok(png.texts.parameters.includes('Denoising strength: 0.5'), png.texts.parameters);
  assert.equal(i2i.body.parameters.init_images, null);
});

test('Open WebUI: the whole options dict posted back switches the model for later requests; override_settings wins', async () => {
  const models = await get('/sdapi/v1/sd-models');
  const [a, b] = ['tinysd', 'tinysd-b'].map((n) => models.find((m) => m.model_name === n));
  const options = await get('/sdapi/v1/options');
  assert.ok('sd_model_checkpoint' in options);
  const set = await post('/sdapi/v1/options', { ...options, sd_model_checkpoint: b.title });
  assert.equal(set.status, 200);
  assert.equal((await get('/sdapi/v1/options')).sd_model_checkpoint, b.title);
  // Open WebUI's txt2img body.
  const later = await post('/sdapi/v1/txt2img', { prompt: 'a boat', batch_size: 1, width: 64, height: 64, steps: 2 });
  assert.equal(JSON.parse(later.body.info).sd_model_hash, b.hash);
  const own = await post('/sdapi/v1/txt2img', { prompt: 'a boat', width: 64, height: 64, steps: 2,
                                               override_settings: { sd_model_checkpoint: a.model_name } });
  assert.equal(JSON.parse(own.body.info).sd_model_hash, a.hash);
  const missing = await post('/sdapi/v1/options', { sd_model_checkpoint: 'no-such-model' });
  assert.equal(missing.status, 404);
  await post('/sdapi/v1/options', { sd_model_checkpoint: a.title });
});

test('lists: samplers, schedulers, sd-vae, upscalers', async () => {
  const samplers = (await get('/sdapi/v1/samplers')).map((s) => s.name);
  for (const s of ['Euler a', 'Euler', 'Heun', 'DPM++ 2M', 'DDIM', 'LCM']) assert.ok(samplers.includes(s), s);
  assert.ok((await get('/sdapi/v1/schedulers')).some((s) => s.label === 'Karras'));
  assert.deepEqual(await get('/sdapi/v1/sd-vae'), []);
  assert.ok((await get('/sdapi/v1/upscalers')).some((u) => u.name === 'None'));
});

test('progress while a job renders (step of steps, a preview), interrupt stops it and the queue shows it cancelled', async () => {
  const idle = await get('/sdapi/v1/progress');
  assert.equal(idle.state.job_count, 0);
  assert.equal(idle.progress, 0);
  const running = post('/sdapi/v1/txt2img', { ...sillyTavernBody(9), steps: 400 });
  let seen = null;
  for (let i = 0; i < 600 && !seen; ++i) {
    const p = await get('/sdapi/v1/progress');
    if (p.state.sampling_step > 0) seen = p;
    else await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(seen, 'progress reported a step');
  assert.equal(seen.state.sampling_steps, 400);
  assert.ok(seen.state.job_count >= 1);
  assert.ok(seen.progress > 0 && seen.progress < 1);
  assert.ok(pngInfo(seen.current_image).width > 0);
  assert.equal((await post('/sdapi/v1/interrupt', {})).status, 200);
  const r = await running;
  assert.equal(r.status, 200);
  assert.equal(JSON.parse(r.body.info).interrupted, true);
  const jobs = (await get('/v1/jobs?limit=1')).data;
  assert.equal(jobs[0].state, 'cancelled');
  assert.equal((await get('/sdapi/v1/progress')).state.job_count, 0);
});

test('bad values get 400 naming the field', async () => {
  for (const [body, field] of [[{ prompt: 'x', width: 65, height: 64, steps: 2 }, 'width'],
                               [{ prompt: 'x', steps: 'many' }, 'steps'],
                               [{ prompt: 'x', scheduler: 'Polyexponential', steps: 2, width: 64, height: 64 }, 'scheduler'],
                               [{ prompt: 'x', width: 4096, height: 4096, steps: 2 }, 'width']]) {
    const r = await post('/sdapi/v1/txt2img', body);
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.equal(r.body.error.param, field);
  }
  assert.equal((await post('/sdapi/v1/img2img', { prompt: 'x', init_images: ['!!notbase64!!'], steps: 2, width: 64, height: 64 })).status, 400);
});

test('img2img: a picture or mask that is not one is a 400 naming the field, not a 500', async () => {
  const good = (await post('/sdapi/v1/txt2img', { prompt: 'x', steps: 1, width: 64, height: 64 })).body.images[0];
  const notPicture = Buffer.from('this is no picture at all').toString('base64');
  for (const [body, field] of [[{ init_images: [notPicture] }, 'init_images'], [{ init_images: [good], mask: notPicture }, 'mask']]) {
    const r = await post('/sdapi/v1/img2img', { prompt: 'x', steps: 2, width: 64, height: 64, ...body });
    assert.equal(r.status, 400, JSON.stringify(r.body));
    assert.equal(r.body.error.param, field);
    assert.match(r.body.error.message, /cannot read the image/);
    assert.ok(!r.body.error.message.includes('/tmp/'), r.body.error.message);
  }
});

test('sd_model_checkpoint "/etc/passwd" is refused and images keep working for everyone', async () => {
  const before = await get('/sdapi/v1/options');
  const r = await post('/sdapi/v1/options', { sd_model_checkpoint: '/etc/passwd' });
  assert.equal(r.status, 403, JSON.stringify(r.body));
  assert.equal(r.body.error.param, 'sd_model_checkpoint');
  assert.deepEqual(await get('/sdapi/v1/options'), before);
  assert.equal((await post('/sdapi/v1/txt2img', { prompt: 'x', steps: 1, width: 64, height: 64 })).status, 200);
});
