#!/usr/bin/env python3
"""Writes the small seed corpora in corpus/ (run once; the files are committed).

Every seed is built here by hand, from the formats' specifications, so the
fuzzers start from valid inputs of each kind without copying the fixtures.
"""
import io, json, os, pickle, struct, sys, types, zipfile, zlib, collections

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# GGUF v3: header, metadata (string, u32, f32, bool, string array), one F32 tensor, 32-byte aligned data.
def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b

def gguf(kv, tensors):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, (t, v) in kv.items():
        out += gguf_str(key) + struct.pack("<I", t)
        if t == 8: out += gguf_str(v)
        elif t == 4: out += struct.pack("<I", v)
        elif t == 6: out += struct.pack("<f", v)
        elif t == 7: out += struct.pack("<B", v)
        elif t == 9: out += struct.pack("<IQ", 8, len(v)) + b"".join(gguf_str(x) for x in v)
    data, offset = b"", 0
    for name, dims in tensors:
        out += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", 0, offset)
        n = 1
        for d in dims: n *= d
        data += struct.pack("<%df" % n, *[0.5] * n)
        offset += 4 * n
    out += b"\0" * ((32 - len(out) % 32) % 32)
    return out + data

put("gguf", "tiny-llama.gguf", gguf({"general.architecture": (8, "llama"), "llama.context_length": (4, 64),
                                     "llama.rope.freq_base": (6, 10000.0), "tokenizer.ggml.add_bos_token": (7, 1),
                                     "tokenizer.ggml.tokens": (9, ["<unk>", "<s>", "</s>", "a", "b"])},
                                    [("token_embd.weight", [4, 5])]))
put("gguf", "empty.gguf", gguf({}, []))

# safetensors: 8-byte little-endian header length, JSON header, data.
def safetensors(tensors, meta=None):
    header, data = {}, b""
    for name, shape in tensors:
        n = 1
        for d in shape: n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + 4 * n]}
        data += struct.pack("<%df" % n, *[0.25] * n)
    if meta: header["__metadata__"] = meta
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data

put("safetensors", "two.safetensors", safetensors([("a.weight", [2, 3]), ("b.bias", [3])], {"format": "pt"}))
put("safetensors", "empty.safetensors", safetensors([]))

# A torch.save zip: archive/data.pkl (protocol 2, persistent ids for storages) + archive/data/0.
torch = types.ModuleType("torch"); utils = types.ModuleType("torch._utils")
sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
def _rebuild_tensor_v2(*a): pass
_rebuild_tensor_v2.__module__ = "torch._utils"; utils._rebuild_tensor_v2 = _rebuild_tensor_v2
class FloatStorage: pass
FloatStorage.__module__ = "torch"; torch.FloatStorage = FloatStorage
class Storage:
    def __init__(self, key, n): self.key, self.n = key, n
class Tensor:
    def __init__(self, storage, shape): self.storage, self.shape = storage, shape
    def __reduce__(self):
        stride = tuple(int(x) for x in [self.shape[1], 1][:len(self.shape)]) if len(self.shape) == 2 else (1,)
        return (_rebuild_tensor_v2, (self.storage, 0, self.shape, stride, False, collections.OrderedDict()))
class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage): return ("storage", FloatStorage, obj.key, "cpu", obj.n)
        return None
buf = io.BytesIO()
TorchPickler(buf, protocol=2).dump({"state_dict": collections.OrderedDict(
    [("model.w", Tensor(Storage("0", 6), (2, 3))), ("model.b", Tensor(Storage("0", 6), (3,)))])})
pkl = buf.getvalue()
put("pickle", "state_dict.pkl", pkl)
put("pickle", "plain.pkl", pickle.dumps({"a": [1, 2.5, "x", None, True]}, protocol=2))
zbuf = io.BytesIO()
with zipfile.ZipFile(zbuf, "w", zipfile.ZIP_STORED) as z:
    z.writestr("archive/data.pkl", pkl)
    z.writestr("archive/data/0", struct.pack("<6f", *[0.1] * 6))
    z.writestr("archive/version", "3\n")
