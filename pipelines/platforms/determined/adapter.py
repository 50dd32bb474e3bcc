"""Determined AI: the benchmark trial (``pipelines.platforms.determined.trial``) under Determined's loop.

No master (default): ``det.pytorch.Trainer`` in local mode, one process per rank started by
torchrun (``pipelines.platforms.torchrun``, the DDP backend's launcher too), so both see identical start-up.
With ``determined_master`` set: the same run is submitted as an experiment through the SDK
(``determined.experimental.client.create_experiment``) with the config from
``experiment_config``; the run folder must then be on storage the agents mount at the same
path, since rank 0 writes the result file there. ``validate_experiment_config`` checks the
generated config with what the determined 0.37 package ships (its YAML loader and its
``ExperimentConfig`` accessors); the master validates the full schema, and the tests check the
config against Determined's own expconf schema (tests/platforms/determined/test_determined_schema.py).

Several hosts driven from this process (``run_cell(..., hosts=cluster.hosts)``: the hosts of
``pipelines.cluster.EmulatedCluster`` or ``pipelines.cluster.ssh.ssh_hosts``): the local Trainer
under the same multi-node torchrun as the DDP backend (``pipelines.platforms.torchrun``: one torchrun per
host, node rank = host index, static rendezvous on host 0, gloo on the hosts' ``eth0``).
Determined's local mode works across nodes once its ``DistributedContext`` knows the chief:
``from_torch_distributed`` takes the ranks from torchrun's environment (``GROUP_RANK`` /
``GROUP_WORLD_SIZE`` = cross rank / size) and, with more than one node, needs the chief's
address (``DET_CHIEF_IP`` = host 0's address; without it an AssertionError). The chief (rank 0)
binds its ZMQ broadcast server on every interface at two ports (``INTER_TRAIN_PROCESS_COMM_PORT_1``
/ ``_2``, read by ``determined.constants`` at import; 12360 / 12376 by default), which the other
nodes' ranks connect to: the adapter picks both, and the rendezvous port, free on host 0 and
passes them in the environment. With one rank per host no node needs a local ZMQ server (the
per-node chief uses a unix socket otherwise). Checkpoints go to ``XDG_DATA_HOME`` under the cell,
on the shared filesystem every host sees. The result says ``platform_mode = local-<k>-nodes``;
the cell gets ``placements.json`` and ``link_bytes.json`` as under DDP.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from pipelines.platforms.determined import storage
from pipelines.platforms.contract import TrainingBackend
from pipelines.training.cell import CellSpec
from pipelines.config import BenchmarkConfig, TrainingStrategy
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.cluster.processes import free_ports_on
from pipelines.platforms.torchrun import (execute, execute_on_hosts, host_env, host_nproc, host_placements,
                                          host_torchrun_commands, launch_env, worker_command)
from pipelines.runfolder.paths import PROJECT_ROOT, CellPaths, RunPaths
from pipelines.runfolder.results import CellResult

log = logging.getLogger(__name__)
TRIAL_MODULE = "pipelines.platforms.determined.trial"
SEARCHER_METRIC = "loss_sum"  # summed over the fixed test split: proportional to the mean
# Determined's chief ZMQ ports (determined.constants reads these at import)
ZMQ_PORT_ENV = ("INTER_TRAIN_PROCESS_COMM_PORT_1", "INTER_TRAIN_PROCESS_COMM_PORT_2")
def experiment_config(config: BenchmarkConfig, world_size: int, cell_dir: Path,
                      launch_time: float = 0.0, train_records: int | None = None) -> dict:
    """The Determined experiment config for one cell (also the local Trainer's exp_conf).

    The entrypoint is an argument list, never a shell string: the cell folder comes from the
    output root and run id, which a user chooses.
    """
    entry = ["python3", "-m", "determined.launch.torch_distributed", "python3", "-m", TRIAL_MODULE,
             "--cell-dir", str(cell_dir), "--launch-time", repr(launch_time)]
    conf = {
        "name": f"{config.profile}-{Path(cell_dir).name}",
        "entrypoint": entry,
        "hyperparameters": {
            "cell_dir": str(cell_dir), "global_batch_size": config.training.batch_size * world_size,
            "learning_rate": config.training.learning_rate, "weight_decay": config.training.weight_decay,
            "warmup_ratio": config.training.warmup_ratio, "seed": config.training.seed,
        },
        "resources": {"slots_per_trial": world_size},
        "searcher": {"name": "single", "metric": SEARCHER_METRIC, "smaller_is_better": True,
                     "max_length": {"epochs": config.training.epochs}},
        "min_validation_period": {"epochs": 1},
        "min_checkpoint_period": {"epochs": 1},
        "reproducibility": {"experiment_seed": config.training.seed},
        "max_restarts": 0,
    }
    if train_records or config.data.train_samples:
        conf["records_per_epoch"] = int(train_records or config.data.train_samples)
    return conf


def validate_experiment_config(conf: dict) -> None:
    """Round-trip through determined's YAML loader and read it with its ExperimentConfig."""
    import yaml
    from determined._experiment_config import ExperimentConfig
    from determined.common import util

    parsed = ExperimentConfig(util.safe_load_yaml_with_exceptions(yaml.safe_dump(conf)))
    problems = []
    for key in ("name", "entrypoint", "hyperparameters", "resources", "searcher"):
        if key not in parsed:
            problems.append(f"missing {key}")
    if parsed.slots_per_trial() < 1:
        problems.append("resources.slots_per_trial must be >= 1")
    if parsed.get_searcher_metric() != SEARCHER_METRIC:
        problems.append(f"searcher.metric must be {SEARCHER_METRIC}")
    length = parsed["searcher"].get("max_length", {})
    if not (isinstance(length, dict) and len(length) == 1
            and next(iter(length)) in ("batches", "records", "epochs")
            and int(next(iter(length.values()))) >= 1):
        problems.append(f"searcher.max_length must be one of batches/records/epochs: {length}")
    if "epochs" in length and not parsed.get_records_per_epoch():
        problems.append("searcher.max_length in epochs needs records_per_epoch")
    if not isinstance(parsed.get_entrypoint(), (str, list)):
        problems.append("entrypoint must be a string or a list")
    if problems:
        raise ValueError("invalid Determined experiment config: " + "; ".join(problems))


def submit_experiment(conf: dict, master: str) -> int:
    """Submit to a Determined master with the model package staged as the context; wait."""
    from determined.experimental import client

    client.login(master=master)
    with tempfile.TemporaryDirectory() as staging:
        shutil.copytree(PROJECT_ROOT / "pipelines", Path(staging) / "pipelines",
                        ignore=shutil.ignore_patterns("__pycache__"))
        experiment = client.create_experiment(config=conf, model_dir=staging)
    log.info("submitted Determined experiment %s to %s", experiment.id, master)
    state = experiment.wait()
    if "COMPLETED" not in str(state):
        raise RuntimeError(f"Determined experiment {experiment.id} ended {state} on {master}")
    return experiment.id


class DeterminedBackend(TrainingBackend):
    name = "determined"

    def strategy_refusal(self, strategy: TrainingStrategy, world_size: int) -> str | None:
        """The Trainer wraps the model in its own DDP (``context.wrap_model``) and steps the
        optimizer itself: no comm hook, local SGD, FSDP or pipeline can be put in; imbalance
        strategies (sampler, loss weights) are the trial's own and run."""
        reason = super().strategy_refusal(strategy, world_size)
        if reason:
            return reason
        unsupported = [f"{k}={getattr(strategy, k)}" for k, default in
                       (("comm_hook", "none"), ("sync_every", 1), ("sharding", "ddp"),
                        ("pipeline_microbatches", 0), ("asynchronous", False))
                       if getattr(strategy, k) != default]
        if unsupported:
            return (f"strategy {strategy.name!r} on determined: {', '.join(unsupported)} cannot run there: "
                    "det.pytorch.Trainer wraps the model in its own DistributedDataParallel and steps the "
                    "optimizer itself, so comm hooks, local SGD, FSDP, a pipeline (each rank its own "
                    "layers) and a parameter server (async) cannot be applied (imbalance strategies can). Drop the strategy or the "
                    "determined backend from this run")
        return None

    def run(self, config: BenchmarkConfig, world_size: int, *, paths: RunPaths,
            cell: CellPaths | None = None, repeat: int = 0, strategy: str | None = None,
            hosts: list | None = None) -> CellResult:
        if not hosts:
            return super().run(config, world_size, paths=paths, cell=cell, repeat=repeat, strategy=strategy)
        # across hosts: refuse what cannot work before anything is written
        if config.engine("determined").master:
            raise ValueError("determined: hosts= runs the local Trainer on those hosts; with determined_master "
                             "the master schedules the slots on its own agents")
        host_nproc(world_size, len(hosts))  # a bad split
        strategy = strategy or config.matrix.strategies[0].name
        cell = cell or paths.cell(self.name, world_size, repeat, strategy)
        try:
            return super().run(config, world_size, paths=paths, cell=cell, repeat=repeat, strategy=strategy,
                               hosts=hosts)
        finally:
            self._hosts_by_cell().pop(cell.root, None)

    def _prepare(self, spec: CellSpec, launch_time: float) -> dict:
        """The experiment config, validated and written where the trial reads it."""
        from pipelines.data.tokens import read_token_split

        records = len(read_token_split(spec.paths.token_split("train"))[2])
        conf = experiment_config(spec.config, spec.world_size, spec.cell_dir, launch_time, records)
        validate_experiment_config(conf)
        atomic_write_json(storage.experiment(spec.cell), conf)  # the trial reads it
        return conf

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        cfg = spec.config
        conf = self._prepare(spec, launch_time)
        if cfg.engine("determined").master:
            submit_experiment(conf, cfg.engine("determined").master)
            return
        # Determined copies the working directory into every checkpoint: run in an empty one.
        workdir = storage.workdir(spec.cell)
        workdir.mkdir(parents=True, exist_ok=True)
        # one node: across machines Determined's master schedules the slots (or hosts=, launch_on_hosts)
        cmd = worker_command(cfg, spec.world_size, spec.cell_dir, launch_time, module=TRIAL_MODULE)
        env = launch_env(cfg, os.environ, spec.world_size)
        env["USE_TORCH_DISTRIBUTED"] = "1"
        execute(cmd, env, spec.cell.log, cwd=workdir)

    def launch_on_hosts(self, spec: CellSpec, launch_time: float, hosts: list) -> None:
        """One torchrun per host running the trial (node rank = index), static rendezvous and
        Determined's chief on host 0; writes the cell's ``placements.json``."""
        per_host = host_nproc(spec.world_size, len(hosts))
        self._prepare(spec, launch_time)
        workdir = storage.workdir(spec.cell)
        workdir.mkdir(parents=True, exist_ok=True)
        rdzv_port, *zmq_ports = free_ports_on(hosts[0], 3)  # distinct: bound at once
        cmds = host_torchrun_commands(spec.world_size, spec.cell_dir, launch_time, hosts, rdzv_port,
                                      max_restarts=spec.config.matrix.platform_retries, module=TRIAL_MODULE)
        # env -C: the ranks run in the empty working directory (execute_on_hosts takes no cwd)
        cmds = [["env", "-C", str(workdir), *cmd] for cmd in cmds]
        env = host_env(spec.config, os.environ, per_host)
        env.update({"USE_TORCH_DISTRIBUTED": "1", "DET_CHIEF_IP": hosts[0].address,
                    **{name: str(port) for name, port in zip(ZMQ_PORT_ENV, zmq_ports)}})
        logs = [spec.cell.log] + [spec.cell.node_log(k) for k in range(1, len(hosts))]
        self._hosts_by_cell()[spec.cell_dir] = len(hosts)
        try:
            execute_on_hosts(cmds, env, hosts, logs)
        finally:
            atomic_write_json(spec.cell.placements, host_placements(spec.world_size, hosts))

    def versions(self) -> dict[str, str]:
        import determined

        return {"determined": determined.__version__, "launcher": "torchrun + det.pytorch.Trainer"}

    def platform_fields(self, spec: CellSpec) -> dict:
        if spec.config.engine("determined").master:
            return {"platform_mode": "master"}
        nodes = self._hosts_by_cell().get(spec.cell_dir, 1)
        return {"platform_mode": "local" if nodes == 1 else f"local-{nodes}-nodes"}
