"""The benchmark as a Determined ``PyTorchTrial``, trained by ``det.pytorch.Trainer``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m pipelines.training.det_trial --cell-dir <cell> --launch-time <epoch s>

Same model factory, token shards, sampler, optimizer, schedule and evaluation as the shared
loop (``pipelines.training.loop``); Determined drives the loop (its own batching, DDP
wrapping, validation and checkpoint schedule). Local mode (no master): we join the gloo/nccl
group ourselves (USE_TORCH_DISTRIBUTED=1) and hand Determined
``DistributedContext.from_torch_distributed()``. On a cluster (launched by
``determined.launch.torch_distributed``) Determined initialises everything itself.
Determined's checkpoints go to ``<cell>/determined/determined/<uuid>`` (XDG_DATA_HOME) and
it copies the working directory into each one, so the worker runs in an empty folder.
Rank 0 writes ``<cell>/worker_result.json`` like every other backend.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import determined as det
import determined.pytorch  # noqa: F401  (`import determined` alone does not expose it)
import torch
from determined import pytorch as dtorch

from pipelines.results import EpochMetrics
from pipelines.training import loop
from pipelines.training.model import build_model
from pipelines.training.worker import CellSpec, setup_logging

log = logging.getLogger("pipelines.training.determined")
MARKER = "latest.json"  # newest Determined checkpoint + our epoch history, written by rank 0


def det_dir(cell_dir: Path) -> Path:
    return Path(cell_dir) / "determined"


def read_marker(cell_dir: Path) -> dict | None:
    path = det_dir(cell_dir) / MARKER
    return json.loads(path.read_text()) if path.exists() else None


class RepeatingLoader:
    """Endless batches with ``len`` = batches per epoch, as Determined's loop expects from a
    non-Determined loader; the sampler gets ``set_epoch`` each pass, as in the shared loop."""

    def __init__(self, loader, start_epoch: int):
        self.loader, self.start_epoch = loader, start_epoch

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        epoch = self.start_epoch
        while True:
            self.loader.sampler.set_epoch(epoch)
            yield from self.loader
            epoch += 1


class EpochRecorder(dtorch.PyTorchCallback):
    """Turns Determined's callbacks into the same EpochMetrics/timings the shared loop records."""

    def __init__(self, trial: "BenchmarkTrial", marker: dict | None):
        self.trial = trial
        marker = marker or {}
        self.done = int(marker.get("epoch", 0))
        self.history = [EpochMetrics.model_validate(h) for h in marker.get("history", [])]
        self.train_time = float(marker.get("train_seconds", 0.0))
        self.eval_time = float(marker.get("eval_seconds", 0.0))
        self.elapsed0 = float(marker.get("elapsed", 0.0))
        self.first_step: float | None = None
        self.train_metrics: dict = {}

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.first_step = self.first_step or time.time()
        self.t0 = time.perf_counter()

    def on_training_workload_end(self, avg_metrics, batch_metrics) -> None:
        self.epoch_train = time.perf_counter() - self.t0
        self.train_time += self.epoch_train
        self.train_metrics = avg_metrics

    def on_validation_start(self) -> None:
        self.t1 = time.perf_counter()

    def on_validation_end(self, metrics) -> None:
        epoch_eval = time.perf_counter() - self.t1
        self.eval_time += epoch_eval
        self.done += 1
        n = float(metrics["count"])
        self.history.append(EpochMetrics(
            epoch=self.done, train_loss=float(self.train_metrics["loss"]),
            train_accuracy=float(self.train_metrics["accuracy"]),
            eval_loss=float(metrics["loss_sum"]) / n, eval_accuracy=float(metrics["correct"]) / n,
            epoch_seconds=self.epoch_train + epoch_eval,
            elapsed_seconds=self.elapsed0 + time.time() - (self.first_step or time.time()),
            samples_per_second=self.trial.samples_per_epoch * self.done / self.train_time,
        ))
        if self.trial.env.is_main:
            m = self.history[-1]
            log.info("epoch %d: train loss %.4f acc %.3f | eval loss %.4f acc %.3f",
                     m.epoch, m.train_loss, m.train_accuracy, m.eval_loss, m.eval_accuracy)

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        if not self.trial.env.is_main:
            return
        path = det_dir(self.trial.spec.cell_dir) / MARKER
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "uuid": uuid, "epoch": self.done, "history": [h.model_dump() for h in self.history],
            "train_seconds": self.train_time, "eval_seconds": self.eval_time,
            "elapsed": self.history[-1].elapsed_seconds if self.history else 0.0,
        }))
        os.replace(tmp, path)


