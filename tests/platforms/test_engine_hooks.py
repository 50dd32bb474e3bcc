"""The engine hooks: an engine that owns backward, the optimizer step and its own checkpoint
(as DeepSpeed's ``engine.backward`` / ``engine.step`` / ``engine.save_checkpoint`` do) plugs into
the shared loop through its seam's ``engine`` instead of a second loop. Runs the real loop
in-process."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from pipelines.platforms.ddp.adapter import DDPBackend
from pipelines.runfolder.paths import CellPaths
from pipelines.runfolder.results import CellResult
from pipelines.training import checkpoint as ckpt
from pipelines.training import steps
from pipelines.training.cell import CellSpec
from pipelines.training.distributed import TorchDistributed
from pipelines.training.engine import TorchEngine
from pipelines.training.loop import run_training


class OwnedEngine(TorchEngine):
    """Stands in for DeepSpeed's engine: ``step`` also zeroes the gradients and steps the
    scheduler, and every rank writes the engine's own checkpoint; the loop's file holds a tag."""

    def __init__(self, calls: Counter, checkpoints) -> None:
        self.calls, self.directory = calls, checkpoints / "engine"

    def attach(self, model, wrapped, optimizer, scheduler, runtime):
        self.calls["attach"] += 1
        return super().attach(model, wrapped, optimizer, scheduler, runtime)

    def zero_grad(self) -> None:
        self.calls["zero_grad"] += 1  # the engine's own step zeroes them

    def backward(self, loss) -> None:
        self.calls["backward"] += 1
        loss.backward()

    def step(self) -> None:
        self.calls["step"] += 1
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def scheduler_step(self) -> None:
        self.calls["scheduler_step"] += 1  # done in step

    def state_dict(self, epoch, directory):
        self.calls["save"] += 1
        assert directory / "engine" == self.directory
        self.directory.mkdir(parents=True, exist_ok=True)
        tag = f"epoch-{epoch:04d}.pt"
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict()}, self.directory / tag)
        return {"engine_tag": tag}

    def load_model_state(self, model, state) -> None:
        self.calls["load_model_state"] += 1  # its own checkpoint holds the weights: load_state

    def load_state(self, state) -> None:
        self.calls["load"] += 1
        assert set(state) >= {"engine_tag", "rng", "record"} and "model" not in state
        own = torch.load(self.directory / state["engine_tag"], weights_only=True)
        self.model.load_state_dict(own["model"])
        self.optimizer.load_state_dict(own["optimizer"])
        self.scheduler.load_state_dict(own["scheduler"])


class EngineOwned(TorchDistributed):
    def __init__(self, checkpoints) -> None:
        super().__init__()
        self.calls: Counter = Counter()
        self.checkpoints = checkpoints

    def engine(self, env):
        return OwnedEngine(self.calls, self.checkpoints)


def test_the_default_engine_is_plain_torch():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    engine = TorchDistributed().engine(None)
    assert type(engine) is TorchEngine
    assert engine.attach(model, model, optimizer, scheduler, runtime=None) is model
    before = model.weight.detach().clone()

    class Forward(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return type("Out", (), {"logits": model(input_ids.float())})()

    batch = (torch.ones(4, 2, dtype=torch.long), torch.ones(4, 2, dtype=torch.long), torch.tensor([0, 1, 0, 1]))
    calls = []
    loss, _, _ = steps.train_step(engine, Forward(), batch, torch.device("cpu"),
                                  after_step=lambda: calls.append(scheduler.get_last_lr()[0]))
    assert loss.grad_fn is not None
    assert not torch.equal(model.weight, before) and calls == [0.1]  # after the step, before the scheduler's
    assert scheduler.get_last_lr()[0] == pytest.approx(0.05)


@pytest.mark.slow  # trains in-process twice, and the torchrun reference cell
def test_an_engine_that_owns_backward_step_and_checkpoints_plugs_into_the_loop(bench_config, run_paths, trained):
    cell = CellPaths(run_paths.cells / "engine-w1")
    spec: CellSpec = DDPBackend().spec(bench_config, 1, run_paths, cell, 0)
    spec.write()
    seam = EngineOwned(cell.checkpoints)
    run_training(spec, launch_time=0.0, distributed=seam)
    result = CellResult.read(cell.worker_result)
    steps_trained = result.steps_per_epoch * 2
    assert seam.calls == Counter(attach=1, zero_grad=steps_trained, backward=steps_trained, step=steps_trained,
                                 scheduler_step=steps_trained, save=2)
    assert "model" not in ckpt.load_checkpoint(cell.checkpoints / "epoch-0002.pt")  # the engine's own file
    reference = trained("ddp", 1)  # the default engine, through torchrun
    for mine, theirs in zip(result.epochs, reference.epochs, strict=True):
        assert mine.train_loss == pytest.approx(theirs.train_loss, abs=1e-6)
    assert result.test.loss == pytest.approx(reference.test.loss, abs=1e-6)

    # resume from epoch 1 through the engine's own checkpoint: epoch 2 trains the same
    for name in ("epoch-0002.pt", "epoch-0002.pt.sha256"):
        (cell.checkpoints / name).unlink()
    cell.worker_result.unlink()
    again = EngineOwned(cell.checkpoints)
    run_training(spec, launch_time=0.0, distributed=again)
    resumed = CellResult.read(cell.worker_result)
    assert again.calls["load"] == 1 and again.calls["load_model_state"] == 1 and again.calls["save"] == 1
    assert resumed.resumed_from_epoch == 1
    assert resumed.epochs[1].train_loss == pytest.approx(result.epochs[1].train_loss, abs=1e-6)
    assert resumed.test.loss == pytest.approx(result.test.loss, abs=1e-6)
