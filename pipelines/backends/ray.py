"""Ray Train: the shared loop in ``TorchTrainer(pipelines.training.ray_worker.train_loop_per_worker)``.

``ray_address`` empty (default): a local Ray cluster is started for the cell
(``ray.init``: head on 127.0.0.1, no dashboard, ``num_cpus`` = the host's cores, a short
``/tmp/ray-<pid>`` temp folder because Ray's Unix socket paths must stay under ~107
characters) and shut down after it, also when training fails; ``platform_mode="local-cluster"``.
``ray_address="auto"`` / ``ray://host:10001`` / ``host:6379``: the cell joins that cluster
(left running; the run folder must be on storage its nodes see at the same path);
``platform_mode="cluster"``.

``ScalingConfig(num_workers=N, use_gpu=<CUDA here>, resources_per_worker={"CPU":
threads_per_worker})``; ``RunConfig(storage_path=<cell>/ray, name=<cell name>)``: Ray's run
(checkpoints reported every epoch, ``pipelines.training.ray_worker``) lives in the cell
folder, and a retried cell reuses the run name, so Ray restores the run's latest checkpoint as
well as the loop resuming from ``<cell>/checkpoints``. ``FailureConfig(max_failures=0)``: a
failure ends the attempt, and the retry is the project's (Airflow / ``TrainingBackend.run``),
like torchrun's ``--max-restarts 0``. Workers get the project's import path and the
``PIPELINES_*`` / Hugging Face settings through ``worker_runtime_env``.

    python -m pipelines train --backend ray --workers 2 --profile smoke
    python -m pipelines train --backend ray --workers 2 --set ray_address=ray://head:10001
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pipelines
from pipelines.backends.base import TrainingBackend
from pipelines.cell import CellSpec
from pipelines.config import Backend
from pipelines.signals import CellTerminated

log = logging.getLogger(__name__)
# Settings of the driver that the workers need too (a remote cluster's workers do not inherit
# the driver's environment; a local one's do, and get the same values).
FORWARDED_ENV_PREFIXES = ("PIPELINES_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")


def project_root() -> str:
    """The folder holding the ``pipelines`` package this driver imported (a worktree's, too)."""
    return str(Path(pipelines.__file__).resolve().parent.parent)


def worker_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the Ray Train workers: this project first on PYTHONPATH, plus the
    forwarded settings (pure: testable without Ray)."""
    environ = dict(os.environ if environ is None else environ)
    path = [project_root(), *(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    out = {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    out.setdefault("TOKENIZERS_PARALLELISM", "false")
    return out


def local_cluster_options(world_size: int, threads: int, pid: int | None = None) -> dict:
    """``ray.init`` keyword arguments for the cell's own local cluster (pure)."""
    return {
        "address": "local",  # always a new cluster: never join one found via RAY_ADDRESS
        "include_dashboard": False,
        "num_cpus": max(os.cpu_count() or 1, world_size * threads),  # N workers must fit
        "_node_ip_address": "127.0.0.1",
        "_temp_dir": f"/tmp/ray-{pid or os.getpid()}",  # short: Unix socket paths max ~107 chars
        "log_to_driver": True,
    }


def signal_that_stopped(err: BaseException) -> CellTerminated | None:
    """The ``CellTerminated`` behind ``err``: raised by the project's signal handler while the
    driver waits in ``ray.get``, it reaches us wrapped in a ``SystemError`` by Ray's C++ core."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, CellTerminated):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class keep_signal_handlers:
    """``ray.init`` replaces the driver's SIGTERM handler with one that exits at once; the
    project's (``pipelines.signals``: take the cell's process tree down, record the signal) is
    put back after it."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.main = threading.current_thread() is threading.main_thread()  # handlers live there
        self.saved = {s: signal.getsignal(s) for s in self.SIGNALS} if self.main else {}
        self.stopped: int | None = None  # the signal received while Ray ran (stop_cleanly)

    def restore(self) -> None:
        for signum, handler in self.saved.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)

    def stop_cleanly(self) -> None:
        """While the cell's Ray session is up, SIGTERM/SIGINT only raise ``CellTerminated``
        (once; the signal is remembered), so ``launch``'s ``finally`` shuts Ray down while its
        GCS and raylet still run. The project's handler kills the cell's processes first; a Ray
        driver whose raylet dies while it waits in ``ray.get`` exits by itself (code 1) before it
        can record the failure (seen in CI). ``restore`` puts the project's handlers back."""
        if not self.main:
            return

        def handler(signum, frame):
            first = self.stopped is None
            self.stopped = self.stopped or signum
            if first:
                raise CellTerminated(signum, "Ray's cluster shut down")

        for s in self.SIGNALS:
            signal.signal(s, handler)

    def terminated(self) -> CellTerminated | None:
        """The signal that stopped the cell, also when Ray swallowed the handler's exception."""
        return None if self.stopped is None else CellTerminated(self.stopped, "Ray's cluster shut down")


