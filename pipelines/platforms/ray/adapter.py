"""Ray Train: the shared loop in ``TorchTrainer(pipelines.platforms.ray.worker.train_loop_per_worker)``.

On this host the cell's driver (``drive``: ``ray.init``, the trainer, ``ray.shutdown``) runs in a
process of its own where its cluster is (``launch``, ``pipelines.platforms.driver``): a per-job
cluster in a network namespace of the cell's own, the run's standing head in the run's.

``ray_address`` empty (default): ``ray`` joins the run's standing Ray cluster
(``standing.py``; ``platform_mode="local-standing"``); ``ray_per_job`` starts a local cluster for
the cell (``ray.init``: head on 127.0.0.1, no dashboard, ``num_cpus`` = the host's cores, a short
``/tmp/ray-<pid>`` temp folder because Ray's Unix socket paths must stay under ~107
characters) and shuts it down after it, also when training fails; ``platform_mode="local-cluster"``.
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
like torchrun's ``--max-restarts 0``. ``engines.ray.elastic_min_workers=M`` (Ray Train V2):
``ScalingConfig(num_workers=(M, N))``, so a lost worker node makes Ray restart the group with the
workers that still fit, from the last reported checkpoint, within the same attempt (the loop
resumes at the smaller world size), and grow it back every ``elastic_resize_interval_s`` once
there is room; the nodes then mark a dead node quickly (``trainer.FAST_NODE_DEATH``). Workers get the project's import path and the
``PIPELINES_*`` / Hugging Face settings through ``worker_runtime_env``.

    python -m pipelines train --backend ray --workers 2 --profile smoke
    python -m pipelines train --backend ray --workers 2 --set ray_address=ray://head:10001
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
import shutil
import time

from pipelines.cluster import netns
from pipelines.measure import signals
from pipelines.platforms import driver
from pipelines.platforms.contract import provisioning
from pipelines.platforms.ray import standing
from pipelines.platforms.ray.logs import job_runtime_env
from pipelines.platforms.ray.trainer import (cluster_processes, driver_env, elastic_refusal, fit,
                                             local_cluster_options, torch_trainer, worker_env_vars)
from pipelines.platforms.contract import TrainingBackend
from pipelines.training.cell import CellSpec
from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import CellPaths, RunPaths
from pipelines.runfolder.results import CellResult

log = logging.getLogger(__name__)


class RayBackend(TrainingBackend):
    name = "ray"

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

    def preflight(self, config: BenchmarkConfig, cells: list[tuple[str, int]]) -> list[str]:
        refusal = elastic_refusal(config, [workers for _, workers in cells])
        return [*([f"{self.name}: {refusal}"] if refusal else []), *super().preflight(config, cells)]

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        """The cell's driver in a process of its own (``pipelines.platforms.driver``), where its
        cluster is: a namespace of the cell's own for a per-job cluster, the run's for the standing
        one (``standing.namespace``), this host's to join ``engines.ray.address``."""
        self._hosts_by_cell().pop(spec.cell_dir, None)  # this attempt runs on this host
        if self._own_cluster(spec.config):
            where = netns.own("the cell's Ray cluster")
        elif spec.config.engine("ray").address:
            where = netns.host()
        else:
            where = standing.namespace(self._standing(spec))
        driver.launch(self, spec, launch_time, where)

    def drive(self, spec: CellSpec, launch_time: float) -> None:
        """In the driver process: ``ray.init`` (the cell's own local cluster, or joining one), the
        cell's ``TorchTrainer``, ``ray.shutdown``."""
        import ray

        cfg = spec.config
        runtime_env = job_runtime_env(worker_env_vars())
        own = self._own_cluster(cfg)
        # ray.init replaces SIGTERM's handler with one that exits at once: the driver process's own
        # (the whole tree, then exit: signals.end_tree_on_signal) is saved here and put back after it
        handlers = signals.RaiseOnceHandlers("Ray's cluster shut down")
        stack = ExitStack()
        try:  # a half-started cluster is shut down too
            if driver_env(cfg):  # Ray Train hands the driver's to its controller
                stack.enter_context(_environ(driver_env(cfg)))
            if own:
                options = local_cluster_options(spec.world_size, cfg.training.threads_per_worker)
                log.info("ray: starting the cell's own local cluster (%s)", options)
                with provisioning(spec.cell):
                    ray.init(runtime_env=runtime_env, **options)
            else:
                options, joined = self._join_options(spec)
                log.info("ray: joining the cluster at %s", options["address"])
                stack.enter_context(_environ(joined))
                ray.init(runtime_env=runtime_env, **options)
            handlers.restore()
            fit(torch_trainer(spec, launch_time, runtime_env), handlers)
        finally:
            self._shutdown(local=own)
            stack.close()
            handlers.restore()

    def _own_cluster(self, config: BenchmarkConfig) -> bool:
        """A cluster of the cell's own (per job), not one to join (the run's standing one, or
        ``engines.ray.address``: someone else's)."""
        return self.lifetime == "per_job"

    def _join_options(self, spec: CellSpec) -> tuple[dict, dict[str, str]]:
        """``ray.init`` options for the cluster a standing cell joins, and the environment its
        driver needs to (the token)."""
        if spec.config.engine("ray").address:
            return {"address": spec.config.engine("ray").address}, {}
        found = self._standing(spec)
        return standing.init_options(found), standing.token_env(found)

    @staticmethod
    def _standing(spec: CellSpec) -> dict:
        found = standing.state(spec.paths)
        if found is None:
            raise RuntimeError("ray: no standing Ray cluster for this run: the runner starts it before a "
                               "standing Ray cell (pipelines.run.services.before_cell)")
        return found

    def launch_on_hosts(self, spec: CellSpec, launch_time: float, hosts: list) -> None:
        """A standing cell: the driver on hosts[0] joins the run's standing cluster on the hosts;
        per job: a Ray cluster of its own on ``hosts`` (head on hosts[0], one node per host), the
        driver on hosts[0], every node stopped afterwards (``pipelines.platforms.ray.hosts``)."""
        from pipelines.platforms.ray import hosts as ray_hosts

        self._hosts_by_cell()[spec.cell_dir] = len(hosts)
        if self.lifetime == "per_job":
            ray_hosts.launch(spec, launch_time, hosts)
            return
        options, joined = self._join_options(spec)
        found = standing.state(spec.paths) or {}
        returns = {host.name: (*again, standing.folder(spec.paths) / f"{host.name}-returned.log")
                   for host in hosts[1:] if (again := standing.node_command(found, spec.config, host.name))}
        ray_hosts.drive_standing(spec, launch_time, hosts, options["address"], joined, found["nodes"], returns)

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

    def versions(self) -> dict[str, str]:
        import ray

        from pipelines.platforms.ray.worker import MODEL_WRAPPER

        return {"ray": ray.__version__, "launcher": "TorchTrainer", "ray_model_wrapper": MODEL_WRAPPER}

    def platform_fields(self, spec: CellSpec) -> dict:
        hosts = self._hosts_by_cell().get(spec.cell_dir)
        if hosts:
            return {"platform_mode": f"cluster-{hosts}-hosts"}
        if spec.config.engine("ray").address:
            return {"platform_mode": "cluster"}
        return {"platform_mode": "local-cluster" if self.lifetime == "per_job" else "local-standing"}


class RayPerJobBackend(RayBackend):
    """Ray Train on a Ray cluster of the cell's own, brought up inside its window (``provision``)."""

    name = "ray_per_job"

    def preflight(self, config: BenchmarkConfig, cells: list[tuple[str, int]]) -> list[str]:
        refusal = ([f"{self.name}: engines.ray.address={config.engine('ray').address!r} is a cluster someone "
                    "keeps standing; a per-job cell starts its own. Leave engines.ray.address empty or leave "
                    f"{self.name} out of backends."] if config.engine("ray").address else [])
        return [*refusal, *super().preflight(config, cells)]


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment for the block (the driver's token to join)."""
    from ray._private.authentication.authentication_token_setup import Config

    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    Config.initialize("")  # Ray caches its settings (the auth mode): read them again
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        Config.initialize("")
