"""The one result record every backend writes: ``cells/<cell>/result.json``.

Written locally first by the training cell; evaluation, MLflow logging and the report read
these files, so a lost tracking server loses nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipelines.config import Backend


class EpochMetrics(BaseModel):
    epoch: int  # 1-based
    train_loss: float
    train_accuracy: float
    eval_loss: float
    eval_accuracy: float
    epoch_seconds: float  # wall time of this epoch (train + held-out eval)
    elapsed_seconds: float  # training wall time from the first step to the end of this epoch
    samples_per_second: float  # training samples/s over the whole job (all ranks)


class TestMetrics(BaseModel):
    __test__ = False  # not a pytest test class, despite the name

    accuracy: float
    f1: float
    precision: float
    recall: float
    loss: float
    confusion_matrix: list[list[int]]  # [[tn, fp], [fn, tp]]


class CellResult(BaseModel):
    """One training cell = (backend, world size, repeat)."""

    model_config = ConfigDict(extra="forbid")

    backend: Backend
    world_size: int
    repeat: int = 0
    status: Literal["ok", "failed"] = "ok"
    error: str | None = None  # why the cell failed, for the report
    device: str = "cpu"  # e.g. "cpu", "cuda:NVIDIA H200"
    model_source: Literal["pretrained", "random_init"] | None = None
    model_name: str | None = None
    train_samples: int = 0
    test_samples: int = 0
    max_seq_len: int = 0
    batch_size_per_worker: int = 0
    seed: int = 0
    epochs: list[EpochMetrics] = Field(default_factory=list)
    test: TestMetrics | None = None
    # wall time split: launcher/session/init start-up, training loop, final evaluation
    startup_seconds: float = 0.0
    training_seconds: float = 0.0
    evaluation_seconds: float = 0.0
    total_seconds: float = 0.0
    samples_per_second: float = 0.0
    peak_memory_mb: float = 0.0
    checkpoint_path: str | None = None  # last training checkpoint (model + optimizer + RNG)
    model_path: str | None = None  # trained model, Hugging Face format (save_pretrained)
    resumed_from_epoch: int = 0  # 0 = fresh start
    versions: dict[str, str] = Field(default_factory=dict)  # torch, transformers, backend lib
    host: str | None = None

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.model_dump_json(indent=2))
        tmp.replace(path)  # atomic: readers never see half a file

    @classmethod
    def read(cls, path: Path) -> "CellResult":
        return cls.model_validate_json(Path(path).read_text())
