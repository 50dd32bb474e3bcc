"""A 3-class task runs by configuration alone: the label set comes from the data (manifest).

The data set is built from the real IMDB copy by a CLEARLY SYNTHETIC relabelling, for the
mechanics only (the shared copy has no star ratings): 0 = negative review, 1 = positive review
shorter than the positives' median length, 2 = positive review at least that long. The classes
are learnable from the text (sentiment and length), but no figure from it means anything.
"""

from __future__ import annotations

import pandas as pd
import pytest

from pipelines.config import load_config
from pipelines.data.ingest import ingest
from pipelines.data.manifest import task_labels
from pipelines.data.validate import DataValidationError, validate_snapshot
from pipelines.training.metrics import classification_metrics
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards


def three_classes(frame: pd.DataFrame) -> pd.Series:
    """Sentiment x length buckets (synthetic, see the module docstring)."""
    lengths = frame["text"].str.len()
    long_positive = (frame["label"] == 1) & (lengths >= lengths[frame["label"] == 1].median())
    return frame["label"].where(~long_positive, 2).astype("int64")


def test_metrics_cover_every_class_of_the_task():
    y_true = [0, 0, 1, 1, 2, 2]
    y_pred = [0, 1, 1, 1, 0, 0]  # class 2 is never predicted
    m = classification_metrics(y_true, y_pred, loss=1.0, labels=[0, 1, 2])
    assert m.confusion_matrix == [[1, 1, 0], [0, 2, 0], [2, 0, 0]]
    assert [c.label for c in m.per_class] == [0, 1, 2] and [c.support for c in m.per_class] == [2, 2, 2]
    assert m.per_class[2].recall == 0.0 and m.per_class[1].recall == 1.0
    assert m.f1 == pytest.approx(sum(c.f1 for c in m.per_class) / 3)  # macro-F1
    assert m.accuracy == pytest.approx(0.5)


def test_three_class_source_passes_ingest_and_gx_with_the_manifest_label_set(tmp_path, imdb_dir,
                                                                             bert_tiny_dir):
    source = tmp_path / "imdb3"
    source.mkdir()
    for split in ("train", "test"):
        frame = pd.read_parquet(imdb_dir / f"{split}.parquet").groupby("label").head(150)
        frame.assign(label=three_classes(frame)).to_parquet(source / f"{split}.parquet", index=False)
    config = load_config("smoke", dict(dataset_source=str(source), tokenizer_source=str(bert_tiny_dir),
                                       model_source=str(bert_tiny_dir), output_root=str(tmp_path / "runs"),
                                       train_samples=240, test_samples=120))
    paths = RunPaths(tmp_path / "runs" / "three")
    manifest = ingest(config, paths)
    assert manifest["labels"] == [0, 1, 2] and manifest["num_classes"] == 3
    assert task_labels(manifest) == [0, 1, 2]
    summary = validate_snapshot(config, paths)  # real GX suites with the manifest's labels
    assert summary["success"] and summary["labels"] == [0, 1, 2]

    # a test row outside the task's labels is named by GX
    bad = pd.read_parquet(source / "test.parquet")
    bad.loc[bad.index[:40], "label"] = 3  # sampled stratified: some land in the snapshot
    bad.to_parquet(source / "test.parquet", index=False)
    ingest(config, paths)
    with pytest.raises(DataValidationError, match="test: expect_column_values_to_be_in_set on label"):
        validate_snapshot(config, paths)


@pytest.mark.slow
def test_ddp_trains_a_three_class_model(tmp_path, imdb_dir, bert_tiny_dir):
    from transformers import AutoConfig

    from pipelines.run.cells import run_cell

    paths = write_token_shards(RunPaths(tmp_path / "run"), imdb_dir, bert_tiny_dir, train_per_class=96,
                               test_per_class=48, seq_len=64, seed=5, relabel=three_classes)
    config = load_config("smoke", dict(model_source=str(bert_tiny_dir), tokenizer_source=str(bert_tiny_dir),
                                       output_root=str(tmp_path), max_seq_len=64, epochs=1, batch_size=16))
    result = run_cell(config, paths, "ddp", 1, 0)
    assert result.status == "ok" and result.num_labels == 3
    assert len(result.test.confusion_matrix) == 3 and all(len(r) == 3 for r in result.test.confusion_matrix)
    assert sum(map(sum, result.test.confusion_matrix)) == result.test_samples == 96
    assert [c.label for c in result.test.per_class] == [0, 1, 2]
    assert AutoConfig.from_pretrained(result.model_path).num_labels == 3
