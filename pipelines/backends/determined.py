"""Determined AI: the benchmark trial (``pipelines.training.det_trial``) under Determined's loop.

No master (default): ``det.pytorch.Trainer`` in local mode, one process per rank started by
torchrun (``pipelines.launch``, the DDP backend's launcher too), so both see identical start-up.
With ``determined_master`` set: the same run is submitted as an experiment through the SDK
(``determined.experimental.client.create_experiment``) with the config from
``experiment_config``; the run folder must then be on storage the agents mount at the same
path, since rank 0 writes the result file there. ``validate_experiment_config`` checks the
generated config with what the determined 0.37 package ships (its YAML loader and its
``ExperimentConfig`` accessors); the master validates the full schema, and the tests check the
config against Determined's own expconf schema (tests/backends/test_determined_schema.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pipelines.backends.base import TrainingBackend
from pipelines.cell import CellSpec
from pipelines.config import Backend, BenchmarkConfig, TrainingStrategy, deployment
from pipelines.fileio import atomic_write_json
from pipelines.launch import execute, launch_env, worker_command
from pipelines.paths import PROJECT_ROOT

log = logging.getLogger(__name__)
TRIAL_MODULE = "pipelines.training.det_trial"
SEARCHER_METRIC = "loss_sum"  # summed over the fixed test split: proportional to the mean


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


class DeterminedSettings(BaseModel):
    """``engines.determined``: None = the local Trainer; else the master experiments go to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    master: str | None = deployment(None, env="BENCHMARK_DETERMINED_MASTER", flat="determined_master")


class DeterminedBackend(TrainingBackend):
    name = Backend.DETERMINED
    order = 20
    label = "Determined AI"
    colour = "#047857"
    settings = DeterminedSettings
    study_overhead = 0.21  # the study: Determined 1.21x DDP's time
    mode_caveats = {"local": "Determined's Trainer runs in-process under torchrun: no master, no scheduling, "
                             "no checkpoint upload. It measures the Trainer's own bookkeeping, not a "
                             "Determined cluster's overhead."}

    def strategy_refusal(self, strategy: TrainingStrategy, world_size: int) -> str | None:
        """The Trainer wraps the model in its own DDP (``context.wrap_model``) and steps the
        optimizer itself: no comm hook, local SGD or FSDP can be put in; imbalance strategies
        (sampler, loss weights) are the trial's own and run."""
        reason = super().strategy_refusal(strategy, world_size)
        if reason:
            return reason
        unsupported = [f"{k}={getattr(strategy, k)}" for k, default in
                       (("comm_hook", "none"), ("sync_every", 1), ("sharding", "ddp"))
                       if getattr(strategy, k) != default]
        if unsupported:
            return (f"strategy {strategy.name!r} on determined: {', '.join(unsupported)} cannot run there: "
                    "det.pytorch.Trainer wraps the model in its own DistributedDataParallel and steps the "
                    "optimizer itself, so comm hooks, local SGD and FSDP cannot be applied (imbalance "
                    "strategies can). Drop the strategy or the determined backend from this run")
        return None

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        cfg = spec.config
        if cfg.engine("ddp").nnodes > 1 and not cfg.engine("determined").master:
            # across machines, Determined's own master schedules the slots
            raise ValueError(f"determined: ddp_nnodes={cfg.engine('ddp').nnodes} applies to the ddp backend; "
                             "run Determined across machines through its master (determined_master)")
        from pipelines.data.tokens import read_token_split

        records = len(read_token_split(spec.paths.token_split("train"))[2])
        conf = experiment_config(cfg, spec.world_size, spec.cell_dir, launch_time, records)
        validate_experiment_config(conf)
        atomic_write_json(spec.cell.determined_experiment, conf)  # the trial reads it
        if cfg.engine("determined").master:
            submit_experiment(conf, cfg.engine("determined").master)
            return
        # Determined copies the working directory into every checkpoint: run in an empty one.
        workdir = spec.cell.determined_workdir
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = worker_command(cfg, spec.world_size, spec.cell_dir, launch_time, module=TRIAL_MODULE)
        env = launch_env(cfg, os.environ, spec.world_size)
        env["USE_TORCH_DISTRIBUTED"] = "1"
        execute(cmd, env, spec.cell.log, cwd=workdir)

    def versions(self) -> dict[str, str]:
        import determined

        return {"determined": determined.__version__, "launcher": "torchrun + det.pytorch.Trainer"}

    def platform_fields(self, spec: CellSpec) -> dict:
        return {"platform_mode": "master" if spec.config.engine("determined").master else "local"}