def is_ray_process(cmdline: list[str]) -> bool:
    """Ray's binaries and workers run from the ray package (``.../ray/raylet/raylet``,
    ``.../ray/_private/workers/default_worker.py``); actors rename themselves ``ray::<name>``."""
    text = " ".join(cmdline)
    return "/ray/" in text or text.startswith("ray::")


def cluster_processes() -> list:
    """The local cluster's processes: this driver's descendants that are Ray's (GCS, raylet, the
    workers and actors the raylet started), never anything else the driver's process started."""
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if is_ray_process(proc.cmdline()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def stop_leftovers(processes: list, grace_s: float = 5.0) -> list:
    """After ``ray.shutdown()``: give the cluster's processes ``grace_s`` to exit (workers notice
    their raylet is gone by polling, seconds on a loaded host), then SIGKILL the rest, so no Ray
    process outlives its cell. Returns the processes that had to be killed."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5.0)
    if alive:
        log.warning("ray: %d process(es) still running %.0f s after shutdown were killed", len(alive), grace_s)
    return alive


class RayBackend(TrainingBackend):
    name = Backend.RAY

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        import ray
        import torch
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from pipelines.training.checkpoint import KEEP
        from pipelines.training.ray_worker import train_loop_per_worker

        cfg = spec.config
        runtime_env = {"env_vars": worker_env_vars()}
        handlers = keep_signal_handlers()
        try:  # a half-started cluster is shut down too
            if cfg.ray_address:
                log.info("ray: joining the cluster at %s", cfg.ray_address)
                ray.init(address=cfg.ray_address, runtime_env=runtime_env)
            else:
                options = local_cluster_options(spec.world_size, cfg.threads_per_worker)
                log.info("ray: starting a local cluster (%s)", options)
                ray.init(runtime_env=runtime_env, **options)
            handlers.stop_cleanly()
            trainer = TorchTrainer(
                train_loop_per_worker,
                train_loop_config={"cell_dir": str(spec.cell_dir), "launch_time": launch_time},
                scaling_config=ScalingConfig(num_workers=spec.world_size, use_gpu=torch.cuda.is_available(),
                                             resources_per_worker={"CPU": cfg.threads_per_worker}),
                run_config=RunConfig(
                    storage_path=str(spec.cell_dir / "ray"), name=spec.cell_dir.name,
                    failure_config=FailureConfig(max_failures=0),
                    checkpoint_config=CheckpointConfig(num_to_keep=KEEP),  # as many as the loop keeps
                    worker_runtime_env=runtime_env),
            )
            try:
                result = trainer.fit()  # raises ray.train.TrainingFailedError when a worker failed
            except BaseException as err:
                raise handlers.terminated() or signal_that_stopped(err) or err
            if handlers.terminated():  # Ray swallowed the handler's exception: stop now all the same
                raise handlers.terminated()
            log.info("ray: run %s finished; latest checkpoint %s", result.path,
                     result.checkpoint.path if result.checkpoint else None)
        finally:
            self._shutdown(local=not cfg.ray_address)
            handlers.restore()

    @staticmethod
    def _shutdown(local: bool) -> None:
        """Disconnect; for the cell's own cluster this stops its processes (raylet, GCS,
        workers) and removes its temp folder."""
        import ray

        start = time.perf_counter()
        temp_dir = local_cluster_options(1, 1)["_temp_dir"]
        started = cluster_processes() if local else []
        ray.shutdown()
        if local:
            stop_leftovers(started)
            shutil.rmtree(temp_dir, ignore_errors=True)
        log.info("ray: %s in %.1fs", "local cluster stopped" if local else "disconnected",
                 time.perf_counter() - start)

    def versions(self) -> dict[str, str]:
        import ray

        from pipelines.training.ray_worker import MODEL_WRAPPER

        return {"ray": ray.__version__, "launcher": "TorchTrainer", "ray_model_wrapper": MODEL_WRAPPER}

    def platform_fields(self, spec: CellSpec) -> dict:
        return {"platform_mode": "cluster" if spec.config.ray_address else "local-cluster"}
