"""Fixtures for the data-stage tests: small real-IMDB sources and one shared SparkSession."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest


@pytest.fixture(scope="session")
def real_rows(imdb_dir) -> dict[str, pd.DataFrame]:
    """20 real reviews per label for each split (the source files are sorted by label)."""
    out = {}
    for split in ("train", "test"):
        frame = pd.read_parquet(imdb_dir / f"{split}.parquet")
        out[split] = pd.concat(
            [frame[frame.label == 0].head(20), frame[frame.label == 1].head(20)], ignore_index=True
        )
    return out


@pytest.fixture
def write_source(tmp_path, real_rows):
    """``write_source(train=df, test=df)`` -> a local parquet source folder (real rows by default)."""

    def _write(name: str = "source", **frames: pd.DataFrame) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for split in ("train", "test"):
            frames.get(split, real_rows[split]).to_parquet(folder / f"{split}.parquet", index=False)
        return folder

    return _write


@pytest.fixture(scope="package")
def spark():
    """One local[2] session for every Spark test here (start-up costs ~8 s). Package scope: it
    ends with this folder, before other folders' tests run Spark cells (a cell starts a fresh
    session and ends its JVM, which would leave this one dead until the end of the run)."""
    from pipelines.engines.spark.session import get_spark, stop_spark

    session = get_spark("local[2]", app_name="tests-data", conf={"spark.ui.showConsoleProgress": "false"})
    yield session
    stop_spark(jvm=True)
