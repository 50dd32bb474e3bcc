"""The exported model (``pipelines.training.outcome.export_model``) is swapped in whole: the old
model stays readable at <cell>/model until the new one is there, also when the export dies on the
way; a link planted at the model's path is replaced, never written through. BERT-tiny, real
``save_pretrained`` / ``from_pretrained``, on this machine's file system (``exchange``:
renameat2) and on the two-rename path of a file system without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from pipelines.runfolder.paths import CellPaths
from pipelines.training import outcome
from pipelines.training.model import build_model


@pytest.fixture(scope="module")
def two_models(bert_tiny_dir):
    """Two BERT-tiny classifiers that differ (seeds 1 and 2)."""
    return build_model(str(bert_tiny_dir), 1, 2)[0], build_model(str(bert_tiny_dir), 2, 2)[0]


def _classifier(folder: Path) -> torch.Tensor:
    return AutoModelForSequenceClassification.from_pretrained(folder).classifier.weight.detach()


def _siblings(cell: CellPaths) -> list[str]:
    return sorted(p.name for p in cell.root.iterdir())


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_a_new_export_replaces_the_old_model_whole(tmp_path, two_models, exchange, monkeypatch):
    if not exchange:  # a file system without RENAME_EXCHANGE (e.g. NFS)
        monkeypatch.setattr(outcome, "exchange", lambda a, b: False)
    cell = CellPaths(tmp_path / "cell")
    cell.root.mkdir()
    first, second = two_models
    assert outcome.export_model(first, cell) == str(cell.model)
    assert torch.equal(_classifier(cell.model), first.classifier.weight.detach())
    outcome.export_model(second, cell)
    assert torch.equal(_classifier(cell.model), second.classifier.weight.detach())
    assert _siblings(cell) == ["model"]  # nothing left beside it


class _DiesWhileSaving:
    """A model whose export dies after writing part of the new folder (a killed rank 0, a full disk)."""

    def __init__(self, model) -> None:
        self.model = model

    def save_pretrained(self, folder: Path) -> None:
        self.model.save_pretrained(folder)
        next(Path(folder).glob("*.safetensors")).write_bytes(b"half")
        raise OSError(28, "No space left on device")


def test_an_export_that_dies_leaves_the_old_model_readable(tmp_path, two_models):
    cell = CellPaths(tmp_path / "cell")
    cell.root.mkdir()
    first, second = two_models
    outcome.export_model(first, cell)
    with pytest.raises(OSError, match="No space left"):
        outcome.export_model(_DiesWhileSaving(second), cell)
    assert torch.equal(_classifier(cell.model), first.classifier.weight.detach())  # the old one, whole
    outcome.export_model(second, cell)  # the next export clears the dead one's folder
    assert torch.equal(_classifier(cell.model), second.classifier.weight.detach())
    assert _siblings(cell) == ["model"]


def test_a_link_planted_at_the_models_path_is_replaced_not_followed(tmp_path, two_models):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not the cell's")
    cell = CellPaths(tmp_path / "cell")
    cell.root.mkdir()
    cell.model.symlink_to(elsewhere, target_is_directory=True)
    outcome.export_model(two_models[0], cell)
    assert not cell.model.is_symlink() and (cell.model / "config.json").exists()
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"]
