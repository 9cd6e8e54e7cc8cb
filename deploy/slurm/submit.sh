#!/bin/bash
# Submits a batch file as an N-task array and the merge after it:
#   deploy/slurm/submit.sh BATCH.jsonl RESULTS_DIR N [sbatch options...]
# Run it again after a failure: finished lines are not run twice.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BATCH.jsonl RESULTS_DIR N [sbatch options...]" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
file=$(realpath "$1") results=$(realpath -m "$2") n=$3
shift 3
mkdir -p "$results"
array=$(sbatch --parsable --array="0-$((n - 1))" "$@" "$here/atelier-batch.sbatch" "$file" "$results")
merge=$(sbatch --parsable --dependency="afterany:$array" "$@" "$here/atelier-merge.sbatch" "$file" "$results" "$n")
echo "array job $array ($n tasks), merge job $merge: $results/merged/results.jsonl"
