"""DeepSpeed's engine in the shared loop (``pipelines.training.engine``), and its config.

``DeepSpeedEngine.attach`` hands the loop's model, AdamW and warm-up scheduler to
``deepspeed.initialize``: ZeRO then partitions the optimizer state (stage 1), the gradients
(2) and the parameters (3) over the ranks and owns the step. Each training step is the loop's
forward, then ``engine.backward(loss)`` (gradients reduced, or reduce-scattered, by DeepSpeed)
and ``engine.step()`` (the optimizer on this rank's partition, the parameters all-gathered back,
the scheduler stepped). The optimizer is the loop's own (``build_optimizer``: torch's fused
AdamW, the same groups and weight decay as every platform), passed as a client optimizer
(``zero_allow_untested_optimizer``; with offload ``zero_force_ds_cpu_optimizer`` off, so no
DeepSpeed op has to be compiled): the same update rule as DDP, on partitions.

Checkpoints: every rank writes its part with ``save_checkpoint`` under
``<cell>/checkpoints/deepspeed/epoch-NNNN``; the loop's own ``epoch-NNNN.pt`` holds the reference
(``{"engine_dir", "engine_tag"}``) next to the RNG states and the record, and a resume loads it
back with ``load_checkpoint`` (every rank its partition). The newest ``KEEP`` tags are kept, as
the loop keeps its files. The run folder is writable by several services, so a resume loads only
from the cell's own ``<cell>/checkpoints/deepspeed`` (the reference and every file DeepSpeed opens,
links resolved: ``TensorsOnlyLoads``) and with ``weights_only=True``; DeepSpeed's own
``torch.load(weights_only=False)`` is never called.

``ds_config`` is the DeepSpeed config of a cell: micro batch = the loop's per-rank batch, no
gradient accumulation, no clipping, fp32 master weights (the loop's forward runs under its own
autocast on GPU, as under DDP), and DeepSpeed's comms logger on, whose per-op latencies and
message sizes are the cell's communication phase and bytes per step
(``pipelines.platforms.deepspeed.worker``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from pipelines.training.checkpoint import KEEP
from pipelines.training.engine import TorchEngine

log = logging.getLogger("pipelines.training")
CHECKPOINT_FOLDER = "deepspeed"  # under <cell>/checkpoints
TAG = "epoch-{epoch:04d}"
_TAG_PATTERN = re.compile(r"epoch-\d{4,}")


def ds_config(batch_size: int, world_size: int, zero_stage: int, offload: str, *,
              comms_logger: bool = True) -> dict:
    """The DeepSpeed config of a cell (see the module docstring); ``offload``: ``none``,
    ``optimizer`` or ``optimizer+parameters`` (ZeRO-3)."""
    zero: dict = {"stage": int(zero_stage)}
    if offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if offload == "optimizer+parameters":
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    config = {
        "train_micro_batch_size_per_gpu": int(batch_size),
        "gradient_accumulation_steps": 1,
        "train_batch_size": int(batch_size) * int(world_size),
        "gradient_clipping": 0.0,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # the loop's torch AdamW
        "zero_force_ds_cpu_optimizer": False,  # offload with it too: no DeepSpeedCPUAdam to compile
        "steps_per_print": 2**31 - 1,  # the loop logs progress
        "wall_clock_breakdown": False,
    }
    if comms_logger:  # DeepSpeed turns the logger on when the key is there, whatever its "enabled" says
        config["comms_logger"] = {"enabled": True, "verbose": False, "prof_all": True, "debug": False}
    return config


class DeepSpeedEngine(TorchEngine):
    """``deepspeed.initialize`` over the loop's model, optimizer and scheduler; its backward and
    step; its checkpoints (see the module docstring)."""

    def __init__(self, config: dict, is_main: bool, checkpoints: Path) -> None:
        self.config, self.is_main = config, is_main
        self.own_folder = Path(checkpoints) / CHECKPOINT_FOLDER  # the only place a resume loads from
        self.ds = None  # deepspeed.runtime.engine.DeepSpeedEngine, set by attach
        self.after_attach: Callable[[], None] | None = None  # called once initialize returned

    def attach(self, model, wrapped, optimizer, scheduler, runtime) -> torch.nn.Module:
        import deepspeed

        self.model, self.optimizer, self.scheduler, self.runtime = model, optimizer, scheduler, runtime
        self.ds, _, _, _ = deepspeed.initialize(model=wrapped, optimizer=optimizer, lr_scheduler=scheduler,
                                                config=self.config)
        if self.after_attach is not None:
            self.after_attach()
        return self.ds

    def zero_grad(self) -> None:
        """Nothing: ``engine.step()`` zeroes the gradients it consumed."""

    def backward(self, loss: torch.Tensor) -> None:
        self.ds.backward(loss)

    def step(self) -> None:
        """The optimizer step on this rank's partition and the scheduler's step (DeepSpeed's)."""
        self.ds.step()

    def scheduler_step(self) -> None:
        """Nothing: ``engine.step()`` stepped the scheduler."""

    # --- checkpoints ----------------------------------------------------------------------
    def load_model_state(self, model: torch.nn.Module, state: dict) -> None:
        """Nothing: ``load_state`` loads the weights with the rest, after ``attach``."""

    def load_state(self, state: dict) -> None:
        named, tag = Path(state["engine_dir"]) / str(state["engine_tag"]), str(state["engine_tag"])
        own = self.own_folder.resolve()
        if named.resolve().parent != own or not _TAG_PATTERN.fullmatch(tag):  # links resolved
            raise PermissionError(f"the checkpoint names DeepSpeed's {named} ({named.resolve()}), which is "
                                  f"not a tag folder of this cell's own {self.own_folder}: refused. Delete "
                                  f"{self.own_folder.parent} to start this cell over")
        if not (own / tag).is_dir():
            raise FileNotFoundError(f"the checkpoint names DeepSpeed's {named}, which is missing; delete "
                                    f"{self.own_folder.parent} to start this cell over")
        library_loads = self.ds.checkpoint_engine
        self.ds.checkpoint_engine = TensorsOnlyLoads(library_loads, own)
        try:
            path, _ = self.ds.load_checkpoint(str(own), tag=tag, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
        finally:
            self.ds.checkpoint_engine = library_loads
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load its checkpoint {own / tag}")

    def state_dict(self, epoch: int, directory: Path) -> dict:
        """Every rank writes its part of ``<directory>/deepspeed/epoch-NNNN``; returns the reference."""
        folder, tag = Path(directory) / CHECKPOINT_FOLDER, TAG.format(epoch=epoch)
        self.ds.save_checkpoint(str(folder), tag=tag)
        if self.is_main:
            prune(folder, keep=KEEP)
        return {"engine": "deepspeed", "engine_dir": str(folder), "engine_tag": tag}


def deepspeed_classes() -> list[type]:
    """The classes DeepSpeed's ZeRO optimizer files hold besides tensors and plain types (its
    ``state_dict``: the stage, the fp32 loss scaler, the parameters' fragment addresses); checked
    with ``torch.serialization.get_unsafe_globals_in_checkpoint`` on deepspeed 0.19.8, ZeRO 1-3 with
    and without offload, on CPU."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


class TensorsOnlyLoads:
    """DeepSpeed's checkpoint engine while a checkpoint loads: every file it opens must lie inside
    ``folder`` (checked on the opened file itself, so a link or a renamed folder cannot lead out),
    and is read with ``weights_only=True`` allowing only ``deepspeed_classes``. DeepSpeed's own
    ``TorchCheckpointEngine.load`` unpickles anything (``weights_only=False``): a file planted in
    the shared run folder would run its code in every rank."""

    def __init__(self, engine, folder: Path) -> None:
        self._engine, self._folder = engine, Path(folder).resolve()

    def __getattr__(self, name: str):
        return getattr(self._engine, name)  # everything but load: DeepSpeed's own engine

    def load(self, path: str, map_location=None):
        with open(path, "rb") as fh:
            opened = Path(os.readlink(f"/proc/self/fd/{fh.fileno()}"))  # where the file really is
            if not opened.is_relative_to(self._folder):
                raise PermissionError(f"DeepSpeed's checkpoint file {path} is {opened}, outside this cell's "
                                      f"{self._folder}: refused")
            with torch.serialization.safe_globals(deepspeed_classes()):
                return torch.load(fh, map_location=map_location, weights_only=True)


def prune(folder: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` DeepSpeed checkpoint tags of ``folder``."""
    tags = sorted(p for p in Path(folder).glob("epoch-*") if p.is_dir())
    old = tags[:-keep] if keep > 0 else tags
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old
