"""Per-epoch checkpoints of the shared training loop: ``<cell>/checkpoints/epoch-NNNN.pt``.

Written by rank 0 only, atomically (``pipelines.runfolder.fileio.atomic_write``: temp file, fsync,
rename), each with a ``.sha256`` sidecar written after it; the newest ``KEEP`` are kept (~50 MB
each for BERT-tiny + AdamW). ``latest_good_checkpoint`` verifies the checksum and that the file
loads before anything resumes from it: a checkpoint that fails either is moved aside as
``<name>.corrupt-<time>`` (kept for inspection, named in a warning) and the previous one is tried;
with none left the cell starts over, saying so. Everything stored is tensors or plain Python
types, so reading back works with ``torch.load(..., weights_only=True)`` and no pickled code is
ever executed.

Resuming at another world size (an elastic launcher that lost or regained a node, or a retry on
fewer hosts) is allowed: the model and optimizer state are whole on every rank, the scheduler is
placed at the same fraction of training (``place_scheduler``: the step count at the new steps per
epoch), ranks that did not exist when the checkpoint was written are seeded (``rank_rng``), and
rank 0 notes each start's world size in ``<cell>/world_sizes.json`` (``note_world_size``).
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipelines.runfolder.fileio import atomic_write, atomic_write_json, atomic_write_text, read_json_list

log = logging.getLogger(__name__)
PATTERN = "epoch-*.pt"
KEEP = 2  # the newest and the one before: something to fall back on if the newest is damaged


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def save_checkpoint(state: dict[str, Any], directory: Path, epoch: int) -> Path:
    path = Path(directory) / f"epoch-{epoch:04d}.pt"
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    atomic_write(path, lambda fh: fh.write(data))
    atomic_write_text(_sidecar(path), hashlib.sha256(data).hexdigest())
    for old in sorted(Path(directory).glob(PATTERN))[:-KEEP]:
        old.unlink(missing_ok=True)
        _sidecar(old).unlink(missing_ok=True)
    return path


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(Path(directory).glob(PATTERN))
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def _verified(path: Path) -> dict[str, Any]:
    """The checkpoint's state, or ValueError saying what is wrong with the file."""
    sidecar = _sidecar(path)
    if not sidecar.exists():
        raise ValueError("no checksum file (written after the checkpoint: the write never finished)")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sidecar.read_text().strip():
        raise ValueError(f"checksum mismatch ({len(data)} bytes on disk)")
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # a torch.load error of any kind means: not usable
        raise ValueError(f"cannot be loaded ({type(err).__name__}: {err})") from None


def latest_good_checkpoint(directory: Path, move_aside: bool = True) -> tuple[Path | None, dict | None]:
    """Newest checkpoint that verifies, moving damaged ones aside (``move_aside``: rank 0 only;
    the other ranks skip the same files, so every rank resumes from the same one)."""
    for path in sorted(Path(directory).glob(PATTERN), reverse=True):
        try:
            return path, _verified(path)
        except (OSError, ValueError) as err:
            if move_aside:
                aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
                path.replace(aside)
                if _sidecar(path).exists():
                    _sidecar(path).replace(aside.with_name(aside.name + ".sha256"))
                log.warning("checkpoint %s is damaged (%s): moved aside to %s; trying the previous one",
                            path, err, aside)
            else:
                log.warning("checkpoint %s is damaged (%s): skipped", path, err)
    if any(Path(directory).glob("epoch-*.pt.corrupt-*")):
        log.warning("no usable checkpoint left in %s: this cell starts over from epoch 1", directory)
    return None, None


def rng_state() -> dict[str, Any]:
    """This process's RNG streams as tensors / plain types (weights_only-safe)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# --- resuming at another world size ---------------------------------------------------------
WORLD_SIZES = "world_sizes.json"


def place_scheduler(scheduler, step: int) -> list[float]:
    """Put a per-step ``LambdaLR`` (the loop's warm-up + linear decay) at ``step`` and set its
    optimizer's learning rates to match -> the new rates. A checkpoint holds the step count at the
    world size that wrote it; at another world size an epoch has another number of steps, so the
    same point of training is ``epochs_done * steps_per_epoch`` at the new size."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:
        raise TypeError(f"cannot resume {type(scheduler).__name__} at another world size: only a LambdaLR "
                        "schedule (the loop's warm-up + linear decay) can be moved to another step count")
    scheduler.last_epoch = int(step)
    rates = [base * fn(int(step)) for base, fn in zip(scheduler.base_lrs, lambdas)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = rate
    scheduler._last_lr = list(rates)  # what get_last_lr() reports (torch keeps it here)
    return rates


def rank_rng(states: list, rank: int, seed: int) -> None:
    """Restore ``rank``'s RNG streams from a checkpoint's per-rank ``states``; a rank that did not
    exist then (the world grew) gets streams seeded from ``seed`` + rank, reproducible."""
    if rank < len(states):
        set_rng_state(states[rank])
        return
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)


def note_world_size(cell_dir: Path, epoch: int, world_size: int, first_step_at: float) -> list[dict]:
    """Rank 0, at the first step of each start of the workers: training runs from ``epoch``
    (0-based, epochs done) at ``world_size``. A start from scratch begins a new list."""
    entry = {"epoch": int(epoch), "world_size": int(world_size), "first_step_at": float(first_step_at)}
    entries = world_sizes(cell_dir) if epoch > 0 else []
    entries.append(entry)
    atomic_write_json(Path(cell_dir) / WORLD_SIZES, entries)
    return entries


def world_sizes(cell_dir: Path) -> list[dict]:
    """Every start's ``{"epoch", "world_size", "first_step_at"}`` noted in the cell, oldest first."""
    return read_json_list(Path(cell_dir) / WORLD_SIZES)
