"""Duplicates and train/test overlap on normalised text and near-copies (MinHash), with real GX
on snapshots built from real IMDB reviews: copies that differ in case, spacing, markup or a few
words are refused before tokenization, naming the rule and showing the rows; IMDB passes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipelines.data.ingest import ingest
from pipelines.data.near_duplicates import normalize_text, shingle_hashes, text_duplicates
from pipelines.data.preprocess import preprocess
from pipelines.data.validate import DataValidationError, validate_snapshot
from pipelines.runfolder.paths import RunPaths


def _run(config) -> RunPaths:
    return RunPaths(Path(config.tracking.output_root) / "run")


def _case_and_spacing(text: str, n: int) -> str:
    """The same review, re-typed: case, spaces, line breaks and markup changed."""
    variants = (str.upper, str.lower, str.swapcase)
    changed = variants[n % 3](text).replace(" ", "  ").replace("<br /><br />", "\n\n")
    return f"  {changed.replace('.', ' . ')}  "


def _few_words_changed(text: str) -> str:
    """Three plain words (not markup such as ``/><br``) replaced, at 1/4, 1/2 and 3/4 of the review."""
    words = text.split()
    plain = [i for i, w in enumerate(words) if w.isalpha()]
    for at, word in zip((1, 2, 3), ("zebra", "quartz", "velvet")):
        words[plain[at * len(plain) // 4]] = word
    return " ".join(words)


def _refused(make_config, write_source, **frames) -> tuple[str, dict, RunPaths]:
    config = make_config(dataset_source=str(write_source(**frames)), allow_small_data=True)
    paths = _run(config)
    ingest(config, paths)
    with pytest.raises(DataValidationError) as err:
        validate_snapshot(config, paths)
    summary = json.loads((paths.validation / "snapshot_summary.json").read_text())
    assert summary["success"] is False
    with pytest.raises(DataValidationError, match="refusing to preprocess"):
        preprocess(config, paths)  # never tokenized
    assert not paths.tokens.exists()
    return str(err.value), summary, paths


def test_normalisation_ignores_case_spacing_punctuation_and_markup():
    a = "This film is GREAT!<br /><br />Don't miss it... 10/10"
    b = "  this film is great \n\n dont miss it 10 10 "
    assert normalize_text(a) == normalize_text(b) == "this film is great dont miss it 10 10"
    assert normalize_text("\uff26\uff49\uff4c\uff4d &amp; STRASSE") == normalize_text("film & straße")  # NFKC, casefold
    assert normalize_text(None) == "" and normalize_text("<i></i> !!") == ""
    assert normalize_text("I <3 it, a < b and c > d") == "i 3 it a b and c d"  # no tag: nothing eaten


def test_test_split_repeating_30_percent_of_train_retyped_is_refused(make_config, write_source, real_rows):
    test = real_rows["test"].copy()
    rows = list(range(0, 40, 10)) + list(range(3, 40, 5))[:8]  # 12 of 40 test rows: 30 %
    test.loc[rows, "text"] = [_case_and_spacing(t, n) for n, t in enumerate(real_rows["train"].loc[rows, "text"])]
    message, summary, paths = _refused(make_config, write_source, test=test)

    assert "test_rows_in_train_fraction" not in message  # no exact copy: only the new rules see them
    assert "contract: expect_column_values_to_be_between on test_rows_in_train_normalized_fraction" in message
    assert "rule normalised train/test overlap" in message and "max_overlap_fraction=0.01" in message
    assert "rule near-duplicate train/test overlap" in message and "(Jaccard 1.0)" in message
    assert "e.g. test[" in message and ("~ train[" in message or "~ validation[" in message)
    assert "(same normalised text)" in message
    facts = summary["contract"]["facts"]
    assert facts["test_rows_in_train_normalized_fraction"] == pytest.approx(0.3)
    assert facts["test_rows_near_train_fraction"] == pytest.approx(0.3)
    examples = summary["near_duplicates"]["examples"]["test_rows_in_train_normalized_fraction"]
    assert len(examples) == 3
    originals = {" ".join(t.split())[:40] for t in real_rows["train"].loc[rows, "text"]}
    assert all(e["match_text"][:40] in originals for e in examples)  # the train side of each pair
    # the examples are in GX's own result of the contract suite too
    result = json.loads((paths.validation / "snapshot_contract.json").read_text())
    failed = {r["expectation_config"]["kwargs"]["column"]: r for r in result["results"] if not r["success"]}
    assert failed["test_rows_in_train_normalized_fraction"]["expectation_config"]["meta"]["examples"] == examples


def test_train_split_of_half_retyped_copies_is_refused(make_config, write_source, real_rows):
    train = real_rows["train"]
    originals = pd.concat([train[train.label == 0].head(10), train[train.label == 1].head(10)])
    copies = originals.assign(text=[_case_and_spacing(t, n) for n, t in enumerate(originals["text"])])
    padded = pd.concat([originals, copies], ignore_index=True)  # 40 rows, 20 of them copies: 50 %
    message, summary, _ = _refused(make_config, write_source, train=padded)

    assert "contract: expect_column_values_to_be_between on normalized_duplicate_fraction_train" in message
    assert "rule normalised duplicates: train rows" in message and "max_duplicate_fraction=0.05" in message
    assert "near_duplicate_fraction_train" in message and "e.g. train[" in message
    facts = summary["contract"]["facts"]
    assert facts["duplicate_fraction_train"] == 0.0
    # validation (10 %) is carved from train, so some pairs straddle the two: most stay in train
    assert facts["normalized_duplicate_fraction_train"] > 0.35
    assert facts["near_duplicate_fraction_train"] >= facts["normalized_duplicate_fraction_train"]


def test_test_rows_that_are_train_rows_with_a_few_words_changed_are_refused(
    make_config, write_source, real_rows
):
    train = real_rows["train"]
    long = train[train["text"].str.split().str.len() >= 230].index[:8]  # 8 of 40 test rows: 20 %
    test = real_rows["test"].copy()
    test.loc[range(8), "text"] = [_few_words_changed(t) for t in train.loc[long, "text"]]
    message, summary, _ = _refused(make_config, write_source, test=test)

    assert "test_rows_in_train_normalized_fraction" not in message  # the texts really differ
    assert "contract: expect_column_values_to_be_between on test_rows_near_train_fraction" in message
    assert "rule near-duplicate train/test overlap: test rows with a near-copy" in message
    assert "Jaccard >= 0.9" in message and "e.g. test[" in message
    examples = summary["near_duplicates"]["examples"]["test_rows_near_train_fraction"]
    assert examples and all(0.9 <= e["jaccard"] < 1.0 for e in examples)
    assert summary["contract"]["facts"]["test_rows_near_train_fraction"] == pytest.approx(0.2)

    # a bound chosen on purpose relaxes the near rule only; the stricter threshold misses them
    source = str(write_source("again", test=test))
    for overrides in ({"max_near_overlap_fraction": 0.25}, {"near_duplicate_threshold": 0.99}):
        config = make_config(dataset_source=source, allow_small_data=True, **overrides)
        paths = RunPaths(Path(config.tracking.output_root) / f"run-{next(iter(overrides))}")
        ingest(config, paths)
        assert validate_snapshot(config, paths)["success"]


def test_the_smoke_sample_of_real_imdb_passes(make_config):
    config = make_config()  # the smoke profile: 1200 train / 400 test real reviews
    paths = _run(config)
    ingest(config, paths)
    summary = validate_snapshot(config, paths)

    assert summary["success"], summary["failures"]
    facts = summary["contract"]["facts"]
    for split in ("train", "validation", "test"):
        assert facts[f"normalized_duplicate_fraction_{split}"] <= config.data.max_duplicate_fraction
        assert facts[f"near_duplicate_fraction_{split}"] <= config.data.max_duplicate_fraction
    assert facts["test_rows_in_train_normalized_fraction"] <= config.data.max_overlap_fraction
    assert facts["test_rows_near_train_fraction"] <= config.data.max_overlap_fraction
    near = summary["near_duplicates"]
    assert near["jaccard_threshold"] == 0.9 and near["num_perm"] == 128 and near["shingle_words"] == 3
    assert set(near["rows"]) == {k for k in facts if "normalized" in k or "near" in k}


def test_shingles_do_not_depend_on_the_batching(real_rows):
    texts = [normalize_text(t) for t in real_rows["train"]["text"]] + ["one", "two words", ""]
    batched, single = shingle_hashes(texts, chunk=7), shingle_hashes(texts, chunk=1)
    assert all(np.array_equal(a, b) for a, b in zip(batched, single, strict=True))
    assert [len(s) for s in batched[-3:]] == [1, 1, 0]  # shorter than 3 words: one shingle
    assert len(batched[0]) == len(texts[0].split()) - 2
    with pytest.raises(ValueError, match="normalised texts"):
        shingle_hashes(["two  spaces"])


def test_same_data_same_facts_and_examples(real_rows):
    train = real_rows["train"]
    test = real_rows["test"].copy()
    test.loc[[1, 2], "text"] = [_few_words_changed(t) for t in train.loc[[33, 34], "text"]]
    frames = {"train": train, "validation": train.iloc[0:0], "test": test}
    first, again = text_duplicates(frames, 0.8), text_duplicates(frames, 0.8)
    assert first.facts == again.facts and first.examples == again.examples
    assert first.counts["test_rows_near_train_fraction"] == 2


def test_new_contract_fields_keep_the_fingerprint_at_their_defaults(make_config):
    config = make_config()
    identity = config.training_identity()
    assert not {"near_duplicate_threshold", "max_near_duplicate_fraction", "max_near_overlap_fraction"} & set(identity)
    assert make_config(near_duplicate_threshold=0.8).fingerprint() != config.fingerprint()
    assert make_config(max_near_overlap_fraction=0.02).training_identity()["max_near_overlap_fraction"] == 0.02
