#!/usr/bin/env bash
# A real Slurm on this machine (issue 37): munged, slurmctld and slurmd from
# Debian's packages, one node with 2 CPUs, everything (key, sockets, state,
# config, ports) in a temporary folder; the daemons are stopped on every
# exit (trap). deploy/slurm/atelier-batch.sbatch runs a 40-line batch file
# as a 4-task array with the built `atelier`, models pulled per shard from
# the fixtures mirror; one task is cancelled (scancel) while it runs, with
# lines done and one still running; the array is submitted again and the
# merge job joins the shards. Checks: the merged results equal a single
# `atelier batch` run's line for line, and the cancelled shard ran each of
# its lines exactly once (one job per line in its queue, the lines done
# before the cancel kept their jobs).
# Usage: tests/slurm/slurm_test.sh [BUILD_DIR]   (root; default: build)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "${1:-$repo/build}" && pwd)"
fixtures="$(cd "$repo/../shared/fixtures" && pwd)"
atelier="$build/app/atelier"
t="$(mktemp -d /tmp/atelier-slurm-test.XXXXXX)"
chmod 755 "$t"
fail() { echo "slurm_test: FAIL: $*" >&2; for f in "$t"/log/*.log; do [ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }; done >&2; exit 1; }
pids=()
stop() {
  # Jobs still in this test's cluster first (their steps are slurmd's children), then the daemons by their ids.
  if [ ${#pids[@]} -gt 1 ]; then
    scancel --full --quiet "--partition=test" 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$t"
}
trap stop EXIT
mkdir -p "$t"/{log,state,spool,munge,results}
host=$(hostname -s)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# munge with its own key and socket (munged runs as root here: --force).
dd if=/dev/urandom of="$t/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$t/munge/munge.key"
chmod 700 "$t/munge"
munged --force --foreground --key-file="$t/munge/munge.key" --socket="$t/munge/munge.sock" \
  --pid-file="$t/munge/munged.pid" --log-file="$t/log/munged.log" --seed-file="$t/munge/seed" &
pids+=($!)
for _ in $(seq 100); do [ -S "$t/munge/munge.sock" ] && break; sleep 0.1; done
[ -S "$t/munge/munge.sock" ] || fail "munged did not start"

cat > "$t/slurm.conf" <<CONF
ClusterName=ateliertest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(port)
SlurmdPort=$(port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$t/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$t/state
SlurmdSpoolDir=$t/spool
SlurmctldPidFile=$t/slurmctld.pid
SlurmdPidFile=$t/slurmd.pid
SlurmctldLogFile=$t/log/slurmctld.log
SlurmdLogFile=$t/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
KillWait=10
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$t/slurm.conf"
slurmctld -D -i -f "$t/slurm.conf" >"$t/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$t/slurm.conf" >"$t/log/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 300); do sinfo -h -o %t 2>/dev/null | grep -qx idle && break; sleep 0.2; done
sinfo -h -o %t | grep -qx idle || fail "the node did not come up idle: $(sinfo 2>&1)"
echo "slurm: $(sinfo -h -o '%P %D %c %t')"

# 40 lines of stories260k (by name, pulled per shard from the mirror), and in
# shard 2/4 one slower line, its last, (a 110M random model file) that keeps the task
# running after its other lines are done, so the cancel lands mid-run.
"$atelier" models synth --arch llama --params 110M --type q8_0 -o "$t/slow.gguf" >/dev/null
for i in $(seq 1 40); do
  if [ "$i" = 38 ]; then  # the last line of shard 2: its quick lines (one model) run first
    echo "{\"model\": \"$t/slow.gguf\", \"prompt\": \"Once upon a time\", \"max_new_tokens\": 240, \"sampling\": {\"seed\": $i}}"
  else
    echo "{\"model\": \"stories260k\", \"prompt\": \"Once upon a time\", \"max_new_tokens\": 12, \"sampling\": {\"temperature\": 0.8, \"seed\": $i}}"
  fi
done > "$t/batch.jsonl"
chmod -R a+rX "$t"
export ATELIER="$atelier" ATELIER_MODEL_MIRROR="$fixtures" ATELIER_MODELS=stories260k
unset ATELIER_STORE ATELIER_HOME
submit_array() { sbatch --parsable --array=0-3 -c 1 -o "$t/log/task-%A_%a.log" "$repo/deploy/slurm/atelier-batch.sbatch" "$t/batch.jsonl" "$t/results"; }
jobs_of() { "$atelier" queue list --json --data-dir "$t/results/shard-$1/queue" 2>/dev/null || true; }
state_count() { jobs_of "$1" | grep -c "\"state\":\"$2\"" || true; }
wait_gone() {  # until job $1 (every task) has left the queue
  for _ in $(seq 1200); do [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && return 0; sleep 0.25; done
  fail "job $1 did not finish: $(squeue 2>&1)"
}

t0=$SECONDS
array=$(submit_array)
echo "array job $array submitted"
# Shard 2 mid-run: some of its lines completed, the slow one running.
before=
for _ in $(seq 1200); do
  before=$(jobs_of 2)
  if [ "$(grep -c '"state":"completed"' <<<"$before")" -ge 3 ] && grep -q '"state":"running"' <<<"$before"; then break; fi
  sleep 0.05
done
grep -q '"state":"running"' <<<"$before" || fail "shard 2 was never caught mid-run: $before"
scancel "${array}_2"
echo "cancelled task ${array}_2 with $(grep -c '"state":"completed"' <<<"$before") of 10 lines done"
wait_gone "$array"
[ "$(state_count 2 completed)" -lt 10 ] || fail "shard 2 finished before the cancel took effect"

array2=$(submit_array)
merge=$(sbatch --parsable --dependency="afterany:$array2" -o "$t/log/merge-%j.log" "$repo/deploy/slurm/atelier-merge.sbatch" "$t/batch.jsonl" "$t/results" 4)
wait_gone "$array2"
wait_gone "$merge"
echo "array, cancel, resubmission and merge: $((SECONDS - t0)) s"
[ -s "$t/results/merged/results.jsonl" ] || fail "no merged results (merge log: $(cat "$t"/log/merge-*.log))"

# Exactly once: one job per line of shard 2, each completed; the lines done before the cancel kept their jobs.
after=$(jobs_of 2)
[ "$(grep -c '"state":"completed"' <<<"$after")" = 10 ] || fail "shard 2 after the resubmission: $after"
"$atelier" queue list --json --data-dir "$t/results/shard-2/queue" > "$t/after.jsonl"
printf '%s\n' "$before" > "$t/before.jsonl"
python3 - "$t" <<'PY' || fail "shard 2 did not run each line exactly once"
import json, sys
t = sys.argv[1]
def load(name):
    out = []
    for line in open(f"{t}/{name}"):
        line = line.strip()
        if not line: continue
        v = json.loads(line)
        out += v if isinstance(v, list) else [v]
    return out
before, after = load("before.jsonl"), load("after.jsonl")
assert len(after) == 10, f"{len(after)} jobs in shard 2's queue for its 10 lines"
done_before = {j["id"] for j in before if j["state"] == "completed"}
assert done_before <= {j["id"] for j in after}, "a job completed before the cancel is gone"
results = [json.loads(l) for l in open(f"{t}/results/shard-2/results.jsonl")]
assert sorted(r["line"] for r in results) == list(range(2, 41, 4)), [r["line"] for r in results]
assert len({r["job"] for r in results}) == 10, "two lines share a job"
assert {r["job"] for r in results} == {j["id"] for j in after}, "results name jobs the queue does not hold"
print(f"shard 2: {len(done_before)} line(s) done before the cancel kept their jobs; 10 jobs for 10 lines")
PY

# The same file in one run, outside Slurm: the merged results must equal it line for line.
"$atelier" models pull stories260k --mirror "$fixtures" --store "$t/single-store" >/dev/null
"$atelier" batch "$t/batch.jsonl" --out "$t/single" --data-dir "$t/single/queue" --store "$t/single-store" 2>"$t/log/single.log" ||
  fail "the single run failed: $(tail -5 "$t/log/single.log")"
python3 - "$t" <<'PY' || fail "the merged results differ from the single run's"
import json, sys
t = sys.argv[1]
merged = [json.loads(l) for l in open(f"{t}/results/merged/results.jsonl")]
single = [json.loads(l) for l in open(f"{t}/single/results.jsonl")]
assert len(merged) == len(single) == 40, (len(merged), len(single))
keys = ["line", "state", "seed", "text", "stop_reason", "prompt_tokens", "new_tokens", "model_version"]
for m, s in zip(merged, single):
    for k in keys:
        assert m[k] == s[k], f"line {m['line']}: {k} {m[k]!r} != {s[k]!r}"
    assert m["state"] == "completed"
print("merged == single run, 40 lines, on", ", ".join(keys))
PY
echo "slurm_test: OK"
