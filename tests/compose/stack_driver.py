"""Drive the running compose stack: run the smoke benchmark through it and collect evidence.

Run by scripts/compose_e2e.sh inside the private network namespace where the stack runs (its
published ports are on that namespace's 127.0.0.1). Standard library only. Steps:

1. log in to Airflow's REST API (simple auth manager, AIRFLOW_ADMIN_PASSWORD) -> JWT; set the
   pool ``training_workers`` (airflow-init created it) to BENCHMARK_TRAINING_SLOTS slots;
2. wait until the DAG is parsed, unpause it, trigger ``imdb_benchmark`` with the smoke profile
   on the stack's Spark master; wait for the run;
3. evidence, each a line in ARTIFACTS/evidence.txt and a key of ARTIFACTS/result.json:
   (a) task instances ran on both Celery worker containers (their hostnames);
   (b) the Spark cells ran on the stack's Spark master (its applications, the driver's
       TorchDistributor line) with their barrier tasks on its worker (executor logs there);
   (c) the MLflow runs are in the server's PostgreSQL store and their files in its artifact
       volume, and the server refuses requests without credentials;
   (d) the Benchmarks page answers 401 without login and shows the run with the JWT;
   (e) hardening: no container process runs as root; the published ports listen on loopback only.
   (f), (g) stack_security.py: the workers' MLflow user's rights; no root or .env mount;
   (h) cell_listeners.py: polled inside the Celery workers while cells train, each one-host cell
       runs in a network namespace of its own, listening on nothing in the worker's;
   (i) the run's network namespace made and entered inside a Celery worker;
   (j) the Ray cell: its driver in a Celery worker joined the stack's standing Ray cluster
       (ray-head) through Ray Client, its ranks ran on the ray-worker container, its log holds
       none of Ray's benign "Failed to query" noise, and the cluster still stands after it.

Exit status 0 when the run succeeded and every check passed, 1 otherwise (message says which).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

DAG_ID = "imdb_benchmark"
AIRFLOW = "http://127.0.0.1:8080"
MLFLOW = "http://127.0.0.1:5000"
SPARK_UI = "http://127.0.0.1:8081"
SPARK_MASTER = "spark://spark-master:7077"
POOL = "training_workers"


class Check(RuntimeError):
    """A step or an evidence check failed; the message says which."""


def http(method: str, url: str, body=None, headers: dict | None = None, timeout: float = 30):
    """-> (status, text); HTTP errors are answers too, connection errors raise OSError."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


class Api:
    def __init__(self, base: str, token: str):
        self.base, self.headers = base, {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, body=None, ok=(200,)):
        status, text = http(method, self.base + path, body, self.headers)
        if status not in ok:
            raise Check(f"{method} {path} -> {status}: {text[:500]}")
        return json.loads(text) if text.strip().startswith(("{", "[")) else text


# The trigger's overrides of the smoke profile's size (a form field each); tests/compose/test_stack.py reads them
STACK_RUN_SIZE = {"epochs": 2, "train_samples": 480, "test_samples": 160}


