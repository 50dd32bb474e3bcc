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

from pipelines.measure import signals
from pipelines.config import save_config
from pipelines.runfolder.results import CellResult

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


def test_cause_of_finds_the_signal_behind_a_library_wrapper():
    stopped = signals.CellTerminated(signal.SIGTERM, "x")
    try:
        try:
            raise stopped
        except signals.CellTerminated as err:
            raise SystemError("wrapped by a C++ core") from err
    except SystemError as wrapped:
        assert signals.cause_of(wrapped) is stopped
    assert signals.cause_of(ValueError("no signal")) is None and signals.cause_of(None) is None


def test_raise_once_handlers_raise_once_remember_and_restore():
    before = signal.getsignal(signal.SIGTERM)
    handlers = signals.RaiseOnceHandlers("the platform shut down")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a library replacing the handler
    handlers.raise_once()
    try:
        with pytest.raises(signals.CellTerminated, match="SIGTERM: the platform shut down"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one is remembered, not raised
        time.sleep(0.1)
        assert handlers.terminated().signum == signal.SIGTERM
    finally:
        handlers.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_stop_leftovers_kills_what_ignores_sigterm():
    stuck = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    try:
        killed = signals.stop_leftovers([psutil.Process(stuck.pid)], grace_s=0.3, owner="test")
        assert [p.pid for p in killed] == [stuck.pid]
        stuck.wait(5)  # gone (psutil reaped it already: no exit code to compare)
    finally:
        stuck.kill()
