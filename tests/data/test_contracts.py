"""The data contract refuses what would make a benchmark meaningless, each case on a real
corrupt dataset built from the IMDB copy; reading errors name the file, line and fix."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pipelines.data.ingest import DataSourceError, ingest
from pipelines.data.validate import DataValidationError, validate_snapshot
from pipelines.runfolder.paths import RunPaths
from pipelines.tracking.runs import baseline_eligible


def _run(config) -> RunPaths:
    return RunPaths(Path(config.tracking.output_root) / "run")


def test_duplicate_heavy_train_split_fails(make_config, write_source, real_rows):
    train = real_rows["train"].copy()
    train.loc[1:12, "text"] = train.loc[0, "text"]  # 12 copies of one review: 30 % duplicates
    config = make_config(dataset_source=str(write_source(train=train)), allow_small_data=True)
    paths = _run(config)
    ingest(config, paths)
    with pytest.raises(DataValidationError, match="duplicate_fraction_train"):
        validate_snapshot(config, paths)


def test_a_tiny_dataset_fails_unless_allowed_and_then_is_never_a_baseline(make_config, write_source, real_rows):
    tiny = {s: pd.concat([f[f.label == 0].head(2), f[f.label == 1].head(2)]) for s, f in real_rows.items()}
    source = str(write_source(**tiny))  # 4 reviews per split
    config = make_config(dataset_source=source)
    paths = _run(config)
    ingest(config, paths)
    with pytest.raises(DataValidationError) as err:
        validate_snapshot(config, paths)
    assert "rows_short_train" in str(err.value) and "smallest_class_test" in str(err.value)
    # the refusal names the setting and the values that pass (the smoke profile asks 1,200 / 400)
    assert (f"data.test_samples={config.data.test_samples} but the source's test split has 4 rows: set "
            f"data.test_samples <= 4 (or null: all rows), or data.allow_small_data=true") in str(err.value)

    relaxed = make_config(dataset_source=source, allow_small_data=True, min_class_fraction=0.1)
    summary = validate_snapshot(relaxed, paths)
    assert summary["success"] and summary["contract"]["relaxed"] is True
    assert baseline_eligible(paths) is False  # tracking tags it; the regression check skips it


def test_fractional_labels_fail_integral_floats_pass(make_config, write_source, real_rows):
    floats = {s: f.assign(label=f["label"].astype(float)) for s, f in real_rows.items()}
    config = make_config(dataset_source=str(write_source(**floats)), allow_small_data=True)
    paths = _run(config)
    ingest(config, paths)
    assert validate_snapshot(config, paths)["success"]  # 0.0 / 1.0 are the labels 0 / 1

    halves = {s: f.assign(label=f["label"] * 0.5) for s, f in floats.items()}
    bad = make_config(dataset_source=str(write_source("halves", **halves)), allow_small_data=True)
    paths = _run(bad)
    ingest(bad, paths)
    with pytest.raises(DataValidationError, match="train: expect_column_values_to_be_of_type on label"):
        validate_snapshot(bad, paths)


def test_a_non_utf8_csv_names_file_line_and_fix(make_config, tmp_path, real_rows):
    folder = tmp_path / "latin1"
    folder.mkdir()
    for split, frame in real_rows.items():
        frame = frame.copy()
        frame.loc[3, "text"] = "Un film tr\u00e8s r\u00e9ussi"  # \xe8 in latin-1 is no UTF-8
        frame.to_csv(folder / f"{split}.csv", index=False, encoding="latin-1")
    config = make_config(dataset_source=str(folder))
    with pytest.raises(DataSourceError) as err:
        ingest(config, _run(config))
    message = str(err.value)
    assert "train.csv: line" in message and "not UTF-8" in message and "iconv -f latin1 -t utf-8" in message


def test_a_semicolon_csv_is_refused_naming_the_delimiter(make_config, tmp_path, real_rows):
    folder = tmp_path / "semicolon"
    folder.mkdir()
    for split, frame in real_rows.items():
        frame.to_csv(folder / f"{split}.csv", index=False, sep=";")
    config = make_config(dataset_source=str(folder))
    with pytest.raises(DataSourceError, match=r"train.csv.*(not comma-separated|cannot parse it as CSV)"):
        ingest(config, _run(config))
