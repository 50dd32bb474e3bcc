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


def test_the_two_newest_checkpoints_are_kept_with_checksums(tmp_path):
    for epoch in (1, 2, 3):
        ckpt.save_checkpoint({"epoch": epoch, "w": torch.ones(2) * epoch}, tmp_path, epoch)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "epoch-0002.pt", "epoch-0002.pt.sha256", "epoch-0003.pt", "epoch-0003.pt.sha256"]
    latest = ckpt.latest_checkpoint(tmp_path)
    assert ckpt.load_checkpoint(latest)["epoch"] == 3
    assert ckpt.latest_checkpoint(tmp_path / "nothing") is None


def test_a_damaged_checkpoint_is_moved_aside_and_the_previous_one_used(tmp_path, caplog):
    for epoch in (1, 2):
        ckpt.save_checkpoint({"epoch": epoch}, tmp_path, epoch)
    newest = tmp_path / "epoch-0002.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated: a disk that filled up, a bad copy
    path, state = ckpt.latest_good_checkpoint(tmp_path)
    assert path.name == "epoch-0001.pt" and state["epoch"] == 1
    aside = list(tmp_path.glob("epoch-0002.pt.corrupt-*"))
    assert len(aside) == 2 and not newest.exists()  # the file and its checksum, kept for inspection
    assert "checksum mismatch" in caplog.text and "moved aside" in caplog.text


def test_with_no_good_checkpoint_the_cell_starts_over_loudly(tmp_path, caplog):
    ckpt.save_checkpoint({"epoch": 1}, tmp_path, 1)
    (tmp_path / "epoch-0001.pt.sha256").unlink()  # the write never finished
    assert ckpt.latest_good_checkpoint(tmp_path) == (None, None)
    assert "starts over from epoch 1" in caplog.text
