"""Token shards of a small stratified slice of the real IMDB copy, for the training tests.

The Spark preprocessing is tested on its own (tests/data); training tests only need the shard
layout it writes, built here with the same ``tokenize_frame`` the Spark job runs, and the
manifest's label counts (the task's label set comes from them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from pipelines.data.tokens import tokenize_frame
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import RunPaths


def write_token_shards(paths: RunPaths, imdb_dir: Path, tokenizer_dir: Path, *, train_per_class: int,
                       test_per_class: int, seq_len: int, seed: int, validation_per_class: int = 16,
                       relabel: Callable[[pd.DataFrame], pd.Series] | None = None) -> RunPaths:
    """``per_class`` reviews of each label per split, shuffled by ``seed``, as one shard each;
    the validation reviews come from the source's train split, disjoint from the train ones.

    ``relabel(frame) -> labels`` replaces the sentiment labels (e.g. a multi-class task).
    """
    splits = {}
    for split, per_class in (("train", train_per_class), ("validation", validation_per_class),
                             ("test", test_per_class)):
        source = "test" if split == "test" else "train"
        frame = pd.read_parquet(Path(imdb_dir) / f"{source}.parquet")
        frame = pd.concat(g.sample(train_per_class + validation_per_class if source == "train" else per_class,
                                   random_state=seed) for _, g in frame.groupby("label"))
        frame = frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)
        if source == "train":  # the first train_per_class of each label train, the rest validate
            rank = frame.groupby("label").cumcount()
            frame = frame[rank < train_per_class] if split == "train" else frame[rank >= train_per_class]
            frame = frame.reset_index(drop=True)
        if relabel is not None:
            frame["label"] = relabel(frame).astype("int64")
        out = paths.token_split(split)
        out.mkdir(parents=True)
        tokenize_frame(frame, str(tokenizer_dir), seq_len).to_parquet(out / "part-00000.parquet")
        counts = frame["label"].value_counts().sort_index()
        splits[split] = {"rows": len(frame), "rows_per_label": {str(k): int(v) for k, v in counts.items()}}
    atomic_write_json(paths.manifest, {"source": str(imdb_dir), "splits": splits})
    return paths
