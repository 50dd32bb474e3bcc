"""Ray Train (``pipelines.platforms.ray.adapter``) on a real local Ray cluster started for each cell:
the same loop as DDP at world size 1 and 2, a complete result, checkpoints in Ray's run,
resume after a kill, and no Ray process left behind (also after a failed cell)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pipelines.run.cells import run_cell
from pipelines.platforms.ray.adapter import RayBackend, RayPerJobBackend
from pipelines.platforms.ray.trainer import is_ray_process, local_cluster_options, worker_env_vars
from pipelines.config import ConfigError, load_config
from pipelines.runfolder.paths import PROJECT_ROOT, CellPaths, RunPaths
from pipelines.runfolder.results import CellResult
from pipelines.measure.signals import stop_leftovers
from tests import fault_injection

# node daemons (raylet, gcs_server), workers and actors (their titles start "ray::"), and the
# Python helpers of a node (log monitor, runtime-env agent, ...: scripts under site-packages/ray/)
RAY_PROCESS_MARKERS = ("raylet", "gcs_server", "ray::", "site-packages/ray/")


def ray_processes() -> set[tuple[int, str]]:
    """Live (not zombie) Ray processes on this host: in this PID namespace, not a container's (a compose
    stack's Ray cluster running on the same machine is not a leftover of the cell)."""
    found, ours = set(), os.readlink("/proc/self/ns/pid")
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or os.readlink(f"/proc/{proc.pid}/ns/pid") != ours:
                continue
            text = " ".join([proc.info["name"] or "", *(proc.info["cmdline"] or [])])
            if any(marker in text for marker in RAY_PROCESS_MARKERS):
                found.add((proc.info["pid"], text[:120]))
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
    return found


