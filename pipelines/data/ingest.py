"""Ingest: IMDB from the hub or a local folder -> a sampled, content-hashed snapshot.

Run as a stage (``python -m pipelines run`` or the Airflow DAG) or directly::

    from pipelines.data.ingest import ingest
    manifest = ingest(config, paths)

Reads ``config.data.dataset_source``, which is either

* a hub dataset id (``stanfordnlp/imdb``): ``datasets.load_dataset`` with splits train/test, or
* a local folder holding, per split, ``<split>.parquet``, ``<split>/*.parquet``,
  ``<split>-*.parquet``, ``<split>.csv``, ``<split>.jsonl``, or the original aclImdb tree
  (``<split>/pos/*.txt``, ``<split>/neg/*.txt``; also when nested in ``aclImdb/``).

Writes ``snapshot/{train,validation,test}.parquet`` (text: string, label: int64; validation is a
seeded, stratified ``validation_fraction`` carved from the train sample) and
``snapshot/manifest.json`` (source, kind, rows per split and label, sha256 of each split's
content, seed, sample sizes, created_at). Same config -> byte-identical snapshot files.

Sampling is stratified by label (largest-remainder allocation, then a seeded draw per label)
and the result is shuffled with the same seed, because sources are often sorted by label.
Ingest copies what the source holds and never repairs it: a missing column or a bad label is
left for ``validate_snapshot`` to report. Fails with ``DataSourceError`` when the source
cannot be read (unreachable hub id without a cached copy, missing folder, unknown layout).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.config import BenchmarkConfig
from pipelines.data.manifest import SNAPSHOT_SPLITS, observed_labels
from pipelines.runfolder.fileio import atomic_write, atomic_write_json
from pipelines.runfolder.paths import PROJECT_ROOT, RunPaths

log = logging.getLogger(__name__)

SPLITS = ("train", "test")  # what a source provides; the snapshot adds validation (SNAPSHOT_SPLITS)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
HOW_TO = (
    "Provide the data locally: set dataset_source to a folder such as ../shared/data/imdb "
    "holding train/test as <split>.parquet, <split>/*.parquet, <split>.csv or <split>.jsonl "
    "(columns text, label) or the aclImdb tree (<split>/pos/*.txt, <split>/neg/*.txt); "
    "or make the hub reachable / pre-populate the Hugging Face datasets cache."
)


class DataSourceError(RuntimeError):
    """The dataset source cannot be read; the message says what to do instead."""


# --- reading the source ----------------------------------------------------------------------


def _local_path(source: str) -> Path | None:
    """The existing folder a source names (cwd first, then the project root), else None."""
    raw = Path(source).expanduser()
    candidates = [raw] if raw.is_absolute() else [Path.cwd() / raw, PROJECT_ROOT / raw]
    return next((p.resolve() for p in candidates if p.exists()), None)


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", ".", "~")) or "\\" in source or not _HUB_ID.match(source)


def _load_hub(dataset_id: str) -> dict[str, pd.DataFrame]:
    import datasets

    try:
        dsd = datasets.load_dataset(dataset_id)
    except OSError as err:  # ConnectionError, DatasetNotFoundError, offline mode: all OSError
        raise DataSourceError(
            f"dataset_source={dataset_id!r}: not a local folder, and the hub dataset cannot be "
            f"loaded (hub unreachable and no cached copy: {err}). {HOW_TO}"
        ) from err
    missing = [s for s in SPLITS if s not in dsd]
    if missing:
        raise DataSourceError(
            f"dataset_source={dataset_id!r}: hub dataset has no split(s) {missing} "
            f"(has {list(dsd)}). {HOW_TO}"
        )
    return {s: dsd[s].to_pandas() for s in SPLITS}


def _not_utf8(path: Path, err: UnicodeDecodeError) -> DataSourceError:
    """Name the file, the line and the byte that is not UTF-8, and how to convert it."""
    data = path.read_bytes()
    line = data.count(b"\n", 0, err.start) + 1
    return DataSourceError(
        f"{path}: line {line}, byte {err.start}: not UTF-8 ({err.reason}: {data[err.start:err.start + 4]!r}). "
        f"Reviews are read as UTF-8: convert the file, e.g. iconv -f latin1 -t utf-8 {path.name} > fixed.{path.suffix.lstrip('.')}")


def _read_text_table(path: Path, kind: str) -> pd.DataFrame:
    """CSV / JSON lines with errors that name the file, line and encoding, and the fix."""
    try:
        if kind == "csv":
            # text as str: a review "123" must not become a number; an empty field is null
            frame = pd.read_csv(path, dtype={"text": str}, encoding="utf-8")
        else:
            frame = pd.read_json(path, lines=True, dtype=False, encoding="utf-8")
    except UnicodeDecodeError as err:
        raise _not_utf8(path, err) from None
    except (pd.errors.ParserError, ValueError) as err:
        raise DataSourceError(f"{path}: cannot parse it as {kind.upper()} ({err}). Expected a header with "
                              "columns text,label separated by commas (CSV) or one JSON object per line "
                              "(JSON lines); check the delimiter and quoting.") from None
    if kind == "csv" and len(frame.columns) == 1 and any(sep in str(frame.columns[0]) for sep in ";\t|"):
        raise DataSourceError(f"{path}: one column {frame.columns[0]!r}: the file is not comma-separated. "
                              "Save it with ',' as delimiter (columns text,label).")
    return frame


def _read_acl_split(split_dir: Path) -> pd.DataFrame:
    rows = []
    for folder, label in (("neg", 0), ("pos", 1)):  # the original tree: sentiment = folder
        for f in sorted((split_dir / folder).glob("*.txt")):
            try:
                rows.append((f.read_text(encoding="utf-8"), label))
            except UnicodeDecodeError as err:
                raise _not_utf8(f, err) from None
    return pd.DataFrame(rows, columns=["text", "label"]).astype({"label": "int64"})


def _find_split(root: Path, split: str) -> tuple[str, pd.DataFrame] | None:
    """First layout that holds ``split`` under ``root`` -> (kind, frame), else None."""
    if (root / f"{split}.parquet").is_file():
        return "parquet", pd.read_parquet(root / f"{split}.parquet")
    shards = sorted((root / split).glob("*.parquet")) if (root / split).is_dir() else []
    shards = shards or sorted(root.glob(f"{split}-*.parquet"))
    if shards:
        return "parquet", pd.concat([pd.read_parquet(f) for f in shards], ignore_index=True)
    if (root / f"{split}.csv").is_file():
        return "csv", _read_text_table(root / f"{split}.csv", "csv")
    if (root / f"{split}.jsonl").is_file():
        return "jsonl", _read_text_table(root / f"{split}.jsonl", "jsonl")
    if (root / split / "pos").is_dir() or (root / split / "neg").is_dir():
        return "aclimdb", _read_acl_split(root / split)
    return None


def _load_local(root: Path) -> tuple[str, dict[str, pd.DataFrame]]:
    if not root.is_dir():
        raise DataSourceError(f"dataset_source={str(root)!r} is not a folder. {HOW_TO}")
    if (root / "aclImdb").is_dir() and _find_split(root, "train") is None:
        root = root / "aclImdb"  # the extracted tarball's top folder
    kinds, frames = set(), {}
    for split in SPLITS:
        found = _find_split(root, split)
        if found is None:
            raise DataSourceError(
                f"dataset_source={str(root)!r}: no {split!r} split found "
                f"(folder holds {sorted(p.name for p in root.iterdir())[:20]}). {HOW_TO}"
            )
        kinds.add(found[0])
        frames[split] = found[1]
    return "+".join(sorted(kinds)), frames


def load_source(source: str) -> tuple[str, str, dict[str, pd.DataFrame]]:
    """``dataset_source`` -> (kind, resolved source, {split: raw frame})."""
    local = _local_path(source)
    if local is not None:
        kind, frames = _load_local(local)
        return kind, str(local), frames
    if _looks_like_path(source):
        raise DataSourceError(
            f"dataset_source={source!r}: path does not exist "
            f"(resolved to {Path(source).expanduser().resolve()}). {HOW_TO}"
        )
    return "hub", source, _load_hub(source)


# --- sampling and writing --------------------------------------------------------------------


def _allocate(counts: pd.Series, n: int) -> dict:
    """Largest-remainder split of ``n`` over groups in proportion to their sizes."""
    exact = counts / counts.sum() * n
    alloc = np.floor(exact).astype(int)
    order = (exact - alloc).sort_values(ascending=False, kind="stable").index
    for key in order[: n - int(alloc.sum())]:
        alloc[key] += 1
    return alloc.to_dict()


def imbalanced_shares(labels: list, class_ratio: float) -> pd.Series:
    """Target share per label: the smallest label gets 1 part, every other ``class_ratio`` parts."""
    first = min(labels)
    return pd.Series({k: 1.0 if k == first else class_ratio for k in labels})


def sample_split(frame: pd.DataFrame, n: int | None, seed: int, stream: int,
                 class_ratio: float | None = None) -> tuple[pd.DataFrame, bool]:
    """Seeded stratified sample of ``n`` rows (all rows if None or more than exist), shuffled.

    ``class_ratio`` (config, train only): an imbalanced sample on purpose, every label other
    than the smallest gets ``class_ratio`` times its rows (as many rows as the classes allow).
    Returns (sample, stratified). Without a ``label`` column the draw is plain random.
    """
    rng = np.random.default_rng([seed, stream])  # one stream per split: train/test independent
    frame = frame.reset_index(drop=True)
    take = len(frame) if n is None else min(n, len(frame))
    stratified = "label" in frame.columns
    if class_ratio is not None and stratified:
        groups = frame.groupby("label", dropna=False, sort=False).indices
        keys = list(groups)
        shares = imbalanced_shares(keys, class_ratio)
        # the most rows the smallest-share-adjusted classes allow, at most ``take``
        room = min(len(groups[k]) / (shares[k] / shares.sum()) for k in keys)
        alloc = _allocate(shares.rename(index=dict(zip(keys, range(len(keys))))), int(min(take, room)))
        picked = np.concatenate(
            [rng.choice(groups[k], size=alloc[i], replace=False) for i, k in enumerate(keys)]
        )
    elif take == len(frame):
        picked = np.arange(len(frame))
    elif stratified:
        groups = frame.groupby("label", dropna=False, sort=False).indices  # label -> positions
        keys = list(groups)
        alloc = _allocate(pd.Series({i: len(groups[k]) for i, k in enumerate(keys)}), take)
        picked = np.concatenate(
            [rng.choice(groups[k], size=alloc[i], replace=False) for i, k in enumerate(keys)]
        )
    else:
        picked = rng.choice(len(frame), size=take, replace=False)
    return frame.iloc[rng.permutation(np.sort(picked))].reset_index(drop=True), stratified


def carve_validation(train: pd.DataFrame, fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split the train sample into (train, validation): a seeded, stratified ``fraction``.

    The validation split is what each epoch is evaluated on and what time-to-target is
    measured on, so the test split is used once, at the end (no selection on test).
    """
    n_val = min(len(train) - 1, max(1, round(len(train) * fraction))) if len(train) > 1 else 0
    numbered = train.reset_index(drop=True).assign(_row=np.arange(len(train)))
    picked, _ = sample_split(numbered, n_val, seed, stream=len(SPLITS))  # its own random stream
    mask = np.zeros(len(train), dtype=bool)
    mask[picked["_row"].to_numpy()] = True
    return (numbered[~mask].drop(columns="_row").reset_index(drop=True),
            picked.drop(columns="_row").reset_index(drop=True))


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """Store integral labels as int64 (nullable when nulls exist); leave anything else as is."""
    out = frame.copy()
    label = out["label"] if "label" in out.columns else None
    if label is not None and pd.api.types.is_numeric_dtype(label) and not pd.api.types.is_bool_dtype(label):
        values = out["label"].dropna()
        if len(values) == 0 or (values == np.round(values)).all():
            out["label"] = out["label"].astype("Int64" if out["label"].isna().any() else "int64")
    return out


