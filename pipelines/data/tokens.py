"""Tokenization of review text into model inputs, and reading the token shards back.

``tokenize_frame`` is the pure function Spark runs inside ``mapInPandas``; the shard layout
(``tokens/<split>/part-*.parquet`` with ``input_ids``, ``attention_mask``, ``label``) is the
contract between preprocessing and every training backend.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

TOKEN_COLUMNS = ("input_ids", "attention_mask", "label")
# A row of the dataframe feed (pipelines.backends.spark_dataframe builds them, the ranks read them
# in pipelines.training.spark_feed, in this order): its train-split row id, the rank that trains it
# and its place in that rank's partition, then the token columns
FEED_COLUMNS = ("row_id", "rank", "position", *TOKEN_COLUMNS)


@lru_cache(maxsize=4)
def load_tokenizer(source: str):
    """Fast tokenizer from a hub id or a local folder (cached per process / Spark worker)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, use_fast=True)
    except (OSError, ValueError) as err:  # missing files raise ValueError in transformers 5
        raise OSError(
            f"tokenizer_source={source!r}: cannot load a tokenizer from it ({err}). "
            "Give a hub id that is reachable or cached, or a local folder with tokenizer.json/vocab.txt "
            "(e.g. ../shared/data/bert-tiny)."
        ) from err


def tokenize_frame(frame: pd.DataFrame, tokenizer_source: str, max_seq_len: int,
                   truncation_side: str = "right") -> pd.DataFrame:
    """``text``/``label`` rows -> fixed-length ``input_ids``/``attention_mask``/``label`` rows.

    A review longer than ``max_seq_len`` tokens loses its end (``right``, the library's default)
    or its beginning (``left``: the review's conclusion is kept; [CLS] stays first either way).
    """
    if truncation_side not in ("right", "left"):
        raise ValueError(f"truncation_side must be 'right' or 'left', got {truncation_side!r}")
    tokenizer = load_tokenizer(tokenizer_source)
    tokenizer.truncation_side = truncation_side  # the cached tokenizer is shared: set on every call
    enc = tokenizer(
        frame["text"].tolist(),
        truncation=True,
        max_length=max_seq_len,
        padding="max_length",
        return_token_type_ids=False,
    )
    return pd.DataFrame(
        {
            "input_ids": [np.asarray(ids, dtype=np.int32) for ids in enc["input_ids"]],
            "attention_mask": [np.asarray(m, dtype=np.int8) for m in enc["attention_mask"]],
            "label": frame["label"].astype("int64").to_numpy(),
        }
    )


def read_token_split(split_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All shards of one split -> (input_ids [N, L] int64, attention_mask [N, L], labels [N]).

    Shards are read in file-name order, so every backend sees rows in the same order.
    """
    files = sorted(Path(split_dir).glob("part-*.parquet"))
    if not files:
        raise FileNotFoundError(f"no token shards (part-*.parquet) in {split_dir}: run preprocessing first")
    frame = pd.concat([pd.read_parquet(f, columns=list(TOKEN_COLUMNS)) for f in files], ignore_index=True)
    input_ids = np.stack(frame["input_ids"].to_numpy()).astype(np.int64)
    attention_mask = np.stack(frame["attention_mask"].to_numpy()).astype(np.int64)
    labels = frame["label"].to_numpy(dtype=np.int64)
    return input_ids, attention_mask, labels
