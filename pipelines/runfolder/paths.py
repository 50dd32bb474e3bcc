"""The run folder: every stage reads from and writes into ``<output_root>/<run_id>/``.

A retry, a resume or a re-report needs nothing but this folder. ``RunPaths`` (the run) and
``CellPaths`` (one training cell) own every file name in it; no other module spells one.

    config.json                                   resolved BenchmarkConfig
    mlflow.json                                   MLflow parent run id per tracking URI
    airflow.json                                  the Airflow DAG run (dag_id, run_id, started)
    snapshot/{train,test}.parquet, manifest.json  ingest
    validation/<stage>_<split>.json, <stage>_summary.json, data_docs/   Great Expectations
    tokens/{train,test}/part-*.parquet            the data stage's tokenization (pipelines.data.preprocess)
    cells/<backend>[-<strategy>]-w<N>-r<repeat>/  one training cell (see CellPaths)
    report/summary.json, report.{html,md}, *.png, regression.json       evaluation + report

``PROJECT_ROOT`` is the checkout this package lives in (the one definition of it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def safe_run_id(raw: str) -> str:
    """A folder name for a run id: portable, never ``.``/``..``/hidden, and unique.

    Airflow run ids contain ':' and '+'. Characters outside ``[A-Za-z0-9._-]`` become ``_`` and
    leading/trailing dots and dashes go; whenever that changed the id, a short hash of the raw id
    is appended, so two run ids never share a folder (``a:b`` and ``a+b`` stay apart).
    """
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("._-")
    if clean == raw and clean:
        return clean
    return f"{clean or 'run'}-{hashlib.sha256(raw.encode()).hexdigest()[:8]}"


DEFAULT_STRATEGY = "default"  # pipelines.config.TrainingStrategy's name when nothing is changed
DEFAULT_NETWORK = "local"  # a cell on this one host (pipelines.config: matrix.networks)


def cell_name(backend: str, workers: int, repeat: int, strategy: str = DEFAULT_STRATEGY,
              network: str = DEFAULT_NETWORK) -> str:
    """``<backend>-w2-r0`` (default strategy, on this host), ``<backend>-powersgd-r2-w2-r0`` or
    ``<backend>-powersgd-r2-100mbit-w2-r0`` (across hosts linked at 100 Mbit/s): the folder name, MLflow
    run name and report key of one cell."""
    middle = "" if strategy in (None, DEFAULT_STRATEGY) else f"-{strategy}"
    middle += "" if network in (None, DEFAULT_NETWORK) else f"-{network}"
    return f"{backend}{middle}-w{workers}-r{repeat}"


@dataclass(frozen=True)
class CellPaths:
    """One training cell's folder ``cells/<backend>-w<N>-r<repeat>/``."""

    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def spec(self) -> Path:  # the driver -> worker contract (pipelines.training.cell.CellSpec)
        return self.root / "cell.json"

    @property
    def worker_result(self) -> Path:  # written by rank 0, read back by the adapter
        return self.root / "worker_result.json"

    @property
    def result(self) -> Path:  # the cell's final record (pipelines.runfolder.results.CellResult)
        return self.root / "result.json"

    @property
    def log(self) -> Path:
        return self.root / "train.log"

    @property
    def attempts(self) -> Path:  # every attempt of the cell (pipelines.measure.attempts)
        return self.root / "attempts.json"

    @property
    def placements(self) -> Path:  # across hosts: which host each rank ran on
        return self.root / "placements.json"

    @property
    def link_bytes(self) -> Path:  # across hosts: bytes each host's interface moved during the launch
        return self.root / "link_bytes.json"

    @property
    def heartbeat(self) -> Path:  # touched by rank 0 while training: a killed attempt's end
        return self.root / "heartbeat"

    def node_log(self, node_rank: int) -> Path:  # multi-node ddp: nodes > 0 log here
        return self.root / f"train-node{node_rank}.log"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model(self) -> Path:  # the trained model in Hugging Face format
        return self.root / "model"

    @property
    def tensorboard(self) -> Path:  # TensorBoard event files (pipelines.measure.tensorboard)
        return self.root / "tensorboard"

    @property
    def mlflow_run(self) -> Path:
        return self.root / "mlflow_run.json"

    @property
    def provision(self) -> Path:  # {"seconds": ...}: the platform's cluster brought up inside the cell
        return self.root / "provision.json"

    @property
    def platform_checkpoint(self) -> Path:  # a platform keeping its own checkpoints: {"epochs": N} of its newest
        return self.root / "platform_checkpoint.json"


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @classmethod
    def is_run_folder(cls, folder: Path) -> bool:
        return cls(Path(folder)).config.is_file()

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def mlflow_parent(self) -> Path:
        return self.root / "mlflow.json"

    @property
    def dag_run(self) -> Path:  # {dag_id, run_id, started}: the Airflow DAG run that made the folder
        return self.root / "airflow.json"

    @property
    def snapshot(self) -> Path:
        return self.root / "snapshot"

    def snapshot_split(self, split: str) -> Path:
        return self.snapshot / f"{split}.parquet"

    @property
    def manifest(self) -> Path:
        return self.snapshot / "manifest.json"

    @property
    def validation(self) -> Path:
        return self.root / "validation"

    def validation_result(self, stage: str, split: str) -> Path:
        return self.validation / f"{stage}_{split}.json"

    def validation_summary(self, stage: str) -> Path:
        return self.validation / f"{stage}_summary.json"

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

    def engine_cluster(self, engine: str) -> Path:  # an engine's embedded cluster: its logs and work dirs
        return self.root / f"{engine}-cluster"

    def engine_cluster_info(self, engine: str) -> Path:  # {url, daemons, started, ...} while it runs
        return self.engine_cluster(engine) / "cluster.json"

    def cell(self, backend: str, workers: int, repeat: int, strategy: str = DEFAULT_STRATEGY,
             network: str = DEFAULT_NETWORK) -> CellPaths:
        return CellPaths(self.cells / cell_name(backend, workers, repeat, strategy, network))

    @property
    def cluster(self) -> Path:  # the run's emulated cluster: its state and its keeper's log
        return self.root / "cluster"

    def cell_results(self) -> list[Path]:
        """Every cell's result.json present on disk (whatever the config says)."""
        return sorted(self.cells.glob(f"*/{CellPaths(Path()).result.name}"))

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def summary(self) -> Path:
        return self.report / "summary.json"

    @property
    def report_markdown(self) -> Path:
        return self.report / "report.md"

    @property
    def report_html(self) -> Path:
        return self.report / "report.html"

    def plot(self, name: str) -> Path:
        return self.report / f"{name}.png"

    @property
    def regression(self) -> Path:
        return self.report / "regression.json"
