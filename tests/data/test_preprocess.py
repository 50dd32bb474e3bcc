"""Spark tokenization: shards equal ``tokenize_frame`` on the snapshot, in snapshot order.

One local[2] SparkSession (tests/data/conftest.py) serves every test; the data stage runs
once per module on 120/60 real reviews and corruption tests work on copies of its output.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipelines.config import load_config
from pipelines.data.ingest import ingest
from pipelines.data.preprocess import preprocess
from pipelines.data.tokens import load_tokenizer, read_token_split, tokenize_frame
from pipelines.data.validate import DataValidationError, validate_snapshot, validate_tokens
from pipelines.runfolder.paths import RunPaths

SEQ_LEN = 64
pytestmark = pytest.mark.slow  # starts Spark


@pytest.fixture(scope="module")
def staged(spark, tmp_path_factory, imdb_dir, bert_tiny_dir):
    """(config, paths, preprocess stats) of one data stage on a small real sample."""
    root = tmp_path_factory.mktemp("runs")
    config = load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), output_root=str(root),
        train_samples=120, test_samples=60, max_seq_len=SEQ_LEN, spark_master="local[2]",
    ))
    paths = RunPaths(root / "run")
    ingest(config, paths)
    validate_snapshot(config, paths)
    (paths.root / ".tokens.tmp-killed0").mkdir()  # what a killed tokenization leaves behind
    return config, paths, preprocess(config, paths)


def _copy(staged, tmp_path) -> RunPaths:
    config, paths, _ = staged
    copy = RunPaths(tmp_path / "run")
    shutil.copytree(paths.root, copy.root)
    return copy


def test_shards_hold_the_snapshot_tokenized_in_order(staged):
    config, paths, stats = staged
    assert stats["rows"] == {"train": 108, "validation": 12, "test": 60}  # validation: 10 % of train
    assert stats["rows_per_second"] > 0 and stats["seconds"] >= stats["tokenize_seconds"] > 0
    for split in ("train", "test"):
        shards = sorted(paths.token_split(split).glob("part-*.parquet"))
        assert len(shards) == stats["num_shards"][split] == 2  # order must hold across shards
        schema = {f.name: str(f.type) for f in pq.read_schema(shards[0])}
        assert schema == {"input_ids": "list<element: int32>", "attention_mask": "list<element: int8>",
                          "label": "int64"}

        ids, mask, labels = read_token_split(paths.token_split(split))
        snapshot = pd.read_parquet(paths.snapshot / f"{split}.parquet")
        expected = tokenize_frame(snapshot, config.data.tokenizer_source, SEQ_LEN, config.data.truncation_side)
        np.testing.assert_array_equal(ids, np.stack(expected["input_ids"].to_numpy()))
        np.testing.assert_array_equal(mask, np.stack(expected["attention_mask"].to_numpy()))
        np.testing.assert_array_equal(labels, snapshot["label"].to_numpy())
    meta = json.loads((paths.tokens / "preprocess.json").read_text())
    assert meta["snapshot_sha256"] == {s: v["sha256"] for s, v in
                                       json.loads(paths.manifest.read_text())["splits"].items()}
    assert not list(paths.root.glob(".tokens.tmp-*"))  # its own temp folder and the killed one's


def test_token_validation_passes_and_joins_the_data_docs(staged, tmp_path):
    config, _, _ = staged
    paths = _copy(staged, tmp_path)
    summary = validate_tokens(config, paths)
    assert summary["success"] and summary["vocab_size"] == len(load_tokenizer(config.data.tokenizer_source))
    assert json.loads((paths.validation / "tokens_train.json").read_text())["success"]
    index = (paths.data_docs / "index.html").read_text()
    assert "tokens_train" in index and "snapshot_train" in index  # one site for both stages


def _rewrite_first_shard(paths: RunPaths, split: str, change) -> None:
    shard = sorted(paths.token_split(split).glob("part-*.parquet"))[0]
    frame = pd.read_parquet(shard)
    change(frame)
    frame.to_parquet(shard, index=False)


def _id_beyond_vocab(frame):
    ids = frame.at[0, "input_ids"].copy()
    ids[1] = 10**6
    frame.at[0, "input_ids"] = ids


def _short_row(frame):
    frame.at[1, "input_ids"] = frame.at[1, "input_ids"][:-3]


def _rows_swapped(frame):
    first, other = 0, int(np.flatnonzero(frame["label"].to_numpy() != frame.at[0, "label"])[0])
    frame.iloc[[first, other]] = frame.iloc[[other, first]].to_numpy()


@pytest.mark.parametrize(
    "change, needle",
    [
        (_id_beyond_vocab, "train: expect_column_values_to_be_between on id_max"),
        (_short_row, "train: expect_column_values_to_be_between on input_len"),
        (_rows_swapped, "train: expect_column_pair_values_to_be_equal on label/snapshot_label"),
    ],
    ids=["id-beyond-vocab", "short-row", "rows-out-of-order"],
)
def test_corrupted_shard_fails_token_validation(staged, tmp_path, change, needle):
    config, _, _ = staged
    paths = _copy(staged, tmp_path)
    _rewrite_first_shard(paths, "train", change)
    with pytest.raises(DataValidationError) as err:
        validate_tokens(config, paths)
    assert needle in str(err.value), str(err.value)
    assert json.loads((paths.validation / "tokens_summary.json").read_text())["success"] is False


def test_unloadable_tokenizer_fails_before_spark(staged, tmp_path):
    config, _, _ = staged
    paths = _copy(staged, tmp_path)
    shutil.rmtree(paths.tokens)
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    with pytest.raises(OSError, match="tokenizer_source=.*no-tokenizer"):
        preprocess(config.model_copy(update={"tokenizer_source": str(empty)}), paths)
    assert not paths.tokens.exists()


def test_failure_in_the_second_split_leaves_no_partial_output(staged, tmp_path):
    config, _, _ = staged
    paths = _copy(staged, tmp_path)
    (paths.tokens / "preprocess.json").unlink()  # the old output stays until a run succeeds
    (paths.snapshot / "test.parquet").write_bytes(b"not parquet")  # train succeeds, test fails
    with pytest.raises(Exception, match="test.parquet"):
        preprocess(config, paths)
    assert not (paths.tokens / "preprocess.json").exists()  # not replaced by a half run
    assert not list(paths.root.glob(".tokens.tmp-*"))


@pytest.mark.parametrize("side, kept", [("right", ["one", "two", "three"]), ("left", ["five", "six", "great"])])
def test_truncation_side_keeps_the_chosen_end_of_a_long_review(bert_tiny_dir, side, kept):
    frame = pd.DataFrame({"text": ["one two three four five six great"], "label": [1]})
    ids = tokenize_frame(frame, str(bert_tiny_dir), 5, side).at[0, "input_ids"]
    tokens = load_tokenizer(str(bert_tiny_dir)).convert_ids_to_tokens(ids.tolist())
    assert tokens == ["[CLS]", *kept, "[SEP]"]  # the special tokens stay in place either way


@pytest.mark.parametrize("side", ["right", "left"])
def test_tokenize_frame_gives_the_hugging_face_tokenizers_ids(imdb_dir, bert_tiny_dir, side):
    """The serialized Rust tokenizer Spark's workers use (encoder_json) tokenizes as the Hugging Face
    call does, on real reviews (markup, accents, long texts) and a folder whose tokenizer_config.json
    overrides tokenizer.json (transformers applies do_lower_case; so must the encoder)."""
    frame = pd.read_parquet(imdb_dir / "test.parquet").sample(300, random_state=3)
    frame = pd.concat([frame, pd.DataFrame({"text": ["Hello WORLD Caf\u00e9 <br /><br />", ""], "label": [1, 0]})])
    hf = load_tokenizer(str(bert_tiny_dir))
    hf.truncation_side = side
    want = hf(frame["text"].tolist(), truncation=True, max_length=SEQ_LEN, padding="max_length",
              return_token_type_ids=False)
    got = tokenize_frame(frame, str(bert_tiny_dir), SEQ_LEN, side)
    assert [ids.tolist() for ids in got["input_ids"]] == want["input_ids"]
    assert [m.tolist() for m in got["attention_mask"]] == want["attention_mask"]


def test_the_encoder_keeps_tokenizer_config_overrides(bert_tiny_dir, tmp_path):
    folder = tmp_path / "cased"
    shutil.copytree(bert_tiny_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    frame = pd.DataFrame({"text": ["Hello WORLD"], "label": [1]})
    hf = load_tokenizer(str(folder))
    want = hf(["Hello WORLD"], truncation=True, max_length=8, padding="max_length")["input_ids"][0]
    assert tokenize_frame(frame, str(folder), 8).at[0, "input_ids"].tolist() == want
    assert want != tokenize_frame(frame, str(bert_tiny_dir), 8).at[0, "input_ids"].tolist()  # it did matter


def test_unknown_truncation_side_is_refused(bert_tiny_dir):
    frame = pd.DataFrame({"text": ["a review"], "label": [1]})
    with pytest.raises(ValueError, match="truncation_side must be 'right' or 'left', got 'middle'"):
        tokenize_frame(frame, str(bert_tiny_dir), 8, "middle")
