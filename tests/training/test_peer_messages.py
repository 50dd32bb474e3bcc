"""What ranks send each other travels as JSON in tensors, never as a pickle
(``pipelines.training.outcome.all_gather_json``): torch.distributed has no authentication, and
``all_gather_object`` unpickles whatever a peer sends, which runs that peer's code.

Two real gloo ranks (mp.spawn): values come back in rank order; every rank's RNG streams gathered
the loop's way restore exactly (the checkpoint's ``rng``); a peer that sends a pickle gets a JSON
error on the other rank and its code never runs; a peer that claims a huge message is refused by
every rank before anything is allocated.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipelines.runfolder.paths import PROJECT_ROOT
from pipelines.training import checkpoint as ckpt
from pipelines.training.distributed import DistEnv
from pipelines.training.loop import rng_from_json, rng_to_json
from pipelines.training.outcome import MAX_GATHERED_BYTES, all_gather_json


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world: int) -> DistEnv:
    return DistEnv(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"))


class _Planted:
    """What a hostile peer would send through a pickle: unpickling it writes a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "a peer's code ran"))


def _send_raw(payload: bytes, claimed: int | None = None) -> None:
    """What a peer outside the protocol sends: a length, then bytes of its choice."""
    dist.all_gather([torch.empty(1, dtype=torch.int64) for _ in range(2)],
                    torch.tensor([claimed if claimed is not None else len(payload)], dtype=torch.int64))
    if claimed is None:
        mine = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        dist.all_gather([torch.empty_like(mine) for _ in range(2)], mine)


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out: dict = {}
    try:
        env = _env(rank, world)
        out["gathered"] = all_gather_json({"rank": rank, "label": f"cpu:{rank}", "pair": (rank, None)}, env)

        torch.manual_seed(100 + rank)  # each rank its own streams, moved on a little
        random.seed(200 + rank)
        np.random.seed(300 + rank)
        random.gauss(0, 1)
        np.random.standard_normal()
        mine = ckpt.rng_state()
        rngs = [rng_from_json(m) for m in all_gather_json(rng_to_json(mine), env)]  # as _checkpoint does
        path = ckpt.save_checkpoint({"rng": rngs, "epoch": 1}, Path(out_dir) / f"ckpt{rank}", 1)
        expected = (torch.rand(3).tolist(), random.random(), np.random.rand(3).tolist(), random.gauss(0, 1))
        torch.manual_seed(0), random.seed(0), np.random.seed(0)  # lose the streams, then resume them
        ckpt.rank_rng(ckpt.load_checkpoint(path)["rng"], rank, seed=42)
        resumed = (torch.rand(3).tolist(), random.random(), np.random.rand(3).tolist(), random.gauss(0, 1))
        out["rng_restored"] = resumed == expected
        out["rng_same_as_sent"] = torch.equal(rngs[rank]["torch"], mine["torch"]) and \
            rngs[rank]["python"] == mine["python"] and torch.equal(rngs[rank]["numpy"][1], mine["numpy"][1])

        marker = Path(out_dir) / "planted-code-ran"
        if rank == 1:  # a hostile peer sends a pickle where JSON is expected
            _send_raw(pickle.dumps(_Planted(str(marker))))
        else:
            try:
                all_gather_json("hello", env)
            except RuntimeError as err:
                out["pickle_refused"] = str(err)
        dist.barrier()
        out["planted_code_ran"] = marker.exists()

        if rank == 1:  # and then claims a message far over the limit
            _send_raw(b"", claimed=2**40)
        else:
            try:
                all_gather_json("x", env)
            except RuntimeError as err:
                out["oversize_refused"] = str(err)
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


@pytest.mark.slow  # two gloo ranks (mp.spawn)
def test_ranks_exchange_json_in_tensors_and_never_unpickle_a_peer(tmp_path):
    mp.spawn(_rank_main, args=(2, _free_port(), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    sent = [{"rank": r, "label": f"cpu:{r}", "pair": [r, None]} for r in range(2)]
    assert ranks[0]["gathered"] == ranks[1]["gathered"] == sent  # rank order, on every rank
    assert all(r["rng_restored"] and r["rng_same_as_sent"] for r in ranks), ranks
    assert "rank 1's message is not JSON" in ranks[0]["pickle_refused"] and not ranks[0]["planted_code_ran"]
    assert f"each must be 1 to {MAX_GATHERED_BYTES}" in ranks[0]["oversize_refused"]


def test_one_rank_gets_the_same_json_shapes_as_many():
    """No process group: the value round-trips through JSON, as it would from a peer."""
    assert all_gather_json({"pair": (1, "a")}, _env(0, 1)) == [{"pair": [1, "a"]}]


def test_nothing_in_the_pipelines_unpickles_what_a_peer_sends():
    """torch.distributed's object collectives pickle and unpickle: none is called anywhere."""
    calls = re.compile(r"\b(all_gather_object|gather_object|broadcast_object_list|scatter_object_list|"
                       r"send_object_list|recv_object_list)\(")
    found = [f"{path.relative_to(PROJECT_ROOT)}:{n}" for path in (PROJECT_ROOT / "pipelines").rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if calls.search(line)]
    assert not found, found
