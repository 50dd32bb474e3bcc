"""Tokenization of review text into model inputs, and reading the token shards back.

``tokenize_frame`` is the pure tokenization function; preprocessing (``pipelines.data.preprocess``)
runs its second half, ``encode_frame``, on its engine's workers (``mapInPandas``) with the tokenizer
serialized on the driver (``encoder_json``). The shard layout (``tokens/<split>/part-*.parquet`` with
``input_ids``, ``attention_mask``, ``label``) is the contract between preprocessing and every
training backend.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

TOKEN_COLUMNS = ("input_ids", "attention_mask", "label")
# A row of the dataframe feed (pipelines.platforms.spark.dataframe builds them, the ranks read them
# in pipelines.platforms.spark.feed, in this order): its train-split row id, the rank that trains it
# and its place in that rank's partition, then the token columns
FEED_COLUMNS = ("row_id", "rank", "position", *TOKEN_COLUMNS)


@lru_cache(maxsize=4)
def load_tokenizer(source: str):
    """Fast tokenizer from a hub id or a local folder (cached per process / engine worker)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, use_fast=True)
    except (OSError, ValueError) as err:  # missing files raise ValueError in transformers 5
        raise OSError(
            f"tokenizer_source={source!r}: cannot load a tokenizer from it ({err}). "
            "Give a hub id that is reachable or cached, or a local folder with tokenizer.json/vocab.txt "
            "(e.g. ../shared/data/bert-tiny)."
        ) from err


@lru_cache(maxsize=8)
def encoder_json(source: str, max_seq_len: int, truncation_side: str = "right") -> str:
    """The tokenizer of ``source`` as Hugging Face configures it for ``tokenizer(texts, truncation=True,
    max_length=max_seq_len, padding="max_length")``, serialized: its Rust ``tokenizers.Tokenizer``
    (the fast tokenizer's backend, with the overrides transformers applies from tokenizer_config.json)
    with that truncation and padding switched on. ``encode_frame`` needs only the ``tokenizers``
    package to use it: the engine's Python workers skip importing transformers and torch (~1.8 s each)."""
    import tokenizers

    if truncation_side not in ("right", "left"):
        raise ValueError(f"truncation_side must be 'right' or 'left', got {truncation_side!r}")
    hf = load_tokenizer(source)
    backend = tokenizers.Tokenizer.from_str(hf.backend_tokenizer.to_str())  # a copy: the cached one stays as is
    backend.enable_truncation(max_seq_len, stride=0, strategy="longest_first", direction=truncation_side)
    backend.enable_padding(length=max_seq_len, direction=hf.padding_side, pad_id=hf.pad_token_id,
                           pad_type_id=hf.pad_token_type_id, pad_token=hf.pad_token)
    return backend.to_str()


@lru_cache(maxsize=8)
def _encoder(spec: str):
    import tokenizers

    return tokenizers.Tokenizer.from_str(spec)


def encode_frame(frame: pd.DataFrame, encoder: str) -> pd.DataFrame:
    """``text``/``label`` rows -> fixed-length ``input_ids``/``attention_mask``/``label`` rows with the
    serialized tokenizer ``encoder`` (``encoder_json``)."""
    encodings = _encoder(encoder).encode_batch(frame["text"].tolist(), add_special_tokens=True)
    return pd.DataFrame(
        {
            "input_ids": [np.asarray(e.ids, dtype=np.int32) for e in encodings],
            "attention_mask": [np.asarray(e.attention_mask, dtype=np.int8) for e in encodings],
            "label": frame["label"].astype("int64").to_numpy(),
        }
    )


def tokenize_frame(frame: pd.DataFrame, tokenizer_source: str, max_seq_len: int,
                   truncation_side: str = "right") -> pd.DataFrame:
    """``text``/``label`` rows -> fixed-length ``input_ids``/``attention_mask``/``label`` rows.

    A review longer than ``max_seq_len`` tokens loses its end (``right``, the library's default)
    or its beginning (``left``: the review's conclusion is kept; [CLS] stays first either way).
    The same ids as the Hugging Face tokenizer's call (``tests/data/test_preprocess.py`` checks it).
    """
    return encode_frame(frame, encoder_json(tokenizer_source, max_seq_len, truncation_side))


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
