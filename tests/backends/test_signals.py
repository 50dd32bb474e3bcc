"""SIGTERM to `python -m pipelines train` takes the whole cell down (torchrun and its ranks;
Spark's JVM, torchrun and ranks; Ray's local cluster and its workers), marks the cell failed with the signal and ends its MLflow run
FAILED; nothing keeps running or writing afterwards. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from mlflow import MlflowClient

from pipelines.config import save_config
from pipelines.results import CellResult

pytestmark = pytest.mark.slow


LAUNCHER_MARK = {"ddp": "torch.distributed.run", "spark": "torch.distributed.run", "ray": "raylet"}


@pytest.mark.parametrize("backend", ["ddp", "spark", "ray"])
def test_sigterm_stops_every_process_of_the_cell(backend, run_paths, bench_config, tmp_path):
    if not run_paths.config.exists():
        save_config(bench_config, run_paths.config)
    env = {**os.environ, "BENCHMARK_HOST_LOCK": str(tmp_path / "lock")}
    env.pop("MLFLOW_TRACKING_URI", None)  # the run's own store (config.json)
    repeat = {"ddp": 40, "spark": 41, "ray": 42}[backend]
    cell = run_paths.cell(backend, 2, repeat)
    cmd = [sys.executable, "-m", "pipelines", "train", "--run-dir", str(run_paths.root), "--backend", backend,
           "--workers", "2", "--repeat", str(repeat)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not cell.heartbeat.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)  # ranks are training once rank 0 beats
    assert cell.heartbeat.exists(), "training never started"
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert any(LAUNCHER_MARK[backend] in " ".join(p.cmdline()) for p in tree)  # torchrun / Ray's node

    proc.send_signal(signal.SIGTERM)
    sent = time.time()
    out, _ = proc.communicate(timeout=60)
    _, alive = psutil.wait_procs(tree, timeout=max(0.1, 10 - (time.time() - sent)))
    assert not alive, f"still running 10 s after SIGTERM: {[p.cmdline() for p in alive]}"
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "stopped by SIGTERM" in out

    result = CellResult.read(cell.result)
    assert result.status == "failed" and "SIGTERM" in result.error
    assert result.attempts[-1].outcome == "failed"
    written = {p: p.stat().st_mtime for p in cell.root.rglob("*") if p.is_file()}
    time.sleep(3)
    assert {p: p.stat().st_mtime for p in cell.root.rglob("*") if p.is_file()} == written  # nothing writes

    client = MlflowClient(tracking_uri=bench_config.resolved_tracking_uri())
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string=f"attributes.run_name = '{cell.name}'")
    assert runs and all(r.info.status == "FAILED" for r in runs)
