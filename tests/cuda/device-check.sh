#!/usr/bin/env bash
# The CUDA device check (issue 33): on a machine with an NVIDIA GPU, the
# driver and the CUDA 13 toolkit and nothing of Atelier's build, runs the
# CUDA op suite from a folder tests/cuda/pack.sh made, then (hooks below) the
# host side's parity and benchmark runs, and prints one report. At most
# 8 minutes: every step has its own time limit.
# Usage: tests/cuda/device-check.sh PACK_DIR [REPORT_FILE]
set -uo pipefail
pack="$(cd "${1:?usage: device-check.sh PACK_DIR [REPORT_FILE]}" && pwd)"
report="${2:-}"
t0=$SECONDS
work="$(mktemp -d /tmp/atelier-device-check.XXXXXX)"
trap 'rm -rf "$work"' EXIT
lines=()
say() { lines+=("$*"); echo "-- $*" >&2; }
step() {  # step NAME SECONDS COMMAND...: runs it, its output in $work/NAME.log
  local name=$1 limit=$2 s=$SECONDS rc
  shift 2
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  rc=$?
  say "$name: $([ $rc -eq 0 ] && echo PASS || { [ $rc -eq 124 ] && echo "TIMEOUT after ${limit} s" || echo "FAIL (exit $rc)"; }) in $((SECONDS - s)) s"
  return $rc
}

# Libraries: the folder's own (ICU unpacked), then the toolkit's cuBLASLt.
libs="$work/lib"
mkdir -p "$libs"
for f in "$pack"/*.so.*; do
  case "$f" in
    *.xz) xz -dc "$f" > "$libs/$(basename "$f" .xz)" ;;
    *) ln -s "$f" "$libs/" ;;
  esac
done
export LD_LIBRARY_PATH="$libs:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
export ATELIER_CUDA_MODULE="$pack/libatelier_cuda.so"

say "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || echo 'nvidia-smi missing')"
say "toolkit: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1 || echo 'no nvcc')"
missing=$(ldd "$pack/test_kernels" "$pack/libatelier_cuda.so" "$pack/atelier" 2>&1 | grep "not found" | sort -u)
[ -z "$missing" ] || say "missing libraries: $missing"

# 1. The module loads and opens the GPU (its description: name, capability, memory).
step loader 60 "$pack/test_kernels" --gtest_filter='Devices.*:CudaPolicy.*'
no_gpu=$(grep -h -m1 "no CUDA op cases" "$work/loader.log")
[ -z "$no_gpu" ] || say "FAIL: $no_gpu"

# 2. The op suite on CUDA: every text op against the CPU references, then the
#    GPU-sized shapes (K 4096 / 14336 / 4352, rows 1..257, head_dim 64/80/128,
#    contexts to 4096). Image ops are skipped (issue 34).
step ops 240 "$pack/test_kernels" --gtest_filter='*/BackendOps.*/cuda:Cuda/CudaShapes.*' --gtest_brief=1
while read -r l; do say "  $l"; done < <(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$work/ops.log" | head -40)
grep -B3 -A12 "Failure" "$work/ops.log" | head -80 > "$work/ops-failures.txt"

# 3. The same with ATELIER_CUDA_DETERMINISTIC=1: every product on the
#    matrix-vector kernels, so the suite's batch-invariance checks run too.
step ops-deterministic 150 env ATELIER_CUDA_DETERMINISTIC=1 "$pack/test_kernels" \
  --gtest_filter='*/BackendOps.*/cuda' --gtest_brief=1
while read -r l; do say "  $l"; done < <(grep -E "^\[  (PASSED|FAILED) " "$work/ops-deterministic.log" | head -10)

# ==== HOOK (host side of issue 33): whole-model parity on the GPU ==========
# `atelier text --device cuda` against `--device cpu` (stories260K golden
# text in F32/BF16; the 110M synthetic model's KL / top-1 agreement) goes
# here, as: step parity 90 "$pack/atelier" text --device cuda ...
# ==== HOOK (host side of issue 33): benchmarks =============================
# `atelier bench text --device cuda --synth 8B --type bf16|q4_k_m|q8_0` and
# `bench serve --device cuda` lines go here, each beside the ceilings the
# same run measures, as: step bench-bf16 120 "$pack/atelier" bench ...
# ===========================================================================

summary() {
  echo "== Atelier CUDA device check ($(date -u +%FT%TZ), $((SECONDS - t0)) s)"
  printf '%s\n' "${lines[@]}"
  if [ -s "$work/ops-failures.txt" ]; then
    echo "== first failures"
    cat "$work/ops-failures.txt"
  fi
}
if [ -n "$report" ]; then summary | tee "$report"; else summary; fi
! grep -qE "FAIL|TIMEOUT" <(printf '%s\n' "${lines[@]}")
