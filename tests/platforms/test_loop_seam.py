"""The loop seam: a framework that owns the process group and the model wrapper (Ray Train,
FSDP) hands them to the shared loop instead of copying it. Runs the real loop in-process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pipelines.platforms.ddp.adapter import DDPBackend
from pipelines.training.cell import CellSpec
from pipelines.runfolder.paths import CellPaths
from pipelines.runfolder.results import CellResult
from pipelines.training.distributed import TorchDistributed
from pipelines.training.loop import run_training


class FrameworkOwned(TorchDistributed):
    """Stands in for a framework's integration: it wraps the model its own way (a marker
    module around it) and prepares loaders; the process group was created by someone else."""

    def __init__(self):
        super().__init__()
        self.wrapped: list[torch.nn.Module] = []
        self.prepared = 0

    def wrap_model(self, model, env):
        class FrameworkWrapper(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.module = inner

            def forward(self, **kwargs):
                return self.module(**kwargs)

        wrapper = FrameworkWrapper(model)
        self.wrapped.append(wrapper)
        return wrapper

    def prepare_loader(self, loader, env):
        self.prepared += 1
        return loader


@pytest.mark.slow  # trains in-process, and the torchrun reference cell
def test_a_framework_wrapper_and_its_process_group_are_used_and_left_alone(bench_config, run_paths,
                                                                           tmp_path, trained):
    cell = CellPaths(run_paths.cells / "seam-w1")
    spec: CellSpec = DDPBackend().spec(bench_config, 1, run_paths, cell, 0)
    spec.write()
    # the "framework" owns a (one-process) group before the loop starts
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        seam = FrameworkOwned()
        run_training(spec, launch_time=0.0, distributed=seam)
        assert dist.is_initialized(), "the loop destroyed a process group it did not create"
    finally:
        dist.destroy_process_group()
    assert len(seam.wrapped) == 1 and seam.prepared == 1
    result = CellResult.read(cell.worker_result)
    reference = trained("ddp", 1)  # same loop through torchrun and plain DDP wrapping
    assert [e.epoch for e in result.epochs] == [1, 2]
    for mine, theirs in zip(result.epochs, reference.epochs, strict=True):
        assert mine.train_loss == theirs.train_loss or abs(mine.train_loss - theirs.train_loss) < 1e-6


def test_default_seam_creates_and_destroys_its_own_group(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "1")
    seam = TorchDistributed()
    env = seam.setup()
    assert env.world_size == 1 and not seam.created_group and not dist.is_initialized()
    model = torch.nn.Linear(2, 2)
    assert seam.wrap_model(model, env) is model  # one process: nothing to synchronise
    seam.teardown()
