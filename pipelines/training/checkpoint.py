"""Per-epoch checkpoints of the shared training loop: ``<cell>/checkpoints/epoch-NNNN.pt``.

Written by rank 0 only, atomically (``pipelines.fileio.atomic_write``: temp file, fsync,
rename), so a kill mid-write leaves the previous checkpoint intact; only the newest one is kept (~50 MB for BERT-tiny + AdamW).
Everything stored is tensors or plain Python types, so reading back works with
``torch.load(..., weights_only=True)`` and no pickled code is ever executed.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipelines.fileio import atomic_write

PATTERN = "epoch-*.pt"


def save_checkpoint(state: dict[str, Any], directory: Path, epoch: int) -> Path:
    path = Path(directory) / f"epoch-{epoch:04d}.pt"
    atomic_write(path, lambda fh: torch.save(state, fh))
    for old in directory.glob(PATTERN):  # keep the newest only
        if old != path:
            old.unlink(missing_ok=True)
    return path


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(Path(directory).glob(PATTERN))
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


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
