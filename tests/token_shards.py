"""Token shards of a small stratified slice of the real IMDB copy, for the training tests.

The Spark preprocessing is tested on its own (tests/data); training tests only need the shard
layout it writes, built here with the same ``tokenize_frame`` the Spark job runs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipelines.data.tokens import tokenize_frame
from pipelines.paths import RunPaths


def write_token_shards(paths: RunPaths, imdb_dir: Path, tokenizer_dir: Path, *, train_per_class: int,
                       test_per_class: int, seq_len: int, seed: int) -> RunPaths:
    """``per_class`` reviews of each label per split, shuffled by ``seed``, as one shard each."""
    for split, per_class in (("train", train_per_class), ("test", test_per_class)):
        frame = pd.read_parquet(Path(imdb_dir) / f"{split}.parquet")
        frame = pd.concat(g.sample(per_class, random_state=seed) for _, g in frame.groupby("label"))
        frame = frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)
        out = paths.token_split(split)
        out.mkdir(parents=True)
        tokenize_frame(frame, str(tokenizer_dir), seq_len).to_parquet(out / "part-00000.parquet")
    return paths
