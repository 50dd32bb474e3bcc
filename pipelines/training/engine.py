"""Who does the loop's optimizer work: backward, the optimizer and scheduler steps, and the
model / optimizer / scheduler part of a checkpoint. ``TorchEngine`` is plain torch (the default);
an engine that owns these (a platform's own engine with its backward / step / checkpoint calls, a
wrapping distributed optimizer, a trial's context: each platform's package says which) replaces the
methods it owns and the shared loop stays one loop.

The loop (``pipelines.training.loop``) gets the engine from its ``Distributed`` seam
(``TorchDistributed.engine``) and calls it at fixed points:

    engine = distributed.engine(env)
    engine.load_model_state(model, state)        # resume: full weights, before sharding / wrapping
    ...optimizer and scheduler built, model wrapped (runtime.wrap)...
    wrapped = engine.attach(model, wrapped, optimizer, scheduler, runtime)  # what the steps call
    engine.load_state(state)                     # resume: optimizer and scheduler
    # each step (``steps.train_step``): forward, then
    engine.zero_grad(); engine.backward(loss); engine.step(); <strategy's after_step>; engine.scheduler_step()
    state = engine.state_dict(epoch, directory)  # every rank, each epoch's checkpoint; rank 0 writes it

An engine that keeps its own checkpoint (every rank writes its part of ``directory/<tag>``
itself) returns a reference from ``state_dict`` (e.g. ``{"engine_tag": tag}``); the loop's
checkpoint file then holds that next to the RNG states, the record and the config, and
``load_state`` gets it back on resume (``load_checkpoint``).
``load_model_state`` does nothing for such an engine. Its ``attach`` returns the engine's own
module (built from the model, the optimizer and the scheduler by the engine's library); its seam's
``wrap_model`` returns the model unwrapped so nothing else synchronises gradients, and its
``step`` steps the scheduler itself (``scheduler_step`` does nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class TorchEngine:
    """Plain torch: ``loss.backward()``, ``optimizer.step()``, ``scheduler.step()``, and the state
    dicts as one process would have them (the strategy's runtime gathers them when sharded)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    runtime: Any  # pipelines.training.runtime.Replicated (or a subclass)

    # --- set-up ---------------------------------------------------------------------------
    def attach(self, model: torch.nn.Module, wrapped: torch.nn.Module, optimizer, scheduler,
               runtime) -> torch.nn.Module:
        """Take the model, optimizer and scheduler the loop built (after the strategy's wrapping);
        returns the module the training steps call (an engine that wraps the model: its own)."""
        self.model, self.optimizer, self.scheduler, self.runtime = model, optimizer, scheduler, runtime
        bind = getattr(runtime, "bind_optimizer", None)  # async: its parameter server copies the optimizer
        if bind is not None:
            bind(model, optimizer)
        return wrapped

    # --- one training step (the forward is the loop's) ------------------------------------
    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        """The optimizer step (the strategy's ``after_step`` follows, then ``scheduler_step``); none where
        the strategy's runtime updates the weights itself (async: its parameter server, in ``after_step``)."""
        if not getattr(self.runtime, "steps_the_weights", False):
            self.optimizer.step()

    def scheduler_step(self) -> None:
        self.scheduler.step()

    # --- checkpoints ----------------------------------------------------------------------
    def load_model_state(self, model: torch.nn.Module, state: dict) -> None:
        """Resume: the checkpoint's full weights, before any sharding or wrapping."""
        model.load_state_dict(state["model"])

    def load_state(self, state: dict) -> None:
        """Resume, after ``attach``: the optimizer's and the scheduler's state."""
        self.runtime.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def state_dict(self, epoch: int, directory: Path) -> dict:
        """Every rank, at the end of ``epoch`` (1-based): what the loop's checkpoint holds of the
        model, optimizer and scheduler (rank 0 writes it to ``directory``; a collective when
        sharded)."""
        model_state, optimizer_state = self.runtime.checkpoint_state(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state, "scheduler": self.scheduler.state_dict()}
