"""Shared fixtures: the real IMDB copy and bert-tiny tokenizer from ../shared/data."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data")).resolve()
IMDB_DIR = SHARED_DATA / "imdb"
BERT_TINY_DIR = SHARED_DATA / "bert-tiny"

logging.getLogger("py4j").setLevel(logging.WARNING)  # its shutdown chatter hits closed streams
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here; the hub code path is still exercised
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="session")
def _stop_spark_at_the_end():
    """Stop the SparkSession the tests shared, before the interpreter (and py4j) goes away."""
    yield
    if "pyspark" in sys.modules:
        from pyspark.sql import SparkSession

        session = SparkSession._instantiatedSession
        if session is not None:
            session.stop()


@pytest.fixture(autouse=True, scope="module")
def _no_tracking_uri_from_earlier_modules():
    """mlflow.set_tracking_uri() exports MLFLOW_TRACKING_URI in-process; load_config reads it.
    Module fixtures (built before function-scoped ones) must not inherit another test's store."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(autouse=True)
def _no_leaked_tracking_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="session")
def imdb_dir() -> Path:
    assert (IMDB_DIR / "train.parquet").exists(), f"real IMDB copy missing at {IMDB_DIR}"
    return IMDB_DIR


@pytest.fixture(scope="session")
def bert_tiny_dir() -> Path:
    assert (BERT_TINY_DIR / "vocab.txt").exists(), f"bert-tiny tokenizer missing at {BERT_TINY_DIR}"
    return BERT_TINY_DIR


@pytest.fixture
def make_config(tmp_path, imdb_dir, bert_tiny_dir):
    """``make_config(**overrides)`` -> smoke-profile BenchmarkConfig on the local real data."""
    from pipelines.config import load_config

    def _make(profile: str = "smoke", **overrides):
        base = dict(
            dataset_source=str(imdb_dir),
            tokenizer_source=str(bert_tiny_dir),
            model_source=str(bert_tiny_dir),
            output_root=str(tmp_path / "runs"),
        )
        base.update(overrides)
        return load_config(profile, base)

    return _make