def wait_for(what: str, check, timeout: float, interval: float = 3.0):
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (OSError, Check) as err:
            last = err
        time.sleep(interval)
    raise Check(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


class Stack:
    """`docker compose ...` of this stack (project, env file and files given by the script)."""

    def __init__(self, compose: str):
        self.cmd = shlex.split(compose)

    def run(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run([*self.cmd, *args], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise Check(f"docker compose {' '.join(args)} -> {out.returncode}: {out.stderr[-1000:]}")
        return out.stdout

    def exec(self, service: str, script: str) -> str:
        return self.run("exec", "-T", service, "sh", "-c", script)

    def containers(self, service: str) -> dict[str, str]:
        """hostname -> container name of every container of ``service``."""
        ids = self.run("ps", "-q", service).split()
        out = subprocess.run(["docker", "inspect", "-f", "{{.Config.Hostname}} {{.Name}}", *ids],
                             capture_output=True, text=True, check=True).stdout
        return {h: n.lstrip("/") for h, n in (line.split() for line in out.splitlines())}


def login(password: str, user: str) -> str:
    def token():
        status, text = http("POST", f"{AIRFLOW}/auth/token", {"username": user, "password": password})
        return json.loads(text)["access_token"] if status in (200, 201) else None

    return wait_for("an Airflow JWT from /auth/token", token, 120)


def set_pool(api: Api, slots: int) -> dict:
    status, _ = http("GET", f"{AIRFLOW}/api/v2/pools/{POOL}", headers=api.headers)
    if status == 404:
        api.call("POST", "/api/v2/pools", {"name": POOL, "slots": slots,
                                           "description": "Training workers of the imdb_benchmark DAG"},
                 ok=(200, 201))
        how = "created"
    else:
        api.call("PATCH", f"/api/v2/pools/{POOL}?update_mask=slots",
                 {"pool": POOL, "slots": slots, "include_deferred": False})
        how = "existed (airflow-init), resized"
    pool = api.call("GET", f"/api/v2/pools/{POOL}")
    return {"how": how, "slots": pool["slots"]}


def trigger_and_wait(api: Api, conf: dict, timeout: float) -> dict:
    def parsed():
        errors = api.call("GET", "/api/v2/importErrors").get("import_errors", [])
        if errors:
            raise SystemExit("DAG import errors: " + "; ".join(e["stack_trace"][-800:] for e in errors))
        status, _ = http("GET", f"{AIRFLOW}/api/v2/dags/{DAG_ID}", headers=api.headers)
        return status == 200

    wait_for(f"the dag-processor to parse {DAG_ID}", parsed, 180)
    api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    run = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": conf})
    run_id, started = run["dag_run_id"], time.monotonic()
    print(f"triggered {run_id}", file=sys.stderr, flush=True)

    def finished():
        state = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
        return state if state in ("success", "failed") else None

    state = wait_for(f"dag run {run_id}", finished, timeout, 5)
    return {"run_id": run_id, "state": state, "seconds": round(time.monotonic() - started, 1)}


def task_instances(api: Api, run_id: str) -> list[dict]:
    tis = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")
    return [{k: ti.get(k) for k in ("task_id", "map_index", "state", "hostname", "try_number", "duration",
                                    "rendered_map_index")} for ti in tis["task_instances"]]


def task_log(api: Api, run_id: str, ti: dict) -> str:
    path = (f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/"
            f"{max(ti['try_number'] or 1, 1)}?map_index={ti['map_index']}&full_content=true")
    status, text = http("GET", AIRFLOW + path, headers={**api.headers, "Accept": "application/json"})
    if status != 200:
        return f"(log unavailable: {status})"
    content = json.loads(text).get("content", [])
    if isinstance(content, str):
        return content
    fields = ("timestamp", "level", "event")
    return "\n".join(" ".join(str(e.get(k, "")) for k in fields) if isinstance(e, dict) else str(e)
                     for e in content)


def evidence_workers(stack: Stack, tis: list[dict]) -> tuple[str, dict]:
    workers = stack.containers("airflow-worker")
    ran = [ti for ti in tis if ti["state"] == "success"]
    by_host: dict[str, list[str]] = {}
    for ti in ran:
        mapped = f"[{ti['rendered_map_index'] or ti['map_index']}]" if ti["map_index"] >= 0 else ""
        name = ti["task_id"] + mapped
        by_host.setdefault(ti["hostname"], []).append(name)
    strangers = sorted(set(by_host) - set(workers))
    if strangers:
        raise Check(f"(a) tasks ran on hosts that are not Celery worker containers: {strangers}")
    if len(workers) != 2 or len(by_host) != 2:
        raise Check(f"(a) expected tasks on 2 Celery workers, got {len(by_host)} of {len(workers)}: "
                    f"{by_host}")
    parts = [f"{workers[h]} (hostname {h}): {len(names)} tasks, e.g. {', '.join(sorted(names)[:3])}"
             for h, names in sorted(by_host.items(), key=lambda kv: workers[kv[0]])]
    line = f"(a) {len(ran)} successful task instances ran on 2 Celery workers: " + "; ".join(parts)
    return line, {"workers": workers, "tasks_by_host": by_host}


def evidence_spark(stack: Stack, api: Api, run_id: str, tis: list[dict], wanted: dict[str, int]) -> tuple[str, dict]:
    status, text = http("GET", f"{SPARK_UI}/json/")
    if status != 200:
        raise Check(f"(b) Spark master UI /json/ -> {status}")
    master = json.loads(text)
    apps = {a["name"]: a for a in master.get("completedapps", []) + master.get("activeapps", [])}
    missing = [w for w in wanted if w not in apps]
    if missing:
        raise Check(f"(b) Spark master {master.get('url')} has no application {missing}; "
                    f"it has {sorted(apps)}")
    driver_lines = []
    for ti in tis:
        if ti["task_id"].startswith("train.w") and "spark" in str(ti["rendered_map_index"]):
            found = [ln for ln in task_log(api, run_id, ti).splitlines() if "TorchDistributor(" in ln]
            line = found[0] if found else "(no TorchDistributor line)"
            driver_lines.append(line[max(line.find("TorchDistributor("), 0):][:160])
    if master.get("url") != SPARK_MASTER:
        raise Check(f"(b) the Spark UI at {SPARK_UI} is of master {master.get('url')}, not {SPARK_MASTER}")
    # The trigger sets no master (deployment field): the Celery workers' environment does.
    worker_env = {name: subprocess.run(["docker", "exec", name, "printenv", "BENCHMARK_SPARK_MASTER"],
                                       capture_output=True, text=True, timeout=60).stdout.strip()
                  for name in stack.containers("airflow-worker").values()}
    if set(worker_env.values()) != {SPARK_MASTER}:
        raise Check(f"(b) BENCHMARK_SPARK_MASTER in the Celery workers is {worker_env}, want {SPARK_MASTER}")
    if not driver_lines or not all(SPARK_MASTER in ln and "'local_mode': False" in ln for ln in driver_lines):
        raise Check(f"(b) not every Spark train task log says TorchDistributor ran in barrier mode on "
                    f"{SPARK_MASTER}: {driver_lines}")
    # Executor logs on the Spark worker: one folder per application and executor; every barrier
    # task (one torchrun each) logs "BarrierTaskContext: Task N ... finished global sync".
    app_ids = {apps[w]["id"]: w for w in wanted}
    listing = stack.exec("spark-worker", "cd /opt/spark-work && for d in app-*/*; do "
                         "n=$(grep -c 'BarrierTaskContext: Task .* finished global sync' \"$d/stderr\"); "
                         "echo \"$d $n\"; done")
    barrier_tasks: dict[str, int] = {}
    executor_dirs: dict[str, list[str]] = {}
    for row in listing.splitlines():
        folder, hits = row.split()
        if folder.split("/")[0] in app_ids:
            name = app_ids[folder.split("/")[0]]
            executor_dirs.setdefault(name, []).append(folder)
            barrier_tasks[name] = barrier_tasks.get(name, 0) + int(hits)
    if any(barrier_tasks.get(name, 0) < n for name, n in wanted.items()):  # one task per rank
        raise Check(f"(b) barrier tasks in the executor logs on spark-worker: {barrier_tasks} "
                    f"(want {wanted}); listing:\n{listing}")
    worker_hosts = [w.get("host") for w in master.get("workers", []) if w.get("state") == "ALIVE"]
    others = sorted(set(apps) - set(wanted))
    driver = next((ln for ln in driver_lines if "'num_processes': 2" in ln), driver_lines[0])
    line = (f"(b) Spark master {master.get('url')} (worker alive at {', '.join(worker_hosts)}) ran "
            + ", ".join(f"{w} as {apps[w]['id']} ({apps[w].get('cores')} cores, {apps[w].get('state')}, "
                        f"{barrier_tasks[w]} barrier task(s) synced in executor "
                        f"{', '.join(executor_dirs[w])} on spark-worker)" for w in wanted)
            + (f"; also {', '.join(others)}" if others else "")
            + f"; master from the Celery workers' BENCHMARK_SPARK_MASTER={SPARK_MASTER} (no trigger override)"
            + f"; driver log: {driver}")
    return line, {"master": {k: master.get(k) for k in ("url", "status", "aliveworkers", "cores")},
                  "worker_env": worker_env, "apps": {w: apps[w] for w in wanted},
                  "executor_dirs": executor_dirs,
                  "barrier_tasks": barrier_tasks, "driver_lines": driver_lines}


def evidence_mlflow(stack: Stack, run_id: str, wanted: int) -> tuple[str, dict]:
    status, _ = http("GET", f"{MLFLOW}/api/2.0/mlflow/experiments/search?max_results=5")
    if status != 401:
        raise Check(f"(c) MLflow answered {status} to a request without credentials (want 401)")
    user = os.environ.get("MLFLOW_ADMIN_USERNAME") or "admin"
    basic = base64.b64encode(f"{user}:{os.environ['MLFLOW_ADMIN_PASSWORD']}".encode()).decode()
    status, _ = http("GET", f"{MLFLOW}/api/2.0/mlflow/experiments/search?max_results=5",
                     headers={"Authorization": f"Basic {basic}"})
    if status != 200:
        raise Check(f"(c) MLflow refused the admin credentials: {status}")
    sql = ("SELECT r.run_uuid, r.name, r.status, r.artifact_uri, e.name, "
           "(SELECT count(*) FROM metrics m WHERE m.run_uuid = r.run_uuid) "
           "FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id ORDER BY r.start_time")
    rows = stack.exec("postgres", f"psql -U airflow -d mlflow -At -F '|' -c \"{sql}\"")
    runs = [dict(zip(("run_uuid", "name", "status", "artifact_uri", "experiment", "metrics"), r.split("|")))
            for r in rows.splitlines() if r]
    files = stack.exec("mlflow", "cd /mlflow/artifacts && find . -type f").split()
    per_run = {r["run_uuid"]: [f for f in files if f"/{r['run_uuid']}/" in f] for r in runs}
    finished = [r for r in runs if r["status"] == "FINISHED"]
    cells = [r for r in finished if any(b in r["name"] for b in ("ddp", "spark", "determined", "ray"))]
    with_files = [r for r in runs if per_run[r["run_uuid"]]]
    if len(finished) < wanted or len(cells) < wanted - 1 or len(with_files) < wanted:
        raise Check(f"(c) expected a parent + {wanted - 1} cell runs FINISHED with artifacts; PostgreSQL has {runs}, "
                    f"files per run {({k: len(v) for k, v in per_run.items()})}")
    sample = next((f for f in files if f.endswith("report.html")), files[0])
    names, metric_rows = ", ".join(sorted(r["name"] for r in finished)), sum(int(r["metrics"]) for r in runs)
    line = (f"(c) MLflow PostgreSQL store (db mlflow) holds {len(runs)} runs, {len(finished)} FINISHED "
            f"({names}), {metric_rows} metric rows; artifact volume /mlflow/artifacts holds "
            f"{len(files)} files of {len(with_files)} of them, "
            f"e.g. {sample.lstrip('./')}; without credentials the server answers 401")
    return line, {"runs": runs, "artifact_files": len(files),
                  "files_per_run": {k: len(v) for k, v in per_run.items()}}


RAY_ADDRESS = "ray://ray-head:10001"
RAY_NOISE = "Failed to query Ray Train Controller actor state"  # pipelines/platforms/ray/logs.py


def evidence_ray(stack: Stack, tis: list[dict], cells: list[tuple[str, int]]) -> tuple[str, dict]:
    """(j) each Ray cell's result, read from the run volume on ray-worker: it joined the stack's
    cluster (platform_mode "cluster"; its train task, where the driver runs, on a Celery worker) and
    every rank ran on ray-worker."""
    wanted = [f"ray-w{w}-r0" for b, w in cells if b == "ray"]
    drivers = {}  # cell -> the Celery worker that ran its train task (rendered "ray default local x2 r0")
    for ti in tis:
        name = str(ti["rendered_map_index"]).split()
        if ti["task_id"].startswith("train.w") and ti["state"] == "success" and name[0] == "ray":
            drivers[f"ray-w{next(p for p in name if p.startswith('x'))[1:]}-r0"] = ti["hostname"]
    if not wanted:
        raise Check(f"(j) the run trained no Ray cell: {cells}")
    ray_nodes, celery, head = (stack.containers("ray-worker"), stack.containers("airflow-worker"),
                               stack.containers("ray-head"))
    found: dict[str, dict] = {}
    for cell in wanted:
        folder = stack.exec("ray-worker", f"ls -d /opt/runs/*/cells/{cell} | head -1").strip()
        result = json.loads(stack.exec("ray-worker", f"cat {folder}/result.json"))
        noise = int(stack.exec("ray-worker", f"grep -c '{RAY_NOISE}' {folder}/train.log || true").strip() or 0)
        hosts = sorted({p.split()[0] for p in result.get("placements", []) if p.strip()})
        found[cell] = {"folder": folder, "status": result.get("status"), "platform_mode": result.get("platform_mode"),
                       "driver_host": drivers.get(cell), "rank_hosts": hosts, "noise_lines": noise,
                       "test_accuracy": (result.get("test") or {}).get("accuracy")}
        if (result.get("status") != "ok" or result.get("platform_mode") != "cluster"
                or drivers.get(cell) not in celery or not hosts or not set(hosts) <= set(ray_nodes) or noise):
            raise Check(f"(j) {cell} did not run on the stack's Ray cluster as it should: {found[cell]} "
                        f"(ray-worker hostnames {sorted(ray_nodes)}, Celery workers {sorted(celery)}, "
                        f"ray-head {sorted(head)})")
    address = {name: subprocess.run(["docker", "exec", name, "printenv", "BENCHMARK_RAY_ADDRESS"],
                                    capture_output=True, text=True, timeout=60).stdout.strip()
               for name in celery.values()}
    if set(address.values()) != {RAY_ADDRESS}:
        raise Check(f"(j) BENCHMARK_RAY_ADDRESS in the Celery workers is {address}, want {RAY_ADDRESS}")
    status = stack.exec("ray-head", "ray status --address ray-head:6379")
    active = [ln for ln in status.split("Pending:")[0].splitlines() if ln.strip().startswith("1 node_")]
    if len(active) != 1 + len(ray_nodes):
        raise Check(f"(j) after the run the Ray cluster has {len(active)} active nodes, want the head and "
                    f"{len(ray_nodes)} worker(s):\n{status}")
    line = (f"(j) Ray cells joined the stack's standing Ray cluster at {RAY_ADDRESS} (Ray Client, the Celery "
            f"workers' BENCHMARK_RAY_ADDRESS, token from the secret): "
            + "; ".join(f"{c}: driver on {celery[f['driver_host']]}, {len(f['rank_hosts'])} rank host(s) "
                        f"{', '.join(ray_nodes[h] for h in f['rank_hosts'])}, test accuracy {f['test_accuracy']}, "
                        f"0 lines of Ray's benign noise" for c, f in found.items())
            + f"; after the run `ray status` shows {len(active)} active nodes (ray-head with 0 CPUs, ray-worker)")
    return line, {"cells": found, "worker_env": address, "ray_status": status}


def evidence_hardening(stack: Stack) -> tuple[str, dict]:
    """(e) every process of every container runs as a non-root uid; the stack listens on loopback only."""
    ids = stack.run("ps", "-q").split()
    uids: dict[str, list[str]] = {}
    for cid in ids:
        name = subprocess.run(["docker", "inspect", "-f", "{{.Name}}", cid], capture_output=True, text=True,
                              check=True).stdout.strip().lstrip("/")
        top = subprocess.run(["docker", "top", cid, "-o", "uid,pid"], capture_output=True, text=True,
                             check=True).stdout  # docker top needs the pid column
        uids[name] = sorted({row.split()[0] for row in top.splitlines()[1:] if row.strip()})
    root = {n: u for n, u in uids.items() if "0" in u}
    if root or not uids:
        raise Check(f"(e) containers with root processes: {root or uids}")
    listen = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout.split("\n")
    addrs = sorted({ln.split()[3] for ln in listen if ln.strip()})
    if any(not a.startswith(("127.0.0.1:", "[::1]:")) for a in addrs):
        raise Check(f"(e) the stack's namespace listens outside loopback: {addrs}")
    all_uids = ", ".join(sorted({u for v in uids.values() for u in v}))
    line = (f"(e) {len(uids)} containers, every process non-root (uids {all_uids}); "
            f"published ports listen on {', '.join(addrs)} only")
    return line, {"uids": uids, "listening": addrs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--compose", required=True, help="the `docker compose ...` command of this stack")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds for the DAG run")
    parser.add_argument("--run-id", help="collect evidence of this finished run instead of triggering one")
    args = parser.parse_args()
    stack, art = Stack(args.compose), args.artifacts
    sys.modules.setdefault("stack_driver", sys.modules[__name__])  # one Check class for stack_security
    import cell_listeners
    import stack_security
    result: dict = {"checks": {}}
    lines: list[str] = []

    def save():
        (art / "result.json").write_text(json.dumps(result, indent=2, default=str))
        (art / "evidence.txt").write_text("\n".join(lines) + "\n")

    user = os.environ.get("AIRFLOW_ADMIN_USERNAME") or "admin"
    password = os.environ["AIRFLOW_ADMIN_PASSWORD"]
    try:
        token = login(password, user)
        api = Api(AIRFLOW, token)
        result["pool"] = set_pool(api, int(os.environ.get("BENCHMARK_TRAINING_SLOTS") or 2))
        pool = result["pool"]
        lines.append(f"pool {POOL}: {pool['slots']} slots ({pool['how']} through the REST API)")
        # The Spark master and the Ray cluster come from the stack (BENCHMARK_SPARK_MASTER,
        # BENCHMARK_RAY_ADDRESS): the trigger names neither. The smoke profile made smaller (480
        # reviews x 2 epochs): what the stack proves is where each part runs, not what the model learns.
        conf = {"profile": "smoke", "backends": ["ddp", "spark", "determined", "ray"], "worker_counts": [2],
                **STACK_RUN_SIZE}
        result["conf"] = conf
        watcher = None  # (h) needs the run watched while it trains: not with --run-id
        if args.run_id:
            state = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{args.run_id}")["state"]
            result["run"] = {"run_id": args.run_id, "state": state, "seconds": None}
        else:
            watcher = cell_listeners.Watcher(sorted(stack.containers("airflow-worker").values())).start()
            try:
                result["run"] = trigger_and_wait(api, conf, args.timeout)
            finally:
                watcher.stop()
        run_id = result["run"]["run_id"]
        tis = result["task_instances"] = task_instances(api, run_id)
        lines.append(f"dag run {run_id}: {result['run']['state']} in {result['run']['seconds']} s "
                     f"(conf {json.dumps(conf)})")
        if result["run"]["state"] != "success":
            bad = [ti for ti in tis if ti["state"] not in ("success", "skipped")]
            (art / "failed_task_logs.txt").write_text("\n\n".join(
                f"== {ti['task_id']}[{ti['map_index']}] {ti['state']}\n{task_log(api, run_id, ti)[-8000:]}"
                for ti in bad))
            states = [(t["task_id"], t["map_index"], t["state"]) for t in bad]
            raise Check(f"dag run {run_id} ended {result['run']['state']}: {states}; "
                        "logs in failed_task_logs.txt")
        token = login(password, user)
        api = Api(AIRFLOW, token)
        cells, runs = stack_security.trained_cells(tis), 1 + len(stack_security.trained_cells(tis))
        for key, check in (("a_celery_workers", lambda: evidence_workers(stack, tis)),
                           ("b_spark_cluster", lambda: evidence_spark(stack, api, run_id, tis, {
                               f"train-spark-w{w}-r0": w for b, w in cells if b == "spark"})),
                           ("c_mlflow_store", lambda: evidence_mlflow(stack, run_id, runs)),
                           ("d_benchmarks_page", lambda: stack_security.evidence_benchmarks_page(token, run_id)),
                           ("e_hardening", lambda: evidence_hardening(stack)),
                           ("f_mlflow_permissions", lambda: stack_security.evidence_mlflow_permissions(stack, runs)),
                           ("g_mounts", lambda: stack_security.evidence_mounts(stack)),
                           ("h_cell_listeners", lambda: cell_listeners.evidence(watcher, cells, Check)),
                           ("i_run_namespace", lambda: cell_listeners.evidence_run_namespace(
                               sorted(stack.containers("airflow-worker").values())[0], Check)),
                           ("j_ray_cluster", lambda: evidence_ray(stack, tis, cells))):
            if key.startswith("h_") and watcher is None:
                continue
            line, detail = check()
            lines.append(line)
            result["checks"][key] = detail
            print(line, file=sys.stderr, flush=True)
        result["ok"] = True
        return 0
    except Check as err:
        result["ok"], result["error"] = False, str(err)
        lines.append(f"FAILED: {err}")
        print(f"FAILED: {err}", file=sys.stderr)
        return 1
    finally:
        save()


if __name__ == "__main__":
    sys.exit(main())
