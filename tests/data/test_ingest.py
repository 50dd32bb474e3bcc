"""Ingest on the real IMDB copy and on small real-row sources in every accepted layout."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipelines.data.ingest import DataSourceError, content_hash, ingest, sample_split
from pipelines.runfolder.paths import RunPaths


def _run(config, name: str = "run") -> RunPaths:
    return RunPaths(Path(config.tracking.output_root) / name)


def test_real_imdb_snapshot_is_stratified_shuffled_and_hashed(make_config, imdb_dir):
    config = make_config(train_samples=200, test_samples=100)
    paths = _run(config)
    manifest = ingest(config, paths)

    assert json.loads(paths.manifest.read_text()) == manifest
    assert manifest["source_kind"] == "parquet" and manifest["seed"] == config.training.seed
    source_train = set(pd.read_parquet(imdb_dir / "train.parquet")["text"])
    # validation: 10 % of the 200 sampled train rows, stratified and seeded; train keeps the rest
    for split, n in (("train", 180), ("validation", 20), ("test", 100)):
        info = manifest["splits"][split]
        assert info["rows"] == n and info["source_rows"] == 25_000 and info["stratified"]
        assert info["rows_per_label"] == {"0": n // 2, "1": n // 2}
        schema = pq.read_schema(paths.snapshot / f"{split}.parquet")
        assert {f.name: str(f.type) for f in schema} == {"text": "string", "label": "int64"}
        frame = pd.read_parquet(paths.snapshot / f"{split}.parquet")
        assert content_hash(frame) == info["sha256"]
        assert not frame["label"].is_monotonic_increasing  # the label-sorted source was shuffled
    train_texts = set(pd.read_parquet(paths.snapshot / "train.parquet")["text"])
    validation_texts = set(pd.read_parquet(paths.snapshot / "validation.parquet")["text"])
    assert train_texts | validation_texts <= source_train and not train_texts & validation_texts
    assert manifest["splits"]["validation"]["carved_from"] == "train"


def test_same_seed_same_bytes_other_seed_other_sample(make_config):
    config = make_config(train_samples=200, test_samples=100)
    first, second = ingest(config, _run(config, "a")), ingest(config, _run(config, "b"))
    assert {s: v["sha256"] for s, v in first["splits"].items()} == {
        s: v["sha256"] for s, v in second["splits"].items()
    }
    for split in ("train", "test"):
        a = (_run(config, "a").snapshot / f"{split}.parquet").read_bytes()
        assert a == (_run(config, "b").snapshot / f"{split}.parquet").read_bytes()

    rerun = ingest(config, _run(config, "a"))  # idempotent: even created_at is kept
    assert rerun == first

    other = make_config(train_samples=200, test_samples=100, seed=7)
    other_manifest = ingest(other, _run(other, "c"))
    assert other_manifest["splits"]["train"]["sha256"] != first["splits"]["train"]["sha256"]
    assert other_manifest["splits"]["train"]["rows_per_label"] == {"0": 90, "1": 90}


def _write_csv(folder: Path, frames: dict) -> None:
    for split, frame in frames.items():
        frame.to_csv(folder / f"{split}.csv", index=False)


def _write_jsonl(folder: Path, frames: dict) -> None:
    for split, frame in frames.items():
        frame.to_json(folder / f"{split}.jsonl", orient="records", lines=True)


def _write_acl_tree(folder: Path, frames: dict) -> None:
    root = folder / "aclImdb"  # as the tarball extracts
    for split, frame in frames.items():
        for i, row in enumerate(frame.itertuples()):
            target = root / split / ("pos" if row.label == 1 else "neg")
            target.mkdir(parents=True, exist_ok=True)
            (target / f"{i}_{8 if row.label else 2}.txt").write_text(row.text, encoding="utf-8")
        (root / split / "urls_pos.txt").write_text("not a review\n")  # ignored like the original


def _write_parquet_shards(folder: Path, frames: dict) -> None:
    for split, frame in frames.items():
        (folder / split).mkdir()
        half = len(frame) // 2
        frame.iloc[:half].to_parquet(folder / split / "part-0.parquet", index=False)
        frame.iloc[half:].to_parquet(folder / split / "part-1.parquet", index=False)


@pytest.mark.parametrize(
    "writer, kind",
    [(_write_csv, "csv"), (_write_jsonl, "jsonl"), (_write_acl_tree, "aclimdb"),
     (_write_parquet_shards, "parquet")],
)
def test_local_folder_layouts(writer, kind, tmp_path, make_config, real_rows):
    folder = tmp_path / "src"
    folder.mkdir()
    writer(folder, real_rows)
    config = make_config(dataset_source=str(folder), train_samples=30, test_samples=10)
    manifest = ingest(config, _run(config))

    assert manifest["source_kind"] == kind
    sampled = {k: manifest["splits"]["train"]["rows_per_label"][k]
               + manifest["splits"]["validation"]["rows_per_label"][k] for k in ("0", "1")}
    assert sampled == {"0": 15, "1": 15}  # train + the validation carved from it
    assert manifest["splits"]["test"]["rows_per_label"] == {"0": 5, "1": 5}
    got = pd.read_parquet(_run(config).snapshot / "train.parquet")
    truth = dict(zip(real_rows["train"]["text"], real_rows["train"]["label"], strict=True))
    pairs = zip(got["text"], got["label"], strict=True)
    assert all(truth[t] == label for t, label in pairs)  # texts kept exactly, labels right


def test_more_samples_than_rows_takes_all(make_config, write_source):
    config = make_config(dataset_source=str(write_source()), train_samples=1000, test_samples=1000)
    manifest = ingest(config, _run(config))
    assert manifest["splits"]["train"]["rows"] + manifest["splits"]["validation"]["rows"] == 40
    assert manifest["splits"]["train"]["requested_samples"] == 1000


def test_unreachable_hub_id_says_how_to_provide_data(make_config):
    config = make_config(dataset_source="nonexistent-org/nonexistent-imdb")
    with pytest.raises(DataSourceError) as err:
        ingest(config, _run(config))
    message = str(err.value)
    assert "nonexistent-org/nonexistent-imdb" in message
    assert "../shared/data/imdb" in message and "aclImdb" in message
    assert not _run(config).manifest.exists()


def test_missing_local_path_is_named(make_config, tmp_path):
    missing = tmp_path / "no" / "such" / "imdb"
    config = make_config(dataset_source=str(missing))
    with pytest.raises(DataSourceError, match="path does not exist") as err:
        ingest(config, _run(config))
    assert str(missing) in str(err.value)


def test_folder_without_a_split_is_refused(make_config, tmp_path, real_rows):
    folder = tmp_path / "only-train"
    folder.mkdir()
    real_rows["train"].to_parquet(folder / "train.parquet")
    config = make_config(dataset_source=str(folder))
    with pytest.raises(DataSourceError, match="no 'test' split"):
        ingest(config, _run(config))


def test_source_without_label_is_copied_unstratified(make_config, write_source, real_rows):
    folder = write_source(train=real_rows["train"][["text"]])
    config = make_config(dataset_source=str(folder), train_samples=10, test_samples=10)
    manifest = ingest(config, _run(config))
    train = manifest["splits"]["train"]
    assert train["stratified"] is False and train["rows_per_label"] is None
    assert train["columns"] == ["text"] and train["rows"] + manifest["splits"]["validation"]["rows"] == 10
    assert manifest["splits"]["test"]["stratified"] is True


def test_allocation_keeps_class_proportions():
    frame = pd.DataFrame({"text": [f"r{i}" for i in range(40)], "label": [0] * 30 + [1] * 10})
    sample, stratified = sample_split(frame, 8, seed=1, stream=0)
    assert stratified and sample["label"].value_counts().to_dict() == {0: 6, 1: 2}
    assert sample["text"].is_unique
