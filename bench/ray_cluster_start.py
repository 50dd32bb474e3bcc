"""What a Ray cell spends before its loop: a local cluster per cell vs. joining a running head.

    .venv/bin/python bench/ray_cluster_start.py              # 2 workers, 2 jobs on the running head
    .venv/bin/python bench/ray_cluster_start.py --jobs 3 --workers 2

Each job is a fresh driver process (as each Ray cell is) running ``TorchTrainer`` with a loop that
only imports torch and transformers (what the shared loop imports first), 1 CPU per worker, the
project's worker runtime env. First one job as ``pipelines.platforms.ray.adapter`` runs a cell today: ``ray.init``
starts a local cluster for it (``local_cluster_options``) and ``ray.shutdown`` stops it. Then a head
started once (``ray start --head --block`` on 127.0.0.1, token authentication with a token of its
own, as ``pipelines.platforms.ray.hosts`` starts a node) and ``--jobs`` jobs joining it one after another;
the head is stopped at the end (SIGTERM to ``ray start --block``). Prints, per job: seconds for
``ray.init``, from the driver's start until every worker ran the loop's first line, for the
imports in the loop, for ``fit`` to return after that, and for ``ray.shutdown``; and the head's
start. JSON lines, then a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipelines.cluster.processes import free_port, stop_tree

READY = "Ray runtime started."


def job(address: str | None, workers: int) -> dict:
    """One driver: connect (or start a local cluster), fit a trivial TorchTrainer, disconnect."""
    t0 = time.time()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from pipelines.platforms.ray.trainer import local_cluster_options, worker_env_vars

    runtime_env = {"env_vars": worker_env_vars()}
    t_import = time.time()
    if address:
        ray.init(address=address, runtime_env=runtime_env)
    else:
        ray.init(runtime_env=runtime_env, **local_cluster_options(workers, 1))
    t_init = time.time()

    def loop(config):
        import json as _json
        import time as _time

        entered = _time.time()
        import torch  # noqa: F401
        from transformers import AutoModelForSequenceClassification  # noqa: F401

        rank = ray.train.get_context().get_world_rank()
        with open(f"{config['storage']}/rank{rank}.json", "w") as out:  # Result.metrics is empty without a checkpoint
            _json.dump({"entered": entered, "imported": _time.time()}, out)

    storage = tempfile.mkdtemp(prefix="ray-bench-")
    TorchTrainer(loop, train_loop_config={"storage": storage},
                 scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(storage_path=storage, name="bench", worker_runtime_env=runtime_env)).fit()
    t_fit = time.time()
    ray.shutdown()
    t_end = time.time()
    ranks = [json.loads(f.read_text()) for f in Path(storage).glob("rank*.json")]
    entered, imported = max(r["entered"] for r in ranks), max(r["imported"] for r in ranks)  # every worker
    return {"mode": "join" if address else "local-cluster", "import_ray_s": round(t_import - t0, 2),
            "ray_init_s": round(t_init - t_import, 2), "driver_start_to_loop_s": round(entered - t0, 2),
            "loop_imports_s": round(imported - entered, 2), "fit_end_s": round(t_fit - imported, 2),
            "shutdown_s": round(t_end - t_fit, 2), "total_s": round(t_end - t0, 2)}


def run_job(address: str | None, workers: int, env: dict) -> dict:
    cmd = [sys.executable, __file__, "job", "--workers", str(workers), *(["--address", address] if address else [])]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def stop_leftovers(temp_dir: str) -> None:
    """SIGKILL what the head's shutdown left (its processes name its temp folder)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        if any(temp_dir in part for part in proc.info["cmdline"] or []):
            proc.kill()


def start_head(env: dict, workers: int, temp_dir: str) -> tuple[subprocess.Popen, str, float]:
    port = free_port()  # for the GCS
    log = open(tempfile.mktemp(prefix="ray-head-", suffix=".log"), "w+")
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={max(workers, os.cpu_count() or 1)}",
                             "--include-dashboard=false", f"--temp-dir={temp_dir}", "--disable-usage-stats"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    while READY not in Path(log.name).read_text():
        if proc.poll() is not None or time.time() - started > 180:
            raise RuntimeError(f"ray start did not come up: {Path(log.name).read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port}", time.time() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="?", default="compare", choices=("compare", "job"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--address")
    args = p.parse_args()
    if args.what == "job":
        print(json.dumps(job(args.address, args.workers)))
        return
    token = Path(tempfile.mkdtemp()) / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    local = run_job(None, args.workers, env)
    print(json.dumps(local), flush=True)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    temp_dir = f"/tmp/rb{os.getpid()}"  # short: Ray's socket paths
    head, address, head_s = start_head(env, args.workers, temp_dir)
    try:
        print(json.dumps({"mode": "head", "ray_start_s": round(head_s, 2)}), flush=True)
        joined = []
        for _ in range(args.jobs):
            joined.append(run_job(address, args.workers, env))
            print(json.dumps(joined[-1]), flush=True)
    finally:  # SIGTERM: `ray start --block` stops its node (no drain: pipelines.platforms.ray.hosts.NO_DRAIN)
        stop_tree([head], 60.0, tree=False)
        stop_leftovers(temp_dir)
    first = joined[0]
    print(f"driver start -> loop: local cluster {local['driver_start_to_loop_s']} s, joining a running head "
          f"{first['driver_start_to_loop_s']} s (first job), {joined[-1]['driver_start_to_loop_s']} s (job "
          f"{len(joined)}); ray.init {local['ray_init_s']} vs {first['ray_init_s']} s; shutdown "
          f"{local['shutdown_s']} vs {first['shutdown_s']} s; the head's own start {head_s:.2f} s")


if __name__ == "__main__":
    main()
