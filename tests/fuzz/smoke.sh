#!/usr/bin/env bash
# CI's fuzz smoke run: every libFuzzer target in BUILD_DIR/tests/fuzz for
# SECONDS each, from its seed corpus (copied to a scratch folder, so that new
# inputs never land in the repository), two targets at a time (each runs on
# one core). Prints each target's executions and coverage; a crash, leak or
# sanitizer report fails the run and keeps the reproducer as
# BUILD_DIR/fuzz-artifacts/crash-*.
set -euo pipefail
build=${1:?usage: smoke.sh BUILD_DIR [SECONDS]}
seconds=${2:-20}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$build/fuzz-artifacts"
targets=(gguf safetensors zip pickle torch_checkpoint tokenizer chat_template request_json json_depth png_info http)

one() {
  local target=$1 bin="$build/tests/fuzz/fuzz_$1"
  mkdir -p "$work/$target"
  cp "$here/corpus/$target/"* "$work/$target/"
  # -rss_limit_mb: a reader that allocates what a header claims, unchecked, is a finding too.
  if "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$build/fuzz-artifacts/" "$work/$target" >"$work/$target.log" 2>&1; then
    echo ok >"$work/$target.status"
  else
    echo failed >"$work/$target.status"
  fi
}

for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n || true; done
  one "$target" &
done
wait

status=0
for target in "${targets[@]}"; do
  log="$work/$target.log"
  if [ "$(cat "$work/$target.status" 2>/dev/null)" != ok ]; then
    echo "fuzz_$target: FAILED (see below)"
    tail -40 "$log"
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo 0)
  echo "fuzz_$target: $runs executions in ${seconds} s, coverage $cov edges, corpus $(ls "$work/$target" | wc -l) inputs"
done
exit $status
