"""The test platforms' config: tiny CPU settings on the real IMDB copy and bert-tiny."""

from __future__ import annotations

import pytest

from pipelines.config import load_config


@pytest.fixture
def bench_config(tmp_path, imdb_dir, bert_tiny_dir):
    return load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
        output_root=str(tmp_path / "runs"), max_seq_len=32, epochs=1, batch_size=16,
        batch_policy="per_worker", learning_rate=5e-4, seed=42, spark_master="local[2]"))
