"""Every backend really trains (torchrun, TorchDistributor, Determined) at world size 1 and 2
on CPU, on a 256/128-review slice of the real IMDB data; each cell trains once per session."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from pipelines.measure.listeners import LOOPBACK_ONLY_NAMESPACE
from pipelines.platforms import torchrun as launch
from pipelines.cluster import netns
from pipelines.run.cells import run_cell
from pipelines.platforms.ddp.adapter import DDPBackend
from pipelines.runfolder.paths import CellPaths
from pipelines.runfolder.results import CellResult
from pipelines.runfolder.paths import PROJECT_ROOT
from pipelines.training import phases
from tests import fault_injection

pytestmark = pytest.mark.slow  # every test trains (or reads a cell trained here)

# spark and determined at 1 worker are heavy (scripts/test.sh leaves them out): their 2-worker cells
# cover the same paths; ddp at 1 worker is every comparison's reference and always trains
WORKERS = [pytest.param(1, marks=pytest.mark.heavy), 2]
CELLS = [pytest.param(b, w, marks=pytest.mark.heavy) if w == 1 and b != "ddp" else (b, w)
         for b in ("ddp", "spark", "determined") for w in (1, 2)]


@pytest.mark.parametrize("backend,workers", CELLS)
def test_backend_returns_a_complete_result(trained, run_paths, bench_config, backend, workers):
    result = trained(backend, workers)
    assert result.status == "ok" and result.error is None
    assert result.backend == backend and result.world_size == workers
    assert [e.epoch for e in result.epochs] == [1, 2]
    assert all(0 < e.train_loss < 5 and 0 <= e.eval_accuracy <= 1 for e in result.epochs)
    assert result.test is not None and sum(map(sum, result.test.confusion_matrix)) == 128
    assert result.test_samples == 128 and result.train_samples == 256
    for field in ("startup_seconds", "training_seconds", "evaluation_seconds", "total_seconds",
                  "samples_per_second", "peak_memory_mb"):
        assert getattr(result, field) > 0, field
    assert result.total_seconds > result.startup_seconds + result.training_seconds
    assert result.model_source == "random_init" and result.device == "cpu"
    assert {"torch", "transformers"} <= set(result.versions)
    # how the platform ran, so a local mode is never read as a cluster's overhead
    assert result.platform_mode == {"ddp": "torchrun", "spark": "local", "determined": "local"}[backend]
    # where the time goes: one definition for every backend, adding up to the wall time
    assert tuple(result.phases) == phases.PHASES and min(result.phases.values()) >= 0
    assert result.phases["launch"] == pytest.approx(result.startup_seconds)
    assert abs(phases.unattributed(result.phases, result.total_seconds)) <= 0.02 * result.total_seconds
    train_parts = sum(result.phases[p] for p in ("data", "compute", "communication"))
    assert train_parts == pytest.approx(result.training_seconds, rel=1e-6)
    assert result.phases["data"] > 0 and result.phases["compute"] > 0
    assert (result.phases["communication"] > 0) == (workers > 1)  # the gradient all-reduce, timed
    on_disk = CellResult.read(run_paths.cell(backend, workers, 0).result)
    assert on_disk == result


@pytest.mark.parametrize("workers", WORKERS)
def test_ddp_and_spark_run_the_same_training(trained, workers):
    a, b = trained("ddp", workers), trained("spark", workers)
    for ea, eb in zip(a.epochs, b.epochs, strict=True):
        assert ea.train_loss == pytest.approx(eb.train_loss, abs=1e-6)
        assert ea.eval_loss == pytest.approx(eb.eval_loss, abs=1e-6)
    assert a.test.confusion_matrix == b.test.confusion_matrix


@pytest.mark.parametrize("workers", WORKERS)
def test_determined_matches_ddp_within_tolerance(trained, workers):
    a, d = trained("ddp", workers), trained("determined", workers)
    for ea, ed in zip(a.epochs, d.epochs, strict=True):
        assert ed.train_loss == pytest.approx(ea.train_loss, abs=1e-3)
        assert ed.eval_loss == pytest.approx(ea.eval_loss, abs=1e-3)


def test_world_sizes_differ_in_batches_not_in_data(trained):
    one, two = trained("ddp", 1), trained("ddp", 2)
    assert one.epochs[0].train_loss != two.epochs[0].train_loss  # global batch 16 vs 32
    assert one.test_samples == two.test_samples


def test_ddp_killed_after_epoch_1_resumes_at_epoch_2_with_same_result(trained, bench_config, run_paths):
    cell = CellPaths(run_paths.cells / "ddp-w1-killed")
    DDPBackend().spec(bench_config, 1, run_paths, cell, 0).write()
    cmd = launch.worker_command(bench_config, 1, cell.root, time.time())
    env = {**launch.launch_env(bench_config, os.environ), **fault_injection.env(1, PROJECT_ROOT)}
    proc = subprocess.Popen(cmd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = cell.checkpoints / "epoch-0001.pt.sha256"  # written after the checkpoint: it is complete
    try:
        deadline = time.time() + 120
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert first.exists(), "no epoch-1 checkpoint appeared"
    finally:
        # torchrun's workers live in their own process group: kill the whole tree by pid.
        children = psutil.Process(proc.pid).children(recursive=True)
        for p in [proc, *children]:
            p.send_signal(signal.SIGKILL)
        proc.wait()
        _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"processes survived SIGKILL: {alive}"
    assert not cell.worker_result.exists()

    resumed = DDPBackend().run(bench_config, 1, paths=run_paths, cell=cell)
    reference = trained("ddp", 1)
    assert resumed.resumed_from_epoch == 1
    assert [e.epoch for e in resumed.epochs] == [1, 2]
    assert resumed.epochs[0].train_loss == reference.epochs[0].train_loss
    assert resumed.epochs[1].train_loss == pytest.approx(reference.epochs[1].train_loss, abs=1e-6)
    assert resumed.test.loss == pytest.approx(reference.test.loss, abs=1e-6)
    # the phases cover this attempt only (the killed run was started outside the adapter): its
    # training phase is epoch 2's, and they still add up to the cell's wall time
    assert phases.RETRIES not in resumed.phases and len(resumed.attempts) == 1
    train_parts = sum(resumed.phases[p] for p in ("data", "compute", "communication"))
    assert train_parts == pytest.approx(resumed.epochs[1].train_seconds, rel=1e-6)
    assert abs(phases.unattributed(resumed.phases, resumed.total_seconds)) <= 0.02 * resumed.total_seconds


def test_failed_cell_leaves_a_failed_result(bench_config, run_paths, tmp_path):
    from pipelines.runfolder.paths import RunPaths

    empty = RunPaths(tmp_path / "no-tokens")
    empty.snapshot.mkdir(parents=True)
    empty.manifest.write_text(run_paths.manifest.read_text())  # a task, but no token shards
    with pytest.raises(RuntimeError, match="torchrun exited"):
        run_cell(bench_config, empty, "ddp", 1, 0)
    failed = CellResult.read(empty.cell("ddp", 1, 0).result)
    assert failed.status == "failed" and "no token shards" in failed.error


def test_a_truncated_checkpoint_is_moved_aside_and_training_resumes_from_the_previous(
        trained, bench_config, run_paths):
    import shutil

    source = run_paths.cell("ddp", 1, 0)
    cell = CellPaths(run_paths.cells / "ddp-w1-damaged")
    shutil.copytree(source.checkpoints, cell.checkpoints)  # epochs 1 and 2 of a finished cell
    newest = cell.checkpoints / "epoch-0002.pt"
    newest.write_bytes(newest.read_bytes()[:4096])
    result = DDPBackend().run(bench_config, 1, paths=run_paths, cell=cell)
    reference = trained("ddp", 1)
    assert result.resumed_from_epoch == 1  # not 2 (damaged), not 0 (start over)
    assert result.epochs[1].train_loss == pytest.approx(reference.epochs[1].train_loss, abs=1e-6)
    assert list(cell.checkpoints.glob("epoch-0002.pt.corrupt-*"))
    assert "moved aside" in cell.log.read_text()


@pytest.mark.parametrize("backend", ["ddp", "determined"])
def test_every_cell_writes_tensorboard_events(trained, run_paths, backend):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = trained(backend, 2)
    events = EventAccumulator(str(run_paths.cell(backend, 2, 0).tensorboard))
    events.Reload()  # tensorboard's own reader
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/accuracy", "eval/loss", "eval/accuracy", "train/learning_rate",
            "throughput/samples_per_second", "test/accuracy", "phases/communication_seconds"} <= tags

    def series(tag):
        return [(s.step, s.value) for s in events.Scalars(tag)]

    assert series("train/loss") == [(e.epoch, pytest.approx(e.train_loss, rel=1e-6)) for e in result.epochs]
    assert series("train/learning_rate") == [(e.epoch, pytest.approx(e.learning_rate, rel=1e-6))
                                             for e in result.epochs]
    assert result.epochs[-1].learning_rate < result.epochs[0].learning_rate  # linear decay after warm-up
    assert series("phases/launch_seconds") == [(2, pytest.approx(result.phases["launch"], rel=1e-6))]


@pytest.mark.skipif(netns.own_problem() is not None, reason="no private network namespace here (unshare refused)")
@pytest.mark.parametrize("backend", ["ddp", "spark", "determined"])
def test_a_one_host_cells_ranks_listen_only_in_its_own_namespace(trained, backend):
    """torchrun (for Spark: TorchDistributor's local mode) and the ranks run in the cell's own network
    namespace, loopback only: every port they listened on, seen by the resource sampler, is there."""
    listening = trained(backend, 2).resources.listening
    ranks = {kind: addresses for kind, addresses in listening.items() if kind in ("torchrun", "rank")}
    assert ranks, listening  # the store and gloo were seen: the check is not blind
    assert all(a.endswith(LOOPBACK_ONLY_NAMESPACE) for addresses in ranks.values() for a in addresses), ranks
