"""A DeepSpeed resume loads only the cell's own checkpoint, tensors only
(``pipelines.platforms.deepspeed.engine``: ``DeepSpeedEngine.load_state``, ``TensorsOnlyLoads``).

The run folder is writable by several services: a loop checkpoint whose recorded DeepSpeed folder
lies elsewhere (a path, a link, a tag that climbs out) is refused before DeepSpeed reads anything;
with two real gloo ranks and real DeepSpeed (ZeRO-2 and ZeRO-3), a checkpoint written by the cell
loads back with ``weights_only=True`` (the exact weights), while a file inside it that links out
of the folder, or that holds a pickle which would run code, is refused and runs nothing.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("deepspeed")

from pipelines.platforms.deepspeed.engine import CHECKPOINT_FOLDER, DeepSpeedEngine, ds_config  # noqa: E402


def _engine(checkpoints: Path) -> DeepSpeedEngine:
    return DeepSpeedEngine(ds_config(4, 2, 2, "none", comms_logger=False), True, checkpoints)


@pytest.mark.parametrize("recorded", ["elsewhere", "link", "climbs"])
def test_a_checkpoint_naming_a_folder_outside_the_cell_is_refused(tmp_path, recorded):
    checkpoints = tmp_path / "cell" / "checkpoints"
    own = checkpoints / CHECKPOINT_FOLDER
    own.mkdir(parents=True)
    outside = tmp_path / "outside"
    (outside / "epoch-0001").mkdir(parents=True)
    state = {"engine_dir": str(outside), "engine_tag": "epoch-0001"}
    if recorded == "link":  # the cell's own name, a link planted in the shared run folder
        (own / "epoch-0001").symlink_to(outside / "epoch-0001", target_is_directory=True)
        state = {"engine_dir": str(own), "engine_tag": "epoch-0001"}
    elif recorded == "climbs":
        state = {"engine_dir": str(own), "engine_tag": "../../../outside/epoch-0001"}
    with pytest.raises(PermissionError, match=rf"not a tag folder of this cell's own {own}: refused"):
        _engine(checkpoints).load_state(state)  # before DeepSpeed is even started


# --- real DeepSpeed, two gloo ranks ------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Planted:
    """A pickle that writes a file when unpickled: what a hostile service could put in the folder."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "code ran"))


def _attached(stage: int, checkpoints: Path, seed: int) -> DeepSpeedEngine:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    config = ds_config(4, 2, stage, "none", comms_logger=False)
    engine = DeepSpeedEngine(config, dist.get_rank() == 0, checkpoints)
    engine.attach(model, model, optimizer, scheduler, runtime=None)
    return engine


def _weights(engine: DeepSpeedEngine) -> list[float]:
    import deepspeed

    params = list(engine.ds.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=engine.ds.zero_optimization_stage() == 3):
        return torch.cat([p.detach().reshape(-1) for p in params]).tolist()


def _load_outcome(engine: DeepSpeedEngine, state: dict) -> str:
    try:
        engine.load_state(state)
        return "loaded"
    except Exception as err:  # what each rank saw, for the test to check
        return f"{type(err).__name__}: {err}"


def _rank_main(rank: int, world: int, port: int, stage: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(world), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed

    from pipelines.platforms.deepspeed.worker import skip_op_builds

    skip_op_builds()  # no op compiled (the platform's worker does the same)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    out: dict = {}
    checkpoints = Path(out_dir) / "cell" / "checkpoints"
    try:
        trained = _attached(stage, checkpoints, seed=1)
        loss = trained.ds(torch.randn(4, 8)).pow(2).sum()
        trained.backward(loss)
        trained.step()
        state = trained.state_dict(1, checkpoints)
        saved = _weights(trained)

        fresh = _attached(stage, checkpoints, seed=2)
        out["loaded"] = _load_outcome(fresh, state)
        out["same_weights"] = _weights(fresh) == saved
        dist.barrier()

        tag = checkpoints / CHECKPOINT_FOLDER / "epoch-0001"
        model_files = sorted(tag.glob("*model_states.pt"))
        marker = Path(out_dir) / "planted-code-ran"
        if rank == 0:  # every model file replaced by a pickle that would run code
            for path in model_files:
                torch.save({"module": _Planted(str(marker))}, path)
        dist.barrier()
        out["planted_pickle"] = _load_outcome(_attached(stage, checkpoints, seed=2), state)
        out["planted_code_ran"] = marker.exists()
        dist.barrier()

        if rank == 0:  # every model file a link to a file outside the cell
            outside = Path(out_dir) / "outside.pt"
            torch.save({"module": {}}, outside)
            for path in model_files:
                path.unlink()
                path.symlink_to(outside)
        dist.barrier()
        out["linked_out"] = _load_outcome(_attached(stage, checkpoints, seed=2), state)
        # both ranks past their last load before either tears gloo down: a rank leaving while its
        # peer is still in the load's collectives aborts the peer ("terminate called", SIGABRT)
        dist.barrier()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


@pytest.mark.slow  # two gloo ranks with real DeepSpeed
# ZeRO-3's partitioned files in the heavy tier (CI time): ZeRO-2's cover the same loader
@pytest.mark.parametrize("stage", [2, pytest.param(3, marks=pytest.mark.heavy)])
def test_a_resume_loads_the_cells_own_files_as_tensors_and_refuses_planted_ones(tmp_path, stage):
    mp.spawn(_rank_main, args=(2, _free_port(), stage, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["loaded"] == "loaded" and r["same_weights"], r  # weights_only=True takes DeepSpeed's own
        assert r["planted_pickle"].startswith("UnpicklingError: Weights only load failed"), r
        assert not r["planted_code_ran"]
        assert r["linked_out"].startswith("PermissionError: DeepSpeed's checkpoint file"), r
        own = (tmp_path / "cell" / "checkpoints" / CHECKPOINT_FOLDER).resolve()
        assert f"outside this cell's {own}: refused" in r["linked_out"], r