class BenchmarkTrial(dtorch.PyTorchTrial):
    def __init__(self, context: dtorch.PyTorchTrialContext) -> None:
        self.context = context
        self.spec = CellSpec.read(context.get_hparams()["cell_dir"])
        cfg = self.spec.config
        dist_ctx = context.distributed
        self.env = loop.DistEnv(dist_ctx.rank, dist_ctx.size, dist_ctx.local_rank, context.device)
        self.marker = read_marker(self.spec.cell_dir)
        self.train_set, self.test_set = loop.load_split(self.spec, "train"), loop.load_split(self.spec, "test")
        model, self.model_source = build_model(cfg.model_source, cfg.seed)
        self.raw_model = model
        self.model = context.wrap_model(model)
        self.loader = loop.train_loader(self.train_set, self.spec, self.env)
        self.samples_per_epoch = len(self.loader.sampler) * self.env.world_size
        optimizer, scheduler = loop.build_optimizer(model, self.spec, len(self.loader) * cfg.epochs)
        self.optimizer = context.wrap_optimizer(optimizer)
        self.scheduler = context.wrap_lr_scheduler(
            scheduler, step_mode=dtorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        # Our loaders are plain torch ones with the shared loop's sampler (same batches).
        context.experimental.disable_dataset_reproducibility_checks()
        self.recorder = EpochRecorder(self, self.marker)
        torch.manual_seed(cfg.seed + self.env.rank)  # dropout stream, as in the shared loop

    def build_training_data_loader(self):
        return RepeatingLoader(self.loader, start_epoch=self.recorder.done)

    def build_validation_data_loader(self):
        return loop.eval_loader(self.test_set, self.spec.config.batch_size, self.env)

    def build_callbacks(self) -> dict:
        return {"epoch_recorder": self.recorder}

    def train_batch(self, batch, epoch_idx: int, batch_idx: int) -> dict:
        loss, logits, labels = loop.forward(self.model, batch, self.env.device)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss, "accuracy": (logits.argmax(-1) == labels).float().mean()}

    def evaluate_batch(self, batch, batch_idx: int) -> dict:
        loss, logits, labels = loop.forward(self.model, batch, self.env.device)
        return {"loss_sum": loss * len(labels), "correct": (logits.argmax(-1) == labels).sum(),
                "count": torch.tensor(len(labels))}

    def evaluation_reducer(self):
        return {k: dtorch.Reducer.SUM for k in ("loss_sum", "correct", "count")}


def allow_numpy_rng_globals() -> None:
    """Determined's checkpoints hold numpy RNG state; torch 2.6+ loads weights-only. Allow
    exactly those numpy globals rather than turning weights-only loading off."""
    import numpy as np

    try:
        reconstruct = np._core.multiarray._reconstruct
    except AttributeError:  # numpy < 2
        reconstruct = np.core.multiarray._reconstruct
    torch.serialization.add_safe_globals(
        [reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))])


def main(cell_dir: str, launch_time: float) -> None:
    from pipelines.backends.determined import experiment_config

    setup_logging()
    spec = CellSpec.read(cell_dir)
    cfg = spec.config
    torch.set_num_threads(cfg.threads_per_worker)
    distributed = None
    if det.get_cluster_info() is None:  # local mode under torchrun
        os.environ["USE_TORCH_DISTRIBUTED"] = "1"
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        distributed = det.core.DistributedContext.from_torch_distributed()
        os.environ["XDG_DATA_HOME"] = str(det_dir(spec.cell_dir))  # checkpoint storage
    marker = read_marker(spec.cell_dir)
    if marker:
        allow_numpy_rng_globals()
    exp_conf = experiment_config(cfg, spec.world_size, spec.cell_dir, launch_time)
    with dtorch.init(hparams=exp_conf["hyperparameters"], exp_conf=exp_conf,
                     distributed=distributed, enable_tensorboard_logging=False) as context:
        trial = BenchmarkTrial(context)
        trainer = dtorch.Trainer(trial, context)
        trainer.fit(max_length=dtorch.Epoch(cfg.epochs), checkpoint_period=dtorch.Epoch(1),
                    validation_period=dtorch.Epoch(1), reporting_period=dtorch.Batch(sys.maxsize),
                    checkpoint_policy="none", latest_checkpoint=marker["uuid"] if marker else None)
        rec = trial.recorder
        if trial.env.is_main:
            test, test_seconds = loop.final_test(trial.raw_model, trial.test_set, spec, trial.env.device)
            last = read_marker(spec.cell_dir)
            ckpt_path = det_dir(spec.cell_dir) / "determined" / last["uuid"] if last else None
            loop.write_worker_result(loop.worker_result(
                spec, trial.env, model_source=trial.model_source, epochs=rec.history, test=test,
                train_samples=len(trial.train_set), test_samples=len(trial.test_set),
                startup=(rec.first_step or time.time()) - launch_time, training=rec.train_time,
                evaluation=rec.eval_time + test_seconds,
                checkpoint_path=str(ckpt_path) if ckpt_path else None,
                resumed_from=int(marker["epoch"]) if marker else 0,
                model_path=loop.export_model(trial.raw_model, spec)), spec)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Determined trial worker (see module docstring)")
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True)
    args = parser.parse_args()
    main(args.cell_dir, args.launch_time)
