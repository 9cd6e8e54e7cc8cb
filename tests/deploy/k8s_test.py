#!/usr/bin/python3
# The Kubernetes manifests of deploy/kubernetes (issue 37), without a cluster
# (kubectl is not in Debian 12): a structural check of each object with
# Debian's python3-yaml (the fields the API server requires, an Indexed Job
# whose completions, parallelism, --shard N and the merge's folder list agree,
# volumes that name the claim), then the manifests' own commands run here: N
# processes with JOB_COMPLETION_INDEX=0..N-1 (as the pods would, /data a
# temporary folder, the built atelier on PATH), the merge Job's command after
# them, and the merged results compared line for line with one `atelier batch`
# run of the same file.
# Usage: tests/deploy/k8s_test.py [BUILD_DIR]
import json, os, re, shutil, subprocess, sys, tempfile

import yaml

repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "build"))
fixtures = os.path.abspath(os.path.join(repo, "..", "shared", "fixtures"))
k8s = os.path.join(repo, "deploy", "kubernetes")


def fail(msg):
    print(f"k8s_test: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def load(name):
    with open(os.path.join(k8s, name)) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    if len(docs) != 1:
        fail(f"{name}: {len(docs)} objects, want 1")
    d = docs[0]
    for key in ("apiVersion", "kind", "metadata", "spec"):
        if key not in d:
            fail(f"{name}: no {key}")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["metadata"].get("name", "")):
        fail(f"{name}: metadata.name is not a DNS-1123 label")
    return d


def check_pod(name, job, claim):
    pod = job["spec"]["template"]["spec"]
    if pod.get("restartPolicy") not in ("Never", "OnFailure"):
        fail(f"{name}: a Job's pods need restartPolicy Never or OnFailure")
    c = pod["containers"]
    if len(c) != 1 or not c[0].get("image") or not c[0].get("name"):
        fail(f"{name}: want one container with a name and an image")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    for m in c[0].get("volumeMounts", []):
        if m["name"] not in vols:
            fail(f"{name}: mount {m['name']} names no volume")
    if [v["persistentVolumeClaim"]["claimName"] for v in vols.values()] != [claim]:
        fail(f"{name}: the volume must be the claim {claim}")
    limits = c[0].get("resources", {}).get("limits", {})
    for k in limits:
        if k not in ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"):
            fail(f"{name}: unknown resource {k}")
    cmd = c[0]["command"] + c[0]["args"]
    if cmd[:2] != ["sh", "-c"] or len(cmd) != 3:
        fail(f"{name}: want command sh -c and one script")
    return cmd[2]


pvc = load("pvc.yaml")
if pvc["apiVersion"] != "v1" or pvc["kind"] != "PersistentVolumeClaim":
    fail("pvc.yaml is not a v1 PersistentVolumeClaim")
if not pvc["spec"].get("accessModes") or "storage" not in pvc["spec"]["resources"]["requests"]:
    fail("pvc.yaml needs accessModes and a storage request")
claim = pvc["metadata"]["name"]
batch, merge = load("batch-job.yaml"), load("merge-job.yaml")
for name, job in (("batch-job.yaml", batch), ("merge-job.yaml", merge)):
    if job["apiVersion"] != "batch/v1" or job["kind"] != "Job":
        fail(f"{name} is not a batch/v1 Job")
spec = batch["spec"]
if spec.get("completionMode") != "Indexed":
    fail("batch-job.yaml: completionMode must be Indexed (JOB_COMPLETION_INDEX)")
n = spec["completions"]
if spec.get("parallelism", n) > n:
    fail("batch-job.yaml: parallelism above completions")
shard_script = check_pod("batch-job.yaml", batch, claim)
merge_script = check_pod("merge-job.yaml", merge, claim)
m = re.search(r'--shard "\$JOB_COMPLETION_INDEX/(\d+)"', shard_script)
if not m or int(m.group(1)) != n:
    fail(f"batch-job.yaml: --shard must be $JOB_COMPLETION_INDEX/{n} (completions)")
if re.findall(r"/data/results/shard-(\d+)", merge_script) != [str(i) for i in range(n)]:
    fail(f"merge-job.yaml must merge shard-0 ... shard-{n - 1}")
print(f"k8s_test: manifests well formed: PVC {claim}, Indexed Job of {n} shards, merge of {n} folders")

# The pods' commands, here.
t = tempfile.mkdtemp(prefix="atelier-k8s-test.")
try:
    data = os.path.join(t, "data")
    os.makedirs(data)
    env = dict(os.environ, PATH=os.path.join(build, "app") + ":" + os.environ["PATH"], HOME=t)
    for k in ("ATELIER_HOME", "ATELIER_STORE", "ATELIER_CATALOG", "ATELIER_MODEL_MIRROR"):
        env.pop(k, None)
    subprocess.run(["atelier", "models", "pull", "stories260k", "--mirror", fixtures, "--store", os.path.join(data, "store")],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(data, "batch.jsonl"), "w") as f:
        for i in range(1, 14):
            f.write(json.dumps({"model": "stories260k", "prompt": "Once upon a time", "max_new_tokens": 8,
                                "sampling": {"temperature": 0.8, "seed": i}}) + "\n")
    here = lambda s: s.replace("/data", data)
    pods = [subprocess.Popen(["sh", "-c", here(shard_script)], env=dict(env, JOB_COMPLETION_INDEX=str(i)),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(n)]
    for i, p in enumerate(pods):
        _, err = p.communicate(timeout=300)
        if p.returncode != 0:
            fail(f"pod {i}: exit {p.returncode}: {err.decode()[-500:]}")
    r = subprocess.run(["sh", "-c", here(merge_script)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"the merge Job's command: exit {r.returncode}: {r.stderr}")
    r = subprocess.run(["atelier", "batch", os.path.join(data, "batch.jsonl"), "--out", os.path.join(t, "single"),
                        "--data-dir", os.path.join(t, "single", "queue"), "--store", os.path.join(data, "store")],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"the single run: {r.stderr[-500:]}")
    merged = [json.loads(l) for l in open(os.path.join(data, "results", "merged", "results.jsonl"))]
    single = [json.loads(l) for l in open(os.path.join(t, "single", "results.jsonl"))]
    if len(merged) != 13 or len(single) != 13:
        fail(f"{len(merged)} merged and {len(single)} single results for 13 lines")
    for a, b in zip(merged, single):
        for k in ("line", "state", "seed", "text", "stop_reason", "new_tokens", "model_version"):
            if a[k] != b[k]:
                fail(f"line {a['line']}: {k} {a[k]!r} != {b[k]!r}")
    print(f"k8s_test: {n} pods' commands (JOB_COMPLETION_INDEX 0-{n - 1}) + the merge == one run, 13 lines: OK")
finally:
    shutil.rmtree(t, ignore_errors=True)
