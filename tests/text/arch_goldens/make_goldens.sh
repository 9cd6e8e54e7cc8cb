#!/usr/bin/env bash
# Regenerates the golden logits beside this script from llama.cpp (see
# README.md). Needs a llama.cpp checkout and build outside the repository:
#   LLAMA_SRC   (default /work/peers/llama.cpp-src)    its include/ and ggml/include/
#   LLAMA_BUILD (default /work/peers/llama.cpp-build)  its bin/libllama.so
#   ATELIER     (default build/app/atelier)            for `models synth`
# The tests themselves never run this: they read the stored *.txt files.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
LLAMA_SRC="${LLAMA_SRC:-/work/peers/llama.cpp-src}"
LLAMA_BUILD="${LLAMA_BUILD:-/work/peers/llama.cpp-build}"
ATELIER="${ATELIER:-$root/build/app/atelier}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

c++ -std=c++17 -O2 -o "$work/dump_logits" "$here/dump_logits.cpp" \
  -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" \
  -L"$LLAMA_BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$LLAMA_BUILD/bin"

commit="$(cat "$LLAMA_BUILD/COMMIT" 2>/dev/null || echo unknown)"
# The prompt: BOS, then 15 ids spread over the 512-token vocabulary (ids only,
# so the tokenizer plays no part). Kept in sync with arch_goldens_test.cpp.
tokens="1,300,17,450,99,260,311,5,402,77,128,489,260,33,211,370"
positions="4,9,15"
# name arch n_ctx: phi3's LongRoPE takes its short factors up to the original
# context (256 for 260K) and the long ones beyond (llama.cpp pads n_ctx to 256).
while read -r name arch n_ctx; do
  "$ATELIER" models synth --arch "$arch" --params 260K --type f32 --seed 7 -o "$work/$arch.gguf" 2>/dev/null
  "$work/dump_logits" "$work/$arch.gguf" "$n_ctx" "$work/$name.txt" "$positions" "$tokens"
  { echo "# llama.cpp $commit; atelier models synth --arch $arch --params 260K --type f32 --seed 7"; cat "$work/$name.txt"; } \
    > "$here/$name.txt"
  echo "wrote $here/$name.txt"
done <<'LIST'
qwen3 qwen3 256
gemma3 gemma3 256
phi3-short phi3 256
phi3-long phi3 512
LIST
