"""Trustworthy timings with real torchrun processes started through the CLI: one timed cell per
host at a time, every attempt of a killed-and-retried cell counted, a seed per repeat."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pipelines.config import save_config
from pipelines.runfolder.paths import PROJECT_ROOT
from pipelines.runfolder.results import CellResult
from pipelines.training import phases
from tests import fault_injection

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cli_run(run_paths, bench_config, tmp_path_factory):
    """The session's token shards as a run folder the CLI can continue (--run-dir)."""
    if not run_paths.config.exists():
        save_config(bench_config, run_paths.config)
    lock = tmp_path_factory.mktemp("lock") / "host.lock"  # this module's own host lock

    def start(repeat: int, **extra_env) -> subprocess.Popen:
        env = {**os.environ, "BENCHMARK_HOST_LOCK": str(lock), **extra_env}
        env.pop("MLFLOW_TRACKING_URI", None)
        return subprocess.Popen(
            [sys.executable, "-m", "pipelines", "train", "--run-dir", str(run_paths.root), "--backend", "ddp",
             "--workers", "1", "--repeat", str(repeat)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    return start


def _windows(result: CellResult) -> list[tuple[float, float]]:
    return [(a.start, a.end) for a in result.attempts]


def test_two_cells_started_at_once_are_timed_one_after_the_other(cli_run, run_paths):
    first, second = cli_run(5), cli_run(6)
    for proc in (first, second):
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
    a, b = (CellResult.read(run_paths.cell("ddp", 1, r).result) for r in (5, 6))
    wa, wb = a.timed_window, b.timed_window
    assert wa.end <= wb.start or wb.end <= wa.start, (_windows(a), _windows(b))
    assert max(a.timed_window.lock_wait_seconds, b.timed_window.lock_wait_seconds) > 1.0  # one waited
    assert a.devices == b.devices == ["cpu:cores 0"]  # the rank had its own core
    # a seed per repeat: same data and model factory, different initialisation and order
    assert (a.seed, b.seed) == (42 + 5, 42 + 6)
    assert a.epochs[0].train_loss != b.epochs[0].train_loss


# ~90 s; CI: the CLI retry test (tests/run/test_cli.py) and the SIGKILL resume in tests/e2e
@pytest.mark.heavy
def test_a_killed_and_retried_cell_reports_both_attempts(cli_run, run_paths):
    cell = run_paths.cell("ddp", 1, 7)
    proc = cli_run(7, **fault_injection.env(1, PROJECT_ROOT))
    checkpoint = cell.checkpoints / "epoch-0001.pt.sha256"  # the checksum is written last
    deadline = time.time() + 300
    while not checkpoint.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert checkpoint.exists(), proc.stdout.read()[-3000:] if proc.poll() is not None else "no checkpoint"
    time.sleep(1.0)  # lost work: what the held rank did after its checkpoint
    tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI, torchrun and the rank: no word from anyone
    proc.wait()
    psutil.wait_procs([psutil.Process(p) for p in tree if psutil.pid_exists(p)], timeout=30)
    killed_at = time.time()

    retry = cli_run(7)  # what an Airflow retry or `run --run-dir` does
    out, _ = retry.communicate(timeout=600)
    assert retry.returncode == 0, out[-3000:]
    result = CellResult.read(cell.result)
    first, second = result.attempts
    assert first.outcome == "killed" and first.epoch_reached == 1 and first.lost_seconds >= 0
    assert second.outcome == "ok" and second.epoch_reached == 2
    assert 0 < second.recovery_seconds and second.start >= first.end
    assert second.recovery_seconds >= second.start - killed_at  # from the failure to training again
    assert result.total_seconds == pytest.approx(sum(a.end - a.start for a in result.attempts))
    assert result.recovery_seconds == second.recovery_seconds and result.resumed_from_epoch == 1
    # the killed attempt's wall time is a phase of its own; the rest are the second attempt's
    assert result.phases[phases.RETRIES] == pytest.approx(first.end - first.start)
    assert abs(phases.unattributed(result.phases, result.total_seconds)) <= 0.02 * result.total_seconds
