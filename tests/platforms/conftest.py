"""The platforms' test fixtures: tiny CPU settings on the real IMDB copy and bert-tiny.

- ``one_epoch_config``: a fresh config per test (1 epoch, seq 32, its own output root).
- ``run_paths`` / ``bench_config`` / ``trained``: token shards from a small stratified slice of the
  real IMDB copy, and a cache so each (backend, world size) cell trains once per test session.
- ``scaleout_*`` / ``single_node_w2`` / ``assert_same_training`` / ``free_port``: the config every
  scale-out cell uses (multi-node DDP, a Spark standalone cluster), free loopback ports, and the
  single-node reference result (DDP, 2 processes on one node) those runs must reproduce.
"""

from __future__ import annotations

import socket

import pytest

from pipelines import platforms
from pipelines.config import load_config
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards


@pytest.fixture
def one_epoch_config(tmp_path, imdb_dir, bert_tiny_dir):
    return load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
        output_root=str(tmp_path / "runs"), max_seq_len=32, epochs=1, batch_size=16,
        batch_policy="per_worker", learning_rate=5e-4, seed=42, spark_master="local[2]"))


# --- session cells: each (backend, world size) trains once ------------------------------------------

TRAIN_PER_CLASS, TEST_PER_CLASS, SEQ_LEN = 128, 64, 64


@pytest.fixture(scope="session")
def run_paths(tmp_path_factory, imdb_dir, bert_tiny_dir) -> RunPaths:
    return write_token_shards(RunPaths(tmp_path_factory.mktemp("run")), imdb_dir, bert_tiny_dir,
                              train_per_class=TRAIN_PER_CLASS, test_per_class=TEST_PER_CLASS,
                              seq_len=SEQ_LEN, seed=7)


@pytest.fixture(scope="session")
def bench_config(run_paths, imdb_dir, bert_tiny_dir):
    """Tiny CPU settings: 2 epochs of 256 reviews, batch 16, seq 64."""
    return load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir),
        model_source=str(bert_tiny_dir), output_root=str(run_paths.root.parent),
        max_seq_len=SEQ_LEN, epochs=2, batch_size=16, batch_policy="per_worker", learning_rate=5e-4,
        seed=42, spark_master="local[2]",
    ))


@pytest.fixture(scope="session")
def trained(bench_config, run_paths):
    """``trained(backend, workers)`` -> CellResult, trained once per session."""
    from pipelines.run.cells import run_cell

    cache = {}

    def _get(backend: str, workers: int):
        if (backend, workers) not in cache:
            cache[backend, workers] = run_cell(bench_config, run_paths, platforms.check_name(backend), workers, 0)
        return cache[backend, workers]

    return _get


# --- scale-out: multi-node DDP and a Spark standalone cluster against one node ---------------------

# 128 train / 64 test reviews, seq 64, batch 16: 4 steps per epoch at world size 2.
SCALEOUT_TRAIN_PER_CLASS, SCALEOUT_TEST_PER_CLASS, SCALEOUT_SEQ_LEN = 64, 32, 64


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
                              train_per_class=SCALEOUT_TRAIN_PER_CLASS,
                              test_per_class=SCALEOUT_TEST_PER_CLASS, seq_len=SCALEOUT_SEQ_LEN, seed=11)


@pytest.fixture(scope="session")
def scaleout_config(scaleout_paths, imdb_dir, bert_tiny_dir):
    """``scaleout_config(**overrides)`` -> the tiny CPU config (2 epochs, batch 16, seq 64)."""
    base = {
        "dataset_source": str(imdb_dir), "tokenizer_source": str(bert_tiny_dir),
        "model_source": str(bert_tiny_dir), "output_root": str(scaleout_paths.root.parent),
        "max_seq_len": SCALEOUT_SEQ_LEN, "epochs": 2, "batch_size": 16, "batch_policy": "per_worker",
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
    assert result.train_samples == reference.train_samples == 2 * SCALEOUT_TRAIN_PER_CLASS
    assert result.test_samples == reference.test_samples == 2 * SCALEOUT_TEST_PER_CLASS


@pytest.fixture(scope="session")
def assert_same_training():
    """``assert_same_training(result, reference)``: same data, seed and world size -> the same
    per-epoch losses, held-out accuracy and test predictions."""
    return _assert_same_training


# --- coverage: which cases this session runs ----------------------------------------------------------

@pytest.fixture
def runs_here(request):
    """``runs_here(marks)`` -> whether a case with these marks runs in this session: a ``heavy`` case only
    where ``-m`` does not leave the heavy tier out (scripts/test.sh and CI do, bench/heavy_tier.sh does not).
    Coverage tests count only the cases that run, so CI's green never rests on a deselected one."""
    heavy_out = "not heavy" in (request.config.option.markexpr or "")

    def _runs(marks) -> bool:
        return not (heavy_out and any(getattr(m, "name", None) == "heavy" for m in marks))

    return _runs