def content_hash(frame: pd.DataFrame) -> str:
    """sha256 of the rows in order (JSON lines): independent of file encoding details."""
    payload = frame.to_json(orient="records", lines=True, force_ascii=False, default_handler=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
    # no pandas metadata: the same rows give the same bytes; temp + fsync + rename
    atomic_write(path, lambda fh: pq.write_table(table, fh))


def _label_counts(frame: pd.DataFrame) -> dict[str, int] | None:
    if "label" not in frame.columns:
        return None
    counts = frame["label"].value_counts(dropna=False, sort=False)
    return {str(k): int(v) for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))}


def ingest(config: BenchmarkConfig, paths: RunPaths) -> dict:
    """Load, sample and snapshot the data set; returns the manifest (also written as JSON)."""
    kind, resolved, frames = load_source(config.data.dataset_source)
    paths.snapshot.mkdir(parents=True, exist_ok=True)
    requested = {"train": config.data.train_samples, "test": config.data.test_samples}
    samples, facts = {}, {}
    for stream, split in enumerate(SPLITS):
        raw = frames[split]
        ratio = config.data.class_ratio if split == "train" else None  # test stays as the source is
        sample, stratified = sample_split(raw, requested[split], config.training.seed, stream, ratio)
        samples[split] = _normalise(sample)
        if requested[split] is not None and requested[split] > len(raw):
            if config.data.allow_small_data:
                log.warning("%s: data.%s_samples=%d but the source has %d rows: taking all %d "
                            "(data.allow_small_data=true)", split, split, requested[split], len(raw), len(raw))
            else:  # the data contract (validate) refuses it, with the same words
                log.warning("%s: data.%s_samples=%d but the source has %d rows: the data contract will refuse "
                            "it; set data.%s_samples <= %d (or null: all rows), or data.allow_small_data=true",
                            split, split, requested[split], len(raw), split, len(raw))
        if not stratified:
            log.warning("%s: no 'label' column, sample is not stratified", split)
        facts[split] = {"source_rows": len(raw), "requested_samples": requested[split], "stratified": stratified}
    samples["train"], samples["validation"] = carve_validation(samples["train"], config.data.validation_fraction,
                                                               config.training.seed)
    facts["validation"] = {**facts["train"], "carved_from": "train", "fraction": config.data.validation_fraction}
    splits = {}
    for split in SNAPSHOT_SPLITS:
        sample = samples[split]
        _write_parquet(sample, paths.snapshot_split(split))
        splits[split] = {
            "file": paths.snapshot_split(split).name,
            "rows": len(sample),
            **facts[split],
            "columns": [str(c) for c in sample.columns],
            "rows_per_label": _label_counts(sample),
            "sha256": content_hash(sample),
        }
    labels = observed_labels(splits["train"]["rows_per_label"])
    manifest = {
        "source": config.data.dataset_source,
        "resolved_source": resolved,
        "source_kind": kind,
        "seed": config.training.seed,
        "train_samples": config.data.train_samples,
        "test_samples": config.data.test_samples,
        "validation_fraction": config.data.validation_fraction,
        **({"class_ratio": config.data.class_ratio} if config.data.class_ratio is not None else {}),
        "splits": splits,
        # the task: the train split's label set (validate_snapshot checks it is 0..K-1)
        "labels": labels,
        "num_classes": len(labels) if labels else None,
    }
    old = json.loads(paths.manifest.read_text()) if paths.manifest.exists() else {}
    if {k: v for k, v in old.items() if k != "created_at"} == manifest:
        manifest["created_at"] = old["created_at"]  # a rerun changes nothing, not even the time
    else:
        manifest["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        if paths.tokens.exists():  # tokens of another snapshot must never be trained on
            shutil.rmtree(paths.tokens)
    atomic_write_json(paths.manifest, manifest)
    log.info("snapshot %s: %s", paths.snapshot, {s: v["rows_per_label"] for s, v in splits.items()})
    return manifest
