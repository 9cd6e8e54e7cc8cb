#!/bin/sh
# Regenerates the golden logits of the mixture-of-experts architectures with
# llama.cpp (an independent implementation). Needs a llama.cpp source tree and
# build (LLAMA_SRC, LLAMA_BUILD: default /work/peers/llama.cpp-{src,build})
# and Atelier's `atelier` (ATELIER: default build/app/atelier). Run from the
# repository root: sh tests/text/moe_goldens/make_goldens.sh
set -eu
LLAMA_SRC=${LLAMA_SRC:-/work/peers/llama.cpp-src}
LLAMA_BUILD=${LLAMA_BUILD:-/work/peers/llama.cpp-build}
ATELIER=${ATELIER:-build/app/atelier}
HERE=tests/text/moe_goldens
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
c++ -O2 -std=c++17 -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" "$HERE/dump_logits.cpp" \
  -L"$LLAMA_BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$LLAMA_BUILD/bin" -o "$TMP/dump_logits"
# The token sequence (also in moe_golden_test.cpp): 12 ids of the synthetic
# vocabulary, longer than gpt-oss tiny's sliding window of 4.
TOKENS=1,300,301,320,17,400,88,299,450,51,333,302
for arch in mixtral qwen3moe gpt-oss; do
  "$ATELIER" models synth --arch "$arch" --params tiny --type f32 --seed 7 -o "$TMP/$arch.gguf"
  "$TMP/dump_logits" "$TMP/$arch.gguf" "$TOKENS" > "$HERE/$arch-tiny.logits" 2> "$TMP/$arch.log"
  echo "$arch: $(wc -l < "$HERE/$arch-tiny.logits") logits"
done
echo "llama.cpp $(cat "$LLAMA_BUILD/COMMIT" 2>/dev/null || echo '(commit unknown)')"
