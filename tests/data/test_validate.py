"""Great Expectations on the snapshot: real data passes, each kind of corruption is named.

Corrupt data sets are built from real reviews; none of them may reach tokenization.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipelines.data.ingest import ingest
from pipelines.data.preprocess import preprocess
from pipelines.data.validate import DataValidationError, validate_snapshot
from pipelines.runfolder.paths import RunPaths


def _run(config) -> RunPaths:
    return RunPaths(Path(config.tracking.output_root) / "run")


def test_real_sample_passes_and_keeps_results_and_docs(make_config):
    config = make_config(train_samples=200, test_samples=100)
    paths = _run(config)
    ingest(config, paths)
    summary = validate_snapshot(config, paths)

    assert summary["success"] and summary["failures"] == []
    assert json.loads((paths.validation / "snapshot_summary.json").read_text())["success"]
    for split in ("train", "test"):
        result = json.loads((paths.validation / f"snapshot_{split}.json").read_text())
        assert result["success"] and result["statistics"]["evaluated_expectations"] >= 10
    index = paths.data_docs / "index.html"
    assert index.exists() and "snapshot_train" in index.read_text()
    assert summary["train_test_overlap"]["test_rows_in_train"] == 0


def _drop_label(rows):
    return {"train": rows["train"][["text"]]}


def _label_two(rows):
    train = rows["train"].copy()
    train.loc[3, "label"] = 2
    return {"train": train}


def _null_text(rows):
    test = rows["test"].copy()
    test["text"] = test["text"].astype(object)
    test.loc[5, "text"] = None
    return {"test": test}


def _blank_text(rows):
    train = rows["train"].copy()
    train.loc[7, "text"] = "   \n "
    return {"train": train}


def _empty_test(rows):
    return {"test": rows["test"].iloc[0:0]}


def _one_class(rows):
    return {"train": rows["train"][rows["train"].label == 1]}


@pytest.mark.parametrize(
    "corrupt, expected",
    [
        (_drop_label, ["train: expect_table_columns_to_match_set", "label"]),
        # a stray label 2 makes a 3-class task whose third class is far too rare
        (_label_two, ["train_classes: expect_column_values_to_be_between on share", "e.g. [0.027"]),
        (_null_text, ["test: expect_column_values_to_not_be_null on text", "1 of 40 rows"]),
        (_blank_text, ["train: expect_column_values_to_not_match_regex on text"]),
        (_empty_test, ["test: expect_table_row_count_to_be_between", "observed 0"]),
        (_one_class, ["train_classes: expect_column_values_to_be_between on share", "e.g. [0.0]"]),
    ],
    ids=["missing-label", "label-2", "null-text", "blank-text", "empty-test", "one-class"],
)
def test_corrupt_data_fails_with_named_expectation_and_is_never_tokenized(
    corrupt, expected, make_config, write_source, real_rows
):
    config = make_config(dataset_source=str(write_source(**corrupt(real_rows))), allow_small_data=True)
    paths = _run(config)
    ingest(config, paths)  # ingest copies what is there; validation is the judge

    with pytest.raises(DataValidationError) as err:
        validate_snapshot(config, paths)
    message = str(err.value)
    for needle in expected:
        assert needle in message, message

    summary = json.loads((paths.validation / "snapshot_summary.json").read_text())
    assert summary["success"] is False and summary["failures"]
    assert (paths.validation / "snapshot_train.json").exists()
    assert (paths.data_docs / "index.html").exists()  # docs kept on failure too

    with pytest.raises(DataValidationError, match="refusing to preprocess"):
        preprocess(config, paths)
    assert not paths.tokens.exists()


def test_text_length_bounds_come_from_config(make_config, write_source):
    config = make_config(dataset_source=str(write_source()), max_text_chars=100, allow_small_data=True)
    paths = _run(config)
    ingest(config, paths)
    with pytest.raises(DataValidationError, match="expect_column_value_lengths_to_be_between on text"):
        validate_snapshot(config, paths)


def test_train_test_overlap_above_the_bound_fails(make_config, write_source, real_rows):
    test = real_rows["test"].copy()
    test.loc[[0, 25], "text"] = real_rows["train"].loc[[1, 30], "text"].to_numpy()  # 2 of 40: 5 %
    source = str(write_source(test=test))
    config = make_config(dataset_source=source, allow_small_data=True)
    paths = _run(config)
    ingest(config, paths)
    with pytest.raises(DataValidationError, match="contract: expect_column_values_to_be_between on "
                                                  "test_rows_in_train_fraction: observed 1 of 1 rows unexpected"):
        validate_snapshot(config, paths)
    tolerant = make_config(dataset_source=source, allow_small_data=True, max_overlap_fraction=0.1)
    summary = validate_snapshot(tolerant, paths)  # a bound the team chose on purpose
    assert summary["success"] and summary["train_test_overlap"]["test_rows_in_train"] == 2
    assert summary["contract"]["facts"]["test_rows_in_train_fraction"] == pytest.approx(0.05)


def test_preprocess_refuses_unvalidated_or_changed_snapshot(make_config):
    config = make_config(train_samples=20, test_samples=10)
    paths = _run(config)
    ingest(config, paths)
    with pytest.raises(DataValidationError, match="run validate_snapshot"):
        preprocess(config, paths)

    validate_snapshot(config, paths)
    changed = make_config(train_samples=20, test_samples=10, seed=3)
    ingest(changed, paths)  # a new snapshot under the old validation summary
    with pytest.raises(DataValidationError, match="changed since it was validated"):
        preprocess(changed, paths)
    assert not paths.tokens.exists()


def test_failure_lists_every_problem_once_per_split(make_config, write_source, real_rows):
    train = real_rows["train"].copy()
    train.loc[0, "label"] = 5
    config = make_config(dataset_source=str(write_source(train=train, test=real_rows["test"].iloc[0:0])),
                         allow_small_data=True)
    paths = _run(config)
    ingest(config, paths)
    with pytest.raises(DataValidationError) as err:
        validate_snapshot(config, paths)
    summary = json.loads((paths.validation / "snapshot_summary.json").read_text())
    splits = {f["split"] for f in summary["failures"]}
    assert splits == {"train", "train_classes", "test", "test_classes"}
    assert "train: expect_column_values_to_be_in_set on label" in str(err.value)  # 5 is not in 0..2
    assert len(str(err.value).splitlines()) == len(summary["failures"]) + 2  # header + lines + paths
    assert isinstance(pd.read_json(paths.validation / "snapshot_test.json", typ="series")["results"], list)
