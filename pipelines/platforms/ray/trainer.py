"""What a Ray Train cell needs wherever its driver runs (this host, or hosts[0] of a cluster built
on the run's hosts, ``hosts.py``): the workers' environment, the cell's ``TorchTrainer`` over
the shared loop (``worker.py``), and ``fit`` with signals winning over Ray's own error.
"""

from __future__ import annotations

import atexit
import logging
import os
from pathlib import Path

from pipelines.measure import signals
from pipelines.runfolder.paths import PROJECT_ROOT
from pipelines.runfolder.scratch import check_scratch, make_scratch, remove_scratch
from pipelines.training.cell import CellSpec

log = logging.getLogger(__name__)
# Settings of the driver that the workers need too (a remote cluster's workers do not inherit
# the driver's environment; a local one's do, and get the same values).
FORWARDED_ENV_PREFIXES = ("PIPELINES_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
V2_ENABLED_ENV = "RAY_TRAIN_V2_ENABLED"  # Ray Train V2 (the default since Ray 2.5x); "0" = V1


def worker_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the Ray Train workers: this project first on PYTHONPATH, plus the
    forwarded settings (pure: testable without Ray)."""
    environ = dict(os.environ if environ is None else environ)
    path = [str(PROJECT_ROOT), *(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    out = {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    out.setdefault("TOKENIZERS_PARALLELISM", "false")
    return out


# Ray's temp folder inside a private scratch folder: Ray makes its temp folder 0777 and reuses one
# that exists (ray._common.utils.try_to_create_directory); the scratch (0700, made by mkdtemp) around
# it keeps everyone else out. /tmp/bm-<purpose>-XXXXXXXX/ray: short enough for Ray's Unix sockets.
RAY_DIR = "ray"
_own_scratch: dict[int, Path] = {}  # per process id: a forked child makes its own


def ray_temp_dir(scratch: str | Path) -> str:
    return str(Path(scratch) / RAY_DIR)


def own_scratch() -> Path:
    """This process's private scratch folder for its own local cluster: made at first use, the same
    one until it is removed or can no longer be trusted, then a new one."""
    scratch = _own_scratch.get(os.getpid())
    if scratch is not None:
        try:
            return check_scratch(scratch)
        except FileNotFoundError:
            pass
        except PermissionError as err:  # replaced meanwhile: never use it again
            log.warning("ray: %s; using a new one", err)
    scratch = _own_scratch[os.getpid()] = make_scratch("ray")
    # the cluster's shutdown removes Ray's folder inside it; the scratch itself goes with this process
    atexit.register(remove_scratch, scratch)
    return scratch


def local_cluster_options(world_size: int, threads: int) -> dict:
    """``ray.init`` keyword arguments for the cell's own local cluster: its temp folder in this
    process's scratch folder (``own_scratch``: the same on every call until it is removed)."""
    return {
        "address": "local",  # always a new cluster: never join one found via RAY_ADDRESS
        "include_dashboard": False,
        "num_cpus": max(os.cpu_count() or 1, world_size * threads),  # N workers must fit
        "_node_ip_address": "127.0.0.1",
        "_temp_dir": ray_temp_dir(own_scratch()),
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


def scaling_options(spec: CellSpec) -> dict:
    """``ScalingConfig`` size keywords (pure): N workers fixed, or (``engines.ray.elastic_min_workers``)
    Ray Train V2's elastic group of min..N workers, checked for room to grow every
    ``elastic_resize_interval_s``."""
    settings = spec.config.engine("ray")
    if settings.elastic_min_workers is None:
        return {"num_workers": spec.world_size}
    return {"num_workers": (min(settings.elastic_min_workers, spec.world_size), spec.world_size),
            "elastic_resize_monitor_interval_s": settings.elastic_resize_interval_s}


# Losing a node, Ray Train's controller restarts the group within a second of a rank's failure,
# before the GCS knows the node is gone: it asks for the old size once, and that placement group
# cannot be placed. Ray waits WORKER_GROUP_START_TIMEOUT_S for it (only the resource reservation, not
# the workers' start; default 60 s: 78 s from the loss to training again, measured; 10 s: 26-30 s),
# then retries with the workers the cluster has room for, which the GCS must know by then: the
# nodes of an elastic cell mark a node dead after 3 missed checks 1 s apart (Ray's default: 5 x 3 s).
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
WORKER_GROUP_START_ENV = {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}


def driver_env(config) -> dict[str, str]:
    """The driver's environment for this cell (Ray Train hands it to its controller): the short
    placement wait when the group is elastic (``WORKER_GROUP_START_ENV``), else nothing."""
    return dict(WORKER_GROUP_START_ENV) if config.engine("ray").elastic_min_workers is not None else {}


def node_env(config) -> dict[str, str]:
    """What the cluster's nodes (the head's GCS above all) get for this run: the quick node-death
    detection when the group is elastic (``FAST_NODE_DEATH``), else nothing (Ray's defaults)."""
    return dict(FAST_NODE_DEATH) if config.engine("ray").elastic_min_workers is not None else {}


def elastic_refusal(config, worker_counts) -> str | None:
    """Why ``engines.ray.elastic_min_workers`` cannot work for this run, naming the fields; None if fine."""
    minimum = config.engine("ray").elastic_min_workers
    if minimum is None:
        return None
    if os.environ.get(V2_ENABLED_ENV, "1").strip().lower() in ("0", "false"):
        return (f"engines.ray.elastic_min_workers={minimum} needs Ray Train V2 (elastic num_workers=(min, max)); "
                f"this environment sets {V2_ENABLED_ENV}={os.environ[V2_ENABLED_ENV]}")
    if config.matrix.platform_retries < 1:
        return (f"engines.ray.elastic_min_workers={minimum} needs matrix.platform_retries (flat name: "
                "platform_retries) >= 1: Ray restarts a smaller worker group only as a recovered failure "
                "(FailureConfig(max_failures)); got 0")
    small = sorted({w for w in worker_counts if w < minimum})
    if small:
        return (f"engines.ray.elastic_min_workers={minimum} is more than the {small} worker(s) of some cells "
                "(matrix.worker_counts): lower it or leave those counts out")
    return None


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
        scaling_config=ScalingConfig(**scaling_options(spec), use_gpu=torch.cuda.is_available(),
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
