"""Session fixtures: token shards from a small stratified slice of the real IMDB copy, and a
cache so each (backend, world size) cell trains once per test session."""

from __future__ import annotations

import pytest

from pipelines import platforms
from pipelines.config import load_config
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

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
