"""Ray Train: the shared loop in ``TorchTrainer(pipelines.platforms.ray.worker.train_loop_per_worker)``.

``ray_address`` empty (default): a local Ray cluster is started for the cell
(``ray.init``: head on 127.0.0.1, no dashboard, ``num_cpus`` = the host's cores, a short
``/tmp/ray-<pid>`` temp folder because Ray's Unix socket paths must stay under ~107
characters) and shut down after it, also when training fails; ``platform_mode="local-cluster"``.
``ray_address="auto"`` / ``ray://host:10001`` / ``host:6379``: the cell joins that cluster
(left running; the run folder must be on storage its nodes see at the same path);
``platform_mode="cluster"``. A cluster with token authentication (Ray turns it on by itself once
~/.ray/auth_token exists) needs its token in the driver's environment: ``RAY_AUTH_MODE=token``
and ``RAY_AUTH_TOKEN_PATH`` (or ``RAY_AUTH_TOKEN``), as Ray's token-auth docs say.
Several hosts driven from here (``run_cell(..., hosts=cluster.hosts)``, e.g. the hosts of
``pipelines.cluster.EmulatedCluster``): ``launch_on_hosts`` builds a Ray cluster on them (head on
hosts[0], ``ray start --address`` on the others), runs the driver on hosts[0] and stops every
node afterwards (``pipelines.platforms.ray.hosts``); ``platform_mode="cluster-<k>-hosts"``.

``ScalingConfig(num_workers=N, use_gpu=<CUDA here>, resources_per_worker={"CPU":
threads_per_worker})``; ``RunConfig(storage_path=<cell>/ray, name=<cell name>)``: Ray's run
(checkpoints reported every epoch, ``pipelines.platforms.ray.worker``) lives in the cell
folder, and a retried cell reuses the run name, so Ray restores the run's latest checkpoint as
well as the loop resuming from ``<cell>/checkpoints``. ``FailureConfig(max_failures=matrix.platform_retries)`` (default 0): a
failure ends the attempt, and the retry is the project's (Airflow / ``TrainingBackend.run``),
like torchrun's ``--max-restarts 0``. Workers get the project's import path and the
``PIPELINES_*`` / Hugging Face settings through ``worker_runtime_env``.

    python -m pipelines train --backend ray --workers 2 --profile smoke
    python -m pipelines train --backend ray --workers 2 --set ray_address=ray://head:10001
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from pathlib import Path

import pipelines
from pydantic import BaseModel, ConfigDict, field_validator

from pipelines.measure import signals
from pipelines.platforms.contract import TrainingBackend
from pipelines.training.cell import CellSpec
from pipelines.config import Backend, BenchmarkConfig, deployment
from pipelines.runfolder.paths import CellPaths, RunPaths
from pipelines.runfolder.results import CellResult

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


def torch_trainer(spec: CellSpec, launch_time: float, runtime_env: dict, placement_strategy: str = "PACK"):
    """The cell's ``TorchTrainer`` (the shared loop in every worker), for an initialised Ray:
    the local cluster, a joined one, or one built on launch hosts (``pipelines.platforms.ray.hosts``)."""
    import torch
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from pipelines.training.checkpoint import KEEP
    from pipelines.platforms.ray.worker import train_loop_per_worker

    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"cell_dir": str(spec.cell_dir), "launch_time": launch_time},
        scaling_config=ScalingConfig(num_workers=spec.world_size, use_gpu=torch.cuda.is_available(),
                                     resources_per_worker={"CPU": spec.config.training.threads_per_worker},
                                     placement_strategy=placement_strategy),
        run_config=RunConfig(
            storage_path=str(spec.cell_dir / "ray"), name=spec.cell_dir.name,
            failure_config=FailureConfig(max_failures=spec.config.matrix.platform_retries),  # Ray's own recovery
            checkpoint_config=CheckpointConfig(num_to_keep=KEEP),  # as many as the loop keeps
            worker_runtime_env=runtime_env),
    )


def fit(trainer, handlers: signals.RaiseOnceHandlers) -> None:
    """``trainer.fit()``; a signal received meanwhile (``handlers``) wins over Ray's own error."""
    try:
        result = trainer.fit()  # raises ray.train.TrainingFailedError when a worker failed
    except BaseException as err:
        raise handlers.terminated() or signals.cause_of(err) or err  # Ray wraps it in a SystemError
    if handlers.terminated():  # Ray swallowed the handler's exception: stop now all the same
        raise handlers.terminated()
    log.info("ray: run %s finished; latest checkpoint %s", result.path,
             result.checkpoint.path if result.checkpoint else None)