put("torch_checkpoint", "tiny.ckpt", zbuf.getvalue())
put("zip", "tiny.ckpt", zbuf.getvalue())
ebuf = io.BytesIO()
with zipfile.ZipFile(ebuf, "w", zipfile.ZIP_STORED) as z: z.writestr("a.txt", "hello")
put("zip", "one-entry.zip", ebuf.getvalue())

# Tokenizer inputs: ASCII, UTF-8 of several scripts, an emoji, control bytes, invalid UTF-8.
for i, s in enumerate(["Once upon a time", "Hello, world! 123 4567", "naïve café — 日本語 Привет 🙂",
                       "<|endoftext|><s></s>  \t\n\n  spaces", "(masterpiece:1.2), [blurry], BREAK cat"]):
    put("tokenizer", "text-%d.txt" % i, s)
put("tokenizer", "invalid-utf8.bin", b"ab\xff\xfe\xc3(\xe2\x82\xf0\x9f\x98")

# Chat templates: ChatML, Llama 3 and a macro/loop/filter mix.
put("chat_template", "chatml.jinja", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
put("chat_template", "llama3.jinja", "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
put("chat_template", "mix.jinja", "{% macro f(x, y=2) %}{{ x * y }}{% endmacro %}{% set ns = namespace(n=0) %}"
    "{% for m in messages if m.role != 'system' %}{% set ns.n = ns.n + 1 %}{{ loop.index }}:{{ m.content | upper }}"
    "{% if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif %}{% endfor %}{{ f(ns.n) }}"
    "{{ messages | map(attribute='role') | join(',') }}{{ raise_exception('x') if ns.n > 5 }}")

# Request JSON: batch lines of both kinds.
put("request_json", "text.json", json.dumps({"model": "stories260k", "prompt": "Once", "max_new_tokens": 8, "stop": ["\n"],
                                             "priority": 2, "sampling": {"temperature": 0.8, "top_k": 40, "seed": 7}}))
put("request_json", "image.json", json.dumps({"kind": "image", "model": "sd15", "prompt": "a cat", "negative_prompt": "blurry",
                                              "width": 512, "height": 512, "steps": 20, "cfg_scale": 7.5, "seed": 3,
                                              "sampler": "euler_a", "output": "cat.png"}))
put("request_json", "numbers.json", '{"model": "m", "prompt": "x", "priority": 1e400, "max_new_tokens": -1e400}')
# Nested past the limit (atelier/json_input.h, kMaxJsonDepth 64): a field 2,000 deep, refused while parsing.
put("request_json", "deep_field.json", '{"model": "m", "prompt": "x", "stop": ' + "[" * 2000 + "]" * 2000 + "}")

# JSON nesting (json_depth): a schema near the schema limit, one nested past the JSON limit
# (a 200-level copy of the 8,000-level schema that crashed `serve`), deep enum values, and a
# text request whose json_schema string nests deep.
def items_schema(depth):
    return '{"type":"array","items":' * depth + '{"type":"string"}' + "}" * depth
put("json_depth", "schema_items_30.json", items_schema(30))
put("json_depth", "schema_properties_deep.json", '{"properties":{"a":' * 200 + "{}" + "}}" * 200)
put("json_depth", "schema_object.json", json.dumps({"type": "object", "properties": {"name": {"type": "string"},
    "tags": {"type": "array", "items": {"enum": ["a", [1, [2, [3]]], {"k": None}]}}}, "required": ["name"]}))
put("json_depth", "arrays_65.json", "[" * 65 + "]" * 65)
put("json_depth", "request_deep_schema.json", json.dumps({"model": "m", "prompt": "x", "json_schema": items_schema(100)}))

# PNG: IHDR, tEXt (A1111 parameters), iTXt, zTXt, IDAT, IEND.
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
png += chunk(b"tEXt", b"parameters\0a cat\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 3, Size: 2x2")
png += chunk(b"iTXt", b"atelier\0\0\0\0\0" + json.dumps({"seed": 3}).encode())
png += chunk(b"zTXt", b"comment\0\0" + zlib.compress(b"compressed"))
png += chunk(b"IDAT", zlib.compress(b"\0" + b"\x80" * 6 + b"\0" + b"\x40" * 6)) + chunk(b"IEND", b"")
put("png_info", "params.png", png)
