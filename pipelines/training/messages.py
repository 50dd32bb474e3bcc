"""Messages between the ranks of a cell as JSON: ``all_gather_json``, the one way a rank reads what
its peers send besides tensors (the shared loop's RNG states and step times, a cell's devices and
placements, a pipeline's stage metadata). A leaf below every training module that gathers."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from pipelines.training.distributed import DistEnv

# what one rank may send through ``all_gather_json``: far above what a rank sends (its step times),
# far below what would exhaust a peer's memory
MAX_GATHERED_BYTES = 64 * 2**20


def all_gather_json(value, env: DistEnv) -> list:
    """``value`` (JSON types) from every rank, in rank order, the same on every rank.

    It travels as UTF-8 JSON in uint8 tensors (every length first, then the payloads padded to the
    longest): torch.distributed has no authentication, and ``all_gather_object`` unpickles what a
    peer sends, which runs whatever code that peer put in. Tuples come back as lists, on one rank too.
    """
    data = json.dumps(value).encode()
    if env.world_size == 1:
        return [json.loads(data)]
    length = torch.tensor([len(data)], dtype=torch.int64, device=env.device)
    lengths = [torch.empty_like(length) for _ in range(env.world_size)]
    dist.all_gather(lengths, length)
    sizes = [int(n.item()) for n in lengths]
    if not all(0 < n <= MAX_GATHERED_BYTES for n in sizes):  # every rank sees the same sizes: all refuse
        raise RuntimeError(f"all_gather_json: the ranks' messages are {sizes} bytes; each must be 1 to "
                           f"{MAX_GATHERED_BYTES}")
    mine = torch.zeros(max(sizes), dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    mine = mine.to(env.device)
    gathered = [torch.empty_like(mine) for _ in sizes]
    dist.all_gather(gathered, mine)
    return [_parsed(t[:n].cpu().numpy().tobytes(), rank) for rank, (t, n) in enumerate(zip(gathered, sizes))]


def _parsed(message: bytes, rank: int):
    try:
        return json.loads(message)
    except ValueError as err:  # not UTF-8, not JSON: a peer outside the protocol
        raise RuntimeError(f"all_gather_json: rank {rank}'s message is not JSON ({err})") from None
