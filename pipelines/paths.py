"""The run folder: every stage reads from and writes into ``<output_root>/<run_id>/``.

A retry, a resume or a re-report needs nothing but this folder:

    config.json                                   resolved BenchmarkConfig
    snapshot/{train,test}.parquet, manifest.json  ingest
    validation/*.json, validation/data_docs/      Great Expectations results (kept either way)
    tokens/{train,test}/part-*.parquet            Spark tokenization
    cells/<backend>-w<N>-r<repeat>/               one training cell: checkpoints/, result.json
    report/                                       report.html, report.md, *.png, summary.json
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


def safe_run_id(raw: str) -> str:
    """Airflow run ids contain ':' and '+'; keep folder names portable."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("_") or "run"


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def snapshot(self) -> Path:
        return self.root / "snapshot"

    @property
    def manifest(self) -> Path:
        return self.snapshot / "manifest.json"

    @property
    def validation(self) -> Path:
        return self.root / "validation"

    @property
    def data_docs(self) -> Path:
        return self.validation / "data_docs"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens"

    def token_split(self, split: str) -> Path:
        return self.tokens / split

    @property
    def cells(self) -> Path:
        return self.root / "cells"

    def cell(self, backend: str, workers: int, repeat: int) -> Path:
        return self.cells / f"{getattr(backend, 'value', backend)}-w{workers}-r{repeat}"

    @property
    def report(self) -> Path:
        return self.root / "report"
