#!/usr/bin/env bash
# Builds the folder tests/cuda/device-check.sh runs on a GPU machine that has
# only the NVIDIA driver, the CUDA toolkit, cmake, ninja and g++ (Ubuntu
# 24.04): the op suite (test_kernels), atelier (what the check runs), the CUDA
# module, the ceilings program (ceilings.cu), stories260K and its golden
# text (fixtures/), and the host libraries such a machine lacks (ICU 72, xz-compressed;
# libjpeg.so.62; libwebp.so.7; GoogleTest's when shared). Must stay under
# 64 MiB (what a device run carries).
# Usage: tests/cuda/pack.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, build-cuda-pack)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$repo/build}"
out="${2:-$repo/build-cuda-pack}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -G Ninja -DATELIER_TESTS=ON -DATELIER_UI=OFF -DATELIER_CUDA=ON
fi
grep -q '^ATELIER_CUDA:BOOL=ON' "$build/CMakeCache.txt" || { echo "pack.sh: $build is not configured with -DATELIER_CUDA=ON" >&2; exit 1; }
cmake --build "$build" --target test_kernels atelier atelier_cuda atelier_cuda_ceilings -j2
rm -rf "$out" && mkdir -p "$out"
cp "$build/tests/test_kernels" "$build/app/atelier" "$build/app/libatelier_cuda.so" "$out/"
cp "$build/tests/atelier_cuda_ceilings" "$out/ceilings"
strip --strip-unneeded "$out/test_kernels" "$out/atelier" "$out/libatelier_cuda.so" "$out/ceilings"
# The parity run's model and golden text (1.2 MB): stories260K and the CPU's
# greedy text for "Once upon a time" (tests/cli/cli_test.cpp, Cli.GreedyGoldenFromGguf).
fixtures=$(awk -F= '/^ATELIER_FIXTURES_DIR:/ { print $2 }' "$build/CMakeCache.txt")
[ -n "$fixtures" ] || fixtures="$repo/../shared/fixtures"
mkdir -p "$out/fixtures"
cp "$fixtures/text/stories260K.gguf" "$fixtures/text/golden-once-upon-a-time-greedy.txt" "$out/fixtures/"
# The host libraries Ubuntu 24.04 lacks, resolved as this machine's loader does.
lib_of() { ldd "$build/app/atelier" "$build/tests/test_kernels" | awk -v n="$1" '$1 == n { print $3; exit }'; }
for name in libicuuc.so.72 libicudata.so.72 libjpeg.so.62 libwebp.so.7; do
  path=$(lib_of "$name")
  [ -n "$path" ] || { echo "pack.sh: $name is not linked here" >&2; continue; }
  cp -L "$path" "$out/$name"
done
for gt in $(ldd "$build/tests/test_kernels" | awk '$1 ~ /^libg(test|mock)/ { print $3 }'); do cp -L "$gt" "$out/"; done
xz -9 -T2 "$out/libicudata.so.72" "$out/libicuuc.so.72"
cp "$repo/tests/cuda/device-check.sh" "$out/"
( cd "$out" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum > SHA256SUMS )
bytes=$(du -sb "$out" | cut -f1)
echo "pack.sh: $out, $((bytes / 1048576)) MiB:"
ls -la "$out"
[ "$bytes" -lt $((64 << 20)) ] || { echo "pack.sh: over 64 MiB" >&2; exit 1; }