class RaySettings(BaseModel):
    """``engines.ray``: None = a local Ray cluster per cell; else the cluster to join."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # "auto" (the cluster this host belongs to), "ray://host:10001" (Ray Client) or "host:6379"
    # (the head's GCS address): join that cluster, which is left running
    address: str | None = deployment(None, env="BENCHMARK_RAY_ADDRESS", flat="ray_address")

    @field_validator("address")
    @classmethod
    def _known_address(cls, v: str | None) -> str | None:
        if v is None or v == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9_.\-]+:\d{1,5}", v):
            return v
        raise ValueError("must be empty (a local Ray cluster started for each cell), 'auto' (the cluster "
                         "this host belongs to), ray://host:port (Ray Client) or host:port (the head's GCS)")


class RayBackend(TrainingBackend):
    name = Backend.RAY
    order = 30
    label = "Ray Train"
    colour = "#7c3aed"
    settings = RaySettings
    mode_caveats = {"local-cluster": "Ray Train on a one-node Ray cluster started for the cell on this host: its "
                                     "start-up includes the cluster's, and there is no network between workers. "
                                     "It measures Ray's own launch and bookkeeping, not a multi-node cluster's."}

    def run(self, config: BenchmarkConfig, world_size: int, *, paths: RunPaths, cell: CellPaths | None = None,
            repeat: int = 0, strategy: str | None = None, hosts: list | None = None) -> CellResult:
        if hosts:  # across hosts: a bad split is refused before anything is written
            from pipelines.platforms.torchrun import host_nproc

            if config.engine("ray").address:
                raise ValueError(f"ray: hosts= builds the cell's own cluster on them; leave "
                                 f"engines.ray.address empty (got {config.engine('ray').address!r})")
            host_nproc(world_size, len(hosts))
        return super().run(config, world_size, paths=paths, cell=cell, repeat=repeat, strategy=strategy,
                           hosts=hosts)

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        import ray

        cfg = spec.config
        self._hosts_by_cell().pop(spec.cell_dir, None)  # this attempt runs on this host
        runtime_env = {"env_vars": worker_env_vars()}
        # ray.init replaces the driver's SIGTERM handler with one that exits at once: the project's
        # (pipelines.measure.signals) is saved here and put back after the cell (restore)
        handlers = signals.RaiseOnceHandlers("Ray's cluster shut down")
        try:  # a half-started cluster is shut down too
            if cfg.engine("ray").address:
                log.info("ray: joining the cluster at %s", cfg.engine("ray").address)
                ray.init(address=cfg.engine("ray").address, runtime_env=runtime_env)
            else:
                options = local_cluster_options(spec.world_size, cfg.training.threads_per_worker)
                log.info("ray: starting a local cluster (%s)", options)
                ray.init(runtime_env=runtime_env, **options)
            # While Ray runs, a signal only raises (once), so the finally below shuts Ray down while
            # its GCS and raylet still run: the project's handler would kill them first, and a
            # driver whose raylet dies while it waits in ray.get exits by itself (code 1) before it
            # can record the failure (seen in CI).
            handlers.raise_once()
            fit(torch_trainer(spec, launch_time, runtime_env), handlers)
        finally:
            self._shutdown(local=not cfg.engine("ray").address)
            handlers.restore()

    def launch_on_hosts(self, spec: CellSpec, launch_time: float, hosts: list) -> None:
        """A Ray cluster built on ``hosts`` (head on hosts[0], one node per host), the driver on
        hosts[0], every node stopped afterwards (``pipelines.platforms.ray.hosts``)."""
        from pipelines.platforms.ray import hosts as ray_hosts

        self._hosts_by_cell()[spec.cell_dir] = len(hosts)
        ray_hosts.launch(spec, launch_time, hosts)

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
            signals.stop_leftovers(started, owner="ray")  # workers poll for their raylet: seconds
            shutil.rmtree(temp_dir, ignore_errors=True)
        log.info("ray: %s in %.1fs", "local cluster stopped" if local else "disconnected",
                 time.perf_counter() - start)

    def cleanup(self) -> list[int]:
        """Ray processes of this driver's own cluster that a failed cell left (``launch``'s
        shutdown stops them; this catches what outlived it)."""
        leftovers = cluster_processes()
        signals.stop_leftovers(leftovers, grace_s=1.0, owner="ray")
        return [p.pid for p in leftovers]

    def versions(self) -> dict[str, str]:
        import ray

        from pipelines.platforms.ray.worker import MODEL_WRAPPER

        return {"ray": ray.__version__, "launcher": "TorchTrainer", "ray_model_wrapper": MODEL_WRAPPER}

    def platform_fields(self, spec: CellSpec) -> dict:
        hosts = self._hosts_by_cell().get(spec.cell_dir)
        if hosts:
            return {"platform_mode": f"cluster-{hosts}-hosts"}
        return {"platform_mode": "cluster" if spec.config.engine("ray").address else "local-cluster"}
