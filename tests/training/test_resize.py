"""Resuming a checkpoint at another world size (an elastic launcher that lost or regained a
node): the scheduler at the same fraction of training, new ranks seeded, each start's world size
noted, a checkpoint of another training config still refused. No engine is started."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pipelines.training import checkpoint as ckpt
from pipelines.training import steps
from pipelines.training.cell import CellSpec
from pipelines.training.distributed import DistEnv
from pipelines.training.loop import _resume_state


def _trained(config, total_steps: int, done: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer, scheduler = steps.build_optimizer(model, config, total_steps=total_steps)
    for _ in range(done):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def test_the_scheduler_resumes_at_the_same_fraction_of_training_at_another_world_size(make_config, tmp_path):
    """2 ranks: 10 steps an epoch, checkpoint after epoch 1 of 3; 1 rank: 20 steps an epoch, so the
    same point is step 20 of 60, with the learning rate the 2-rank run had at step 10 of 30."""
    config = make_config(learning_rate=1e-3, warmup_ratio=0.1, epochs=3)
    model, optimizer, scheduler = _trained(config, total_steps=30, done=10)
    path = ckpt.save_checkpoint({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                 "model": model.state_dict()}, tmp_path, 1)
    state = ckpt.load_checkpoint(path)
    lr_at_checkpoint = scheduler.get_last_lr()[0]

    resumed, optimizer2, scheduler2 = _trained(config, total_steps=60, done=0)
    resumed.load_state_dict(state["model"])
    optimizer2.load_state_dict(state["optimizer"])
    scheduler2.load_state_dict(state["scheduler"])
    assert scheduler2.last_epoch == 10  # as written: 10 steps of 60 would be the wrong place
    rates = ckpt.place_scheduler(scheduler2, 1 * 20)
    assert scheduler2.last_epoch == 20
    assert rates[0] == pytest.approx(lr_at_checkpoint) and scheduler2.get_last_lr()[0] == pytest.approx(rates[0])
    assert [g["lr"] for g in optimizer2.param_groups] == pytest.approx([lr_at_checkpoint] * 2)
    # Adam's moments came along whole (they do not depend on the number of ranks)
    moments = [s["exp_avg"] for s in optimizer2.state_dict()["state"].values()]
    assert len(moments) == 4 and all(m.abs().sum() > 0 for m in moments)
    # and the schedule goes on to zero at the new length
    optimizer2.step()
    scheduler2.step()
    assert scheduler2.get_last_lr()[0] < rates[0]
    ckpt.place_scheduler(scheduler2, 60)
    assert scheduler2.get_last_lr()[0] == 0.0


def test_a_scheduler_without_lambdas_is_refused_by_name():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(TypeError, match="StepLR.*LambdaLR"):
        ckpt.place_scheduler(torch.optim.lr_scheduler.StepLR(optimizer, 5), 3)


def test_ranks_that_existed_get_their_rng_back_and_new_ones_are_seeded():
    torch.manual_seed(1)
    saved = [ckpt.rng_state()]
    expected = torch.rand(2)
    torch.manual_seed(99)
    ckpt.rank_rng(saved, 0, seed=7)
    assert torch.equal(torch.rand(2), expected)
    draws = []
    for _ in range(2):  # a rank the checkpoint did not have: reproducible, from seed + rank
        ckpt.rank_rng(saved, 1, seed=7)
        draws.append((torch.rand(1).item(), random.random(), float(np.random.rand())))
    assert draws[0] == draws[1]
    ckpt.rank_rng(saved, 2, seed=7)
    assert torch.rand(1).item() != draws[0][0]  # another new rank: another stream


def test_each_start_notes_its_world_size_and_a_fresh_start_begins_the_list(tmp_path):
    ckpt.note_world_size(tmp_path, 0, 2, 100.0)
    ckpt.note_world_size(tmp_path, 1, 1, 130.0)  # resumed after epoch 1 on one rank
    assert [(e["epoch"], e["world_size"]) for e in ckpt.world_sizes(tmp_path)] == [(0, 2), (1, 1)]
    ckpt.note_world_size(tmp_path, 0, 2, 200.0)  # the cell started over
    assert ckpt.world_sizes(tmp_path) == [{"epoch": 0, "world_size": 2, "first_step_at": 200.0}]
    assert ckpt.world_sizes(tmp_path / "none") == []
    from pipelines.measure import faults  # reads them without importing torch: the same names
    assert (faults.WORLD_SIZES, faults.CHECKPOINTS) == (ckpt.WORLD_SIZES, ckpt.PATTERN)


def test_a_checkpoint_of_another_world_size_resumes_but_another_config_is_refused(make_config, tmp_path):
    config = make_config(epochs=3)
    spec = CellSpec(config=config, run_root=tmp_path, cell_dir=tmp_path / "cell", backend="ddp",
                    world_size=2, repeat=0, labels=[0, 1])
    spec.cell.checkpoints.mkdir(parents=True)
    ckpt.save_checkpoint({"config": config.to_json(), "world_size": 2, "epoch": 1}, spec.cell.checkpoints, 1)
    one_rank = DistEnv(0, 1, 0, torch.device("cpu"))
    state, path = _resume_state(spec, one_rank)
    assert state["world_size"] == 2 and path.endswith("epoch-0001.pt")
    other = make_config(epochs=3, learning_rate=config.training.learning_rate * 2)
    ckpt.save_checkpoint({"config": other.to_json(), "world_size": 2, "epoch": 2}, spec.cell.checkpoints, 2)
    with pytest.raises(RuntimeError, match="different training config"):
        _resume_state(spec, one_rank)
