"""Checkpoints: weights-only readable, atomic, newest kept; RNG streams restored exactly."""

from __future__ import annotations

import random

import numpy as np
import torch

from pipelines.training import checkpoint as ckpt


def test_rng_state_round_trips_through_weights_only_load(tmp_path):
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    path = ckpt.save_checkpoint({"rng": [ckpt.rng_state()], "epoch": 1}, tmp_path, 1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    state = ckpt.load_checkpoint(path)  # weights_only=True inside
    ckpt.set_rng_state(state["rng"][0])
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1]
    assert np.random.rand() == expected[2]


def test_only_newest_checkpoint_is_kept_and_found(tmp_path):
    for epoch in (1, 2, 3):
        ckpt.save_checkpoint({"epoch": epoch, "w": torch.ones(2) * epoch}, tmp_path, epoch)
    assert [p.name for p in tmp_path.iterdir()] == ["epoch-0003.pt"]
    latest = ckpt.latest_checkpoint(tmp_path)
    assert ckpt.load_checkpoint(latest)["epoch"] == 3
    assert ckpt.latest_checkpoint(tmp_path / "nothing") is None
