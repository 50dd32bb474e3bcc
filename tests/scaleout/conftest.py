"""Scale-out fixtures: token shards of a small stratified slice of the real IMDB copy, the
config every scale-out cell uses, free loopback ports, and the single-node reference result
(DDP, 2 processes on one node) that the multi-node and cluster runs must reproduce."""

from __future__ import annotations

import socket

import pytest

from pipelines.config import load_config
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

# 128 train / 64 test reviews, seq 64, batch 16: 4 steps per epoch at world size 2.
TRAIN_PER_CLASS, TEST_PER_CLASS, SEQ_LEN = 64, 32, 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def free_port():
    """``free_port()`` -> a TCP port free on 127.0.0.1 right now (the OS picks it)."""
    return _free_port


@pytest.fixture(scope="session")
def scaleout_paths(tmp_path_factory, imdb_dir, bert_tiny_dir) -> RunPaths:
    return write_token_shards(RunPaths(tmp_path_factory.mktemp("scaleout-run")), imdb_dir, bert_tiny_dir,
                              train_per_class=TRAIN_PER_CLASS, test_per_class=TEST_PER_CLASS,
                              seq_len=SEQ_LEN, seed=11)


@pytest.fixture(scope="session")
def scaleout_config(scaleout_paths, imdb_dir, bert_tiny_dir):
    """``scaleout_config(**overrides)`` -> the tiny CPU config (2 epochs, batch 16, seq 64)."""
    base = {
        "dataset_source": str(imdb_dir), "tokenizer_source": str(bert_tiny_dir),
        "model_source": str(bert_tiny_dir), "output_root": str(scaleout_paths.root.parent),
        "max_seq_len": SEQ_LEN, "epochs": 2, "batch_size": 16, "batch_policy": "per_worker",
        "learning_rate": 5e-4, "seed": 42,
    }

    def _make(**overrides):
        return load_config("smoke", {**base, **overrides})

    return _make


@pytest.fixture(scope="session")
def single_node_w2(scaleout_config, scaleout_paths):
    """Reference: DDP on one node with 2 processes (torchrun --standalone)."""
    from pipelines.run.cells import run_cell

    result = run_cell(scaleout_config(), scaleout_paths, "ddp", 2, repeat=0)
    assert result.status == "ok" and result.world_size == 2
    return result


def _assert_same_training(result, reference) -> None:
    assert [e.epoch for e in result.epochs] == [e.epoch for e in reference.epochs] == [1, 2]
    for got, want in zip(result.epochs, reference.epochs, strict=True):
        assert got.train_loss == pytest.approx(want.train_loss, abs=1e-6)
        assert got.eval_loss == pytest.approx(want.eval_loss, abs=1e-6)
        assert got.eval_accuracy == want.eval_accuracy
    assert result.test.confusion_matrix == reference.test.confusion_matrix
    assert result.train_samples == reference.train_samples == 2 * TRAIN_PER_CLASS
    assert result.test_samples == reference.test_samples == 2 * TEST_PER_CLASS


@pytest.fixture(scope="session")
def assert_same_training():
    """``assert_same_training(result, reference)``: same data, seed and world size -> the same
    per-epoch losses, held-out accuracy and test predictions."""
    return _assert_same_training