def assert_no_new_ray_processes(before: set[tuple[int, str]], timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while (left := ray_processes() - before) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, f"Ray processes survived the cell: {sorted(left)}"


@pytest.fixture(scope="module")
def ray_cells(trained):
    """``ray_cells(workers)`` -> the ray cell's result; after each, no Ray process is left."""
    def _get(workers: int) -> CellResult:
        before = ray_processes()
        result = trained("ray_per_job", workers)
        assert_no_new_ray_processes(before)
        return result

    return _get


@pytest.mark.slow
@pytest.mark.parametrize("workers", [pytest.param(1, marks=pytest.mark.heavy), 2])  # 1 worker: heavy (CI under 45 min; 2 covers the path)
def test_ray_cell_returns_a_complete_result(ray_cells, run_paths, workers):
    result = ray_cells(workers)
    assert result.status == "ok" and result.error is None
    assert result.backend == "ray_per_job" and result.world_size == workers
    assert result.platform_mode == "local-cluster"
    assert result.versions["launcher"] == "TorchTrainer" and result.versions["ray"] == "2.60.0"
    assert result.versions["ray_model_wrapper"] == "project-ddp"
    assert [e.epoch for e in result.epochs] == [1, 2]
    assert len(result.devices) == workers and len(result.placements) == workers
    assert all(d.startswith("cpu") for d in result.devices)
    assert result.test is not None and sum(map(sum, result.test.confusion_matrix)) == 128
    for field in ("startup_seconds", "training_seconds", "evaluation_seconds", "total_seconds"):
        assert getattr(result, field) > 0, field
    assert CellResult.read(run_paths.cell("ray_per_job", workers, 0).result) == result
    # every epoch's checkpoint went through Ray's checkpoint API into the cell folder
    ray_run = run_paths.cell("ray_per_job", workers, 0).root / "ray" / f"ray_per_job-w{workers}-r0"
    assert sorted(p.name for p in ray_run.glob("epoch-*")) == ["epoch-0001", "epoch-0002"]
    assert (ray_run / "epoch-0002" / "epoch-0002.pt").stat().st_nlink >= 2  # a hard link, no copy
    # no failure-looking noise in a cell that succeeded (pipelines/platforms/ray/logs.py)
    log_text = run_paths.cell("ray_per_job", workers, 0).log.read_text()
    assert "Failed to query Ray Train Controller actor state" not in log_text


@pytest.mark.slow
@pytest.mark.parametrize("workers", [pytest.param(1, marks=pytest.mark.heavy), 2])  # 1 worker: heavy (CI under 45 min; 2 covers the path)
def test_ray_runs_the_same_training_as_ddp(ray_cells, trained, workers):
    ray, ddp = ray_cells(workers), trained("ddp", workers)
    for er, ed in zip(ray.epochs, ddp.epochs, strict=True):
        assert er.train_loss == pytest.approx(ed.train_loss, abs=1e-6)
        assert er.eval_loss == pytest.approx(ed.eval_loss, abs=1e-6)
    assert ray.test.confusion_matrix == ddp.test.confusion_matrix


@pytest.mark.slow
def test_failed_ray_cell_leaves_a_failed_result_and_no_ray_process(bench_config, run_paths, tmp_path):
    empty = RunPaths(tmp_path / "no-tokens")
    empty.snapshot.mkdir(parents=True)
    empty.manifest.write_text(run_paths.manifest.read_text())  # a task, but no token shards
    before = ray_processes()
    with pytest.raises(Exception, match="no token shards"):
        run_cell(bench_config, empty, "ray_per_job", 2, 0)
    failed = CellResult.read(empty.cell("ray_per_job", 2, 0).result)
    assert failed.status == "failed" and "no token shards" in failed.error
    assert_no_new_ray_processes(before)


def test_a_bad_ray_address_is_refused_with_the_allowed_forms():
    with pytest.raises(ConfigError, match=r"engines.ray.address \(flat name: ray_address\): .*ray://host:port"):
        load_config("smoke", {"ray_address": "http://head:8265"})
    assert load_config("smoke", {"ray_address": "ray://head:10001"}).engines.ray.address == "ray://head:10001"


def test_leftover_ray_processes_are_killed_and_nothing_else_is_touched():
    assert is_ray_process(["/venv/lib/python3.12/site-packages/ray/core/src/ray/raylet/raylet", "--node"])
    assert is_ray_process(["ray::RayTrainWorker.__execute"])
    assert not is_ray_process(["java", "-cp", "/venv/pyspark/jars/*", "org.apache.spark.deploy.worker.Worker"])
    # a process that ignores SIGTERM-style shutdown stands for a worker that missed its raylet's exit
    stuck = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    try:
        killed = stop_leftovers([psutil.Process(stuck.pid)], grace_s=0.5)
        assert [p.pid for p in killed] == [stuck.pid]
        assert stuck.wait(timeout=10) is not None and not psutil.pid_exists(stuck.pid)  # reaped: gone
    finally:
        if stuck.poll() is None:
            stuck.kill()


def test_cluster_options_and_worker_environment():
    options = local_cluster_options(world_size=2, threads=1)
    assert options["include_dashboard"] is False and options["_node_ip_address"] == "127.0.0.1"
    assert len(options["_temp_dir"]) < 30 and options["num_cpus"] >= 2  # Ray's socket paths
    env = worker_env_vars({"PYTHONPATH": "/elsewhere", "PIPELINES_EPOCH_END_HOOK": "m:f", "SECRET": "x"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PROJECT_ROOT), "/elsewhere"]
    assert env["PIPELINES_EPOCH_END_HOOK"] == "m:f" and "SECRET" not in env


@pytest.mark.slow
@pytest.mark.heavy  # 71 s in CI: ddp's killed-and-resumed cell covers the loop's resume there; Ray's restore: here
def test_ray_cell_killed_after_epoch_1_resumes_from_rays_checkpoint(ray_cells, trained, bench_config,
                                                                   run_paths, tmp_path):
    """Kill the driver's whole process tree (Ray cluster included) after epoch 1's checkpoint
    was reported to Ray, drop the loop's own checkpoint folder, retry: the retry's Ray run
    restores its latest checkpoint, the loop resumes at epoch 2 and ends where an
    uninterrupted cell ends."""
    from pipelines.config import save_config

    reference = ray_cells(1)
    cell = CellPaths(run_paths.cells / "ray-w1-killed")
    save_config(bench_config, tmp_path / "config.json")
    driver = (f"from pathlib import Path\nfrom pipelines.platforms.ray.adapter import RayPerJobBackend\n"
              f"from pipelines.config import read_config\nfrom pipelines.runfolder.paths import CellPaths, RunPaths\n"
              f"RayPerJobBackend().run(read_config(Path({str(tmp_path / 'config.json')!r})), 1, "
              f"paths=RunPaths(Path({str(run_paths.root)!r})), cell=CellPaths(Path({str(cell.root)!r})))\n")
    import shutil
    import tempfile

    from pipelines.runfolder.scratch import SCRATCH_ROOT_ENV

    before = ray_processes()
    scratch_root = tempfile.mkdtemp(prefix="rk")  # short (Ray's sockets); the killed driver cannot remove its scratch
    proc = subprocess.Popen([sys.executable, "-c", driver], env={**os.environ, **fault_injection.env(1, PROJECT_ROOT),
                                                                 SCRATCH_ROOT_ENV: scratch_root},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Ray's controller registers a reported checkpoint in its run snapshot, which a new run of
    # the same name loads (ray.train.get_checkpoint)
    snapshot = cell.root / "ray" / cell.name / "checkpoint_manager_snapshot.json"

    def registered() -> bool:
        return snapshot.exists() and "epoch-0001" in snapshot.read_text()

    try:
        deadline = time.time() + 240
        while not registered() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert registered(), "epoch 1's checkpoint never reached Ray's run snapshot"
    finally:
        tree = [proc, *psutil.Process(proc.pid).children(recursive=True)]
        for p in tree:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        proc.wait()
    assert_no_new_ray_processes(before)
    shutil.rmtree(scratch_root, ignore_errors=True)  # the killed driver's Ray temp folder
    assert not cell.worker_result.exists()
    shutil.rmtree(cell.checkpoints)  # only Ray's copy is left

    resumed = RayPerJobBackend().run(bench_config, 1, paths=run_paths, cell=cell)
    assert resumed.resumed_from_epoch == 1
    assert "restored from Ray's checkpoint" in cell.log.read_text()
    assert [e.epoch for e in resumed.epochs] == [1, 2]
    assert resumed.epochs[0].train_loss == reference.epochs[0].train_loss
    assert resumed.epochs[1].train_loss == pytest.approx(reference.epochs[1].train_loss, abs=1e-6)
    assert resumed.test.loss == pytest.approx(reference.test.loss, abs=1e-6)
    assert resumed.attempts[-1].outcome == "ok" and len(resumed.attempts) == 2
    assert_no_new_ray_processes(before)


@pytest.mark.slow
@pytest.mark.heavy
def test_ray_address_joins_an_existing_cluster_and_leaves_it_running(trained, bench_config, run_paths,
                                                                     tmp_path, monkeypatch):
    """A head started outside the cell (``ray start --head --block``, on loopback) is joined
    with ``ray_address=host:port``; the cell trains there like a local cluster's and the head
    survives the cell, until its owner stops it. The cluster uses token authentication with a
    token of its own, which the driver's deployment gives it (``RAY_AUTH_MODE`` /
    ``RAY_AUTH_TOKEN_PATH``): left unset, the head turns token auth on by itself whenever
    ~/.ray/auth_token exists (any local ``ray.init`` writes one) and refuses the driver."""
    import secrets
    import shutil
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp_dir = f"/tmp/rayhead-{os.getpid()}"
    token = tmp_path / "ray-token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    for key, value in auth.items():  # the driver: this process
        monkeypatch.setenv(key, value)
    before = ray_processes()
    head = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--block",
         f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
         f"--temp-dir={temp_dir}"],
        env={**os.environ, **auth, "PYTHONPATH": str(PROJECT_ROOT), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        config = bench_config.model_copy(update={"ray_address": f"127.0.0.1:{port}"})
        cell = CellPaths(run_paths.cells / "ray-w2-joined")
        deadline = time.time() + 120
        while head.poll() is None and time.time() < deadline:  # the head's GCS accepts drivers
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        time.sleep(3)  # the head's raylet registers shortly after its GCS listens
        result = RayBackend().run(config, 2, paths=run_paths, cell=cell)
        assert result.status == "ok" and result.platform_mode == "cluster"
        reference = trained("ddp", 2)
        for er, ed in zip(result.epochs, reference.epochs, strict=True):
            assert er.train_loss == pytest.approx(ed.train_loss, abs=1e-6)
        assert head.poll() is None, "the cell stopped a cluster it only joined"
    finally:
        head.terminate()
        head.wait(60)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert_no_new_ray_processes(before, timeout=60)


def test_the_cleaners_benign_warning_is_dropped_and_nothing_else():
    import logging

    from pipelines.platforms.ray.logs import CLEANER_LOGGER, SETUP_HOOK, job_runtime_env, quiet_ray_internals

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger, handler = logging.getLogger(CLEANER_LOGGER), Keep()
    logger.addHandler(handler)
    try:
        quiet_ray_internals()
        quiet_ray_internals()  # once per process is enough; twice adds no second filter
        logger.warning("Failed to query Ray Train Controller actor state. State API may be temporarily "
                       "unavailable. Continuing to monitor.")
        logger.warning("Detected that the Ray Train controller actor (x) is dead. Cleaning up placement group")
    finally:
        logger.removeHandler(handler)
    assert records == ["Detected that the Ray Train controller actor (x) is dead. Cleaning up placement group"]
    assert len(logger.filters) == 1
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    # the hook as Ray's ray.init would export it, so a Ray Client driver's workers run it too
    assert job_runtime_env({"A": "1"}) == {"env_vars": {"A": "1", WORKER_PROCESS_SETUP_HOOK_ENV_VAR: SETUP_HOOK},
                                           "worker_process_setup_hook": SETUP_HOOK}
