"""Pieces of the shared loop that every backend relies on, without launching anything."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from pipelines.training.cell import CellSpec
from pipelines.runfolder.paths import RunPaths
from pipelines.training import steps
from pipelines.training.distributed import DistEnv


def _env(rank, world):
    return DistEnv(rank, world, rank, torch.device("cpu"))


def _spec(config, tmp_path, world=2):
    return CellSpec(config=config, run_root=tmp_path, cell_dir=tmp_path / "cell", backend="ddp",
                    world_size=world, repeat=0, labels=[0, 1])


def test_held_out_shards_cover_every_row_once():
    data = TensorDataset(torch.arange(11))
    seen = [int(x) for r in range(3) for (b,) in steps.eval_loader(data, 4, _env(r, 3)) for x in b]
    assert sorted(seen) == list(range(11))


def test_train_sampler_is_seeded_disjoint_and_epoch_dependent(make_config, tmp_path):
    spec = _spec(make_config(batch_size=4, seed=3), tmp_path)
    data = TensorDataset(torch.arange(16))

    def order(rank, epoch):
        loader = steps.train_loader(data, spec.config, _env(rank, 2))
        loader.sampler.set_epoch(epoch)
        return [int(x) for (b,) in loader for x in b]

    assert sorted(order(0, 0) + order(1, 0)) == list(range(16))
    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1)


def test_optimizer_warms_up_linearly_then_decays(make_config, tmp_path):
    spec = _spec(make_config(learning_rate=1e-3, warmup_ratio=0.2, weight_decay=0.01), tmp_path)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer, scheduler = steps.build_optimizer(model, spec.config, total_steps=10)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
    lrs = []
    for _ in range(10):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == 0.0 and abs(lrs[2] - 1e-3) < 1e-12
    assert lrs[2:] == sorted(lrs[2:], reverse=True)


def test_cell_spec_round_trips(make_config, tmp_path):
    spec = _spec(make_config(epochs=3), tmp_path)
    spec.write()
    back = CellSpec.read(spec.cell_dir)
    assert back == spec and isinstance(back.paths, RunPaths)
