"""Evidence (d), (f) and (g) of stack_driver.py: who may see the Benchmarks page, who may do
what in MLflow, and what the containers see of the project folder. Standard library only (run by stack_driver.py, inside the stack's
network namespace).

(d) the Benchmarks page answers 401 without login and shows the run with the admin's JWT;
(f) the Celery workers log to MLflow as their own user (MLFLOW_WORKER_USERNAME, created by the
    mlflow-init service), never as the admin: with that user's credentials, creating an experiment
    is refused (403 PERMISSION_DENIED) and nothing is created, while the benchmark's experiment
    holds the run's FINISHED runs, logged through it;
(g) no container bind-mounts the project root or an env file, and none has /opt/project/.env.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

from stack_driver import AIRFLOW, MLFLOW, Check, Stack, http

ROOT = Path(__file__).resolve().parents[2]


def trained_cells(tis: list[dict]) -> list[tuple[str, int]]:
    """(backend, workers) of every cell the run trained, from its mapped train task instances
    (rendered "spark default local x2 r0"): what the evidence expects, whatever the profile plans."""
    names = [str(ti["rendered_map_index"]).split() for ti in tis
             if ti["task_id"].startswith("train.w") and ti["state"] == "success" and ti["map_index"] >= 0]
    return [(n[0], int(next(p for p in n if p.startswith("x"))[1:])) for n in names]


def _basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _container_env(name: str) -> dict[str, str]:
    out = subprocess.run(["docker", "exec", name, "printenv"], capture_output=True, text=True, timeout=60,
                         check=False).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def evidence_mlflow_permissions(stack: Stack, wanted: int) -> tuple[str, dict]:
    user = os.environ.get("MLFLOW_WORKER_USERNAME") or "benchmark-worker"
    worker, admin = _basic(user, os.environ["MLFLOW_WORKER_PASSWORD"]), _basic(
        os.environ.get("MLFLOW_ADMIN_USERNAME") or "admin", os.environ["MLFLOW_ADMIN_PASSWORD"])
    experiment = os.environ.get("BENCHMARK_MLFLOW_EXPERIMENT") or "distributed-training-benchmark"
    envs = {name: _container_env(name) for name in stack.containers("airflow-worker").values()}
    logins = {name: env.get("MLFLOW_TRACKING_USERNAME") for name, env in envs.items()}
    leaked = [name for name, env in envs.items() if os.environ["MLFLOW_ADMIN_PASSWORD"] in env.values()]
    if set(logins.values()) != {user} or leaked:
        raise Check(f"(f) the Celery workers' MLflow login is {logins} (want {user}); admin password in {leaked}")
    probe = f"created-by-a-trigger-{int(time.time())}"
    status, text = http("POST", f"{MLFLOW}/api/2.0/mlflow/experiments/create", {"name": probe}, worker)
    found, _ = http("GET", f"{MLFLOW}/api/2.0/mlflow/experiments/get-by-name?experiment_name={probe}",
                    headers=admin)
    if status != 403 or found != 404:
        raise Check(f"(f) creating an experiment as {user}: {status} {text[:200]} (want 403); "
                    f"the admin then finds it: {found} (want 404)")
    status, text = http("GET", f"{MLFLOW}/api/2.0/mlflow/experiments/get-by-name?experiment_name="
                        f"{quote(experiment)}", headers=worker)
    if status != 200:
        raise Check(f"(f) {user} cannot read the benchmark's experiment {experiment!r}: {status} {text[:200]}")
    exp_id = json.loads(text)["experiment"]["experiment_id"]
    status, text = http("POST", f"{MLFLOW}/api/2.0/mlflow/runs/search",
                        {"experiment_ids": [exp_id], "max_results": 100}, worker)
    runs = json.loads(text).get("runs", []) if status == 200 else []
    finished = [r for r in runs if r["info"]["status"] == "FINISHED"]
    if len(finished) < wanted:  # the parent + one per cell
        raise Check(f"(f) {user} sees {len(finished)} FINISHED runs in {experiment!r} ({status}); want {wanted}")
    line = (f"(f) the Celery workers log to MLflow as {user} (not the admin: its password is in no worker's "
            f"environment); as {user}, creating an experiment answers 403 (PERMISSION_DENIED) and creates "
            f"nothing, while {experiment!r} (id {exp_id}) holds the run's {len(finished)} FINISHED runs")
    return line, {"worker_user": user, "create_status": 403, "experiment_id": exp_id,
                  "finished_runs": len(finished), "wanted_runs": wanted, "worker_logins": logins}


def evidence_mounts(stack: Stack) -> tuple[str, dict]:
    ids = stack.run("ps", "-a", "-q").split()
    mounts: dict[str, list[str]] = {}
    for cid in ids:
        out = subprocess.run(["docker", "inspect", "-f", "{{.Name}} {{json .Mounts}}", cid], capture_output=True,
                             text=True, check=True).stdout.strip()
        name, _, raw = out.partition(" ")
        mounts[name.lstrip("/")] = [f"{m.get('Source')}:{m['Destination']}" for m in json.loads(raw)
                                    if m.get("Type") == "bind"]
    bad = {n: [m for m in ms if Path(m.split(":")[0]) in (ROOT, *ROOT.parents) or ".env" in m.split(":")[0]]
           for n, ms in mounts.items()}
    bad = {n: ms for n, ms in bad.items() if ms}
    running = stack.run("ps", "-q").split()
    seen_env = [cid for cid in running if subprocess.run(["docker", "exec", cid, "test", "-e", "/opt/project/.env"],
                                                         capture_output=True, timeout=60, check=False).returncode == 0]
    if bad or seen_env or not mounts:
        raise Check(f"(g) project root or env file mounted: {bad}; /opt/project/.env visible in {seen_env}")
    binds = sorted({m.split(":")[0].replace(str(ROOT), ".") for ms in mounts.values() for m in ms})
    line = (f"(g) {len(mounts)} containers: none bind-mounts the project root or an env file "
            f"(bind mounts: {', '.join(binds)}); /opt/project/.env exists in none")
    return line, {"bind_mounts": mounts}


def evidence_benchmarks_page(token: str, run_id: str) -> tuple[str, dict]:
    status_anon, _ = http("GET", f"{AIRFLOW}/benchmarks/")
    status, page = http("GET", f"{AIRFLOW}/benchmarks/", headers={"Authorization": f"Bearer {token}"})
    from_run = run_id.replace(":", "_").replace("+", "_")
    if status_anon != 401 or status != 200 or "smoke" not in page:
        raise Check(f"(d) /benchmarks/: without login {status_anon} (want 401), with JWT {status} (want 200 "
                    f"and the smoke run): {page[:300]}")
    shows_run = any(part in page for part in (run_id, from_run))
    line = (f"(d) Benchmarks page /benchmarks/: 401 without login; 200 with the admin's JWT "
            f"({len(page)} bytes, smoke profile{', run ' + run_id if shows_run else ''})")
    return line, {"status_without_login": status_anon, "status_with_jwt": status, "bytes": len(page),
                  "shows_run_id": shows_run}
