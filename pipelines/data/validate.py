"""Great Expectations checks on the raw snapshot and on the tokenized shards.

Run as stages (``validate_snapshot`` after ingest, ``validate_tokens`` after preprocess)::

    from pipelines.data.validate import validate_snapshot, validate_tokens
    summary = validate_snapshot(config, paths)

Reads ``snapshot/{train,test}.parquet`` + ``manifest.json`` (and ``tokens/<split>/part-*.parquet``).
Writes, pass or fail, into ``validation/``: one GX result JSON per suite
(``snapshot_train.json`` ...), ``snapshot_summary.json`` / ``tokens_summary.json`` (success,
failures, train/test overlap), GX's own stores (``gx_store/``) and the Data Docs site
(``data_docs/index.html``, listing both stages). ``preprocess`` refuses to run unless
``snapshot_summary.json`` says the current snapshot passed.

The suites are in ``pipelines.data.expectations``, the GX plumbing in ``pipelines.data.gx_runner``.

Fails with ``DataValidationError`` whose message lists each failed expectation as
split, expectation type, column and observed value. The data contract (suite
``snapshot_contract``) refuses test rows whose text is also in train above
``max_overlap_fraction`` (IMDB itself has 0.5 %), repeated texts within a split above
``max_duplicate_fraction``, fewer rows than requested and classes below ``min_rows_per_class``
(the last two pass with ``allow_small_data``, and such a run is never a regression baseline).
The overlap and duplicate bounds also hold on normalised text (case, spacing, punctuation and
markup ignored) and on near-copies (MinHash, Jaccard >= ``near_duplicate_threshold``; bounds
``max_near_overlap_fraction`` / ``max_near_duplicate_fraction``, by default the exact ones):
``pipelines.data.near_duplicates``. Their expectations carry the rule and a few matching rows
of both sides (``meta``), which the failure message shows.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from pipelines.config import BenchmarkConfig
from pipelines.data.expectations import (class_expectations, class_frame, contract_expectations,
                                         contract_frame, contract_relaxed, expected_labels,
                                         snapshot_expectations, token_expectations)
from pipelines.data.expectations import class_share_bound  # noqa: F401  (imported from here)
from pipelines.data.gx_runner import DataValidationError, _context, _finish, _run_suite
from pipelines.data.gx_runner import failures_of  # noqa: F401  (imported from here)
from pipelines.data.manifest import SNAPSHOT_SPLITS, read_manifest
from pipelines.data.near_duplicates import text_duplicates
from pipelines.runfolder.paths import RunPaths

log = logging.getLogger(__name__)


# --- snapshot -----------------------------------------------------------------------------


def _overlap(frames: dict[str, pd.DataFrame]) -> dict:
    if any("text" not in f.columns for f in frames.values()):
        return {"test_rows_in_train": None, "unique_texts": None}
    train_texts = set(frames["train"]["text"].dropna())
    in_train = frames["test"]["text"].isin(train_texts)
    return {
        "test_rows_in_train": int(in_train.sum()),
        "unique_texts": int(frames["test"]["text"][in_train].nunique()),
        "within_split_duplicates": {s: int(f["text"].duplicated().sum()) for s, f in frames.items()},
    }


def validate_snapshot(config: BenchmarkConfig, paths: RunPaths) -> dict:
    """GX suites on both snapshot splits; returns the summary or raises DataValidationError."""
    manifest = read_manifest(paths)
    labels = expected_labels(manifest)
    paths.validation.mkdir(parents=True, exist_ok=True)
    frames = {s: pd.read_parquet(paths.snapshot_split(s)) for s in SNAPSHOT_SPLITS}
    context = _context(paths)
    results = {}
    for split in SNAPSHOT_SPLITS:
        results[split] = _run_suite(context, paths, "snapshot", split, frames[split],
                                    snapshot_expectations(config, manifest["splits"][split]["rows"], labels))
        if split == "validation":  # carved from train, stratified: its balance is train's
            continue
        # class balance: each of the task's classes holds at least its share of the split
        results[f"{split}_classes"] = _run_suite(context, paths, "snapshot", f"{split}_classes",
                                                 class_frame(frames[split], labels),
                                                 class_expectations(config, labels, split))
    # the data contract: no leakage into test, few duplicates (exact, normalised, near-copies),
    # the rows and classes asked for
    started = time.perf_counter()
    texts = text_duplicates(frames, config.data.near_duplicate_threshold)
    seconds = round(time.perf_counter() - started, 3)
    contract = contract_frame(frames, manifest, labels, texts.facts)
    results["contract"] = _run_suite(context, paths, "snapshot", "contract", contract,
                                     contract_expectations(config, list(contract.columns), texts.examples,
                                                           {s: manifest["splits"][s].get("source_rows")
                                                            for s in ("train", "test")}))
    facts = contract.iloc[0].to_dict()
    overlap = _overlap(frames)
    if overlap["test_rows_in_train"]:
        log.warning("%d test reviews also appear in train (exact duplicates)", overlap["test_rows_in_train"])
    extra = {
        "train_test_overlap": overlap,
        "snapshot_sha256": {s: manifest["splits"][s]["sha256"] for s in SNAPSHOT_SPLITS},
        "labels": labels,
        "contract": {"facts": facts, "relaxed": contract_relaxed(config, facts)},
        "near_duplicates": {**texts.settings, "rows": texts.counts, "examples": texts.examples,
                            "seconds": seconds},
    }
    return _finish(paths, context, "snapshot", results, extra)


def require_valid_snapshot(paths: RunPaths) -> None:
    """Raise unless the saved snapshot validation passed for the snapshot now on disk."""
    summary_path = paths.validation_summary("snapshot")
    if not summary_path.exists():
        raise DataValidationError(f"{summary_path} missing: run validate_snapshot before preprocessing")
    summary = json.loads(summary_path.read_text())
    if not summary.get("success"):
        raise DataValidationError(
            f"the snapshot failed validation ({len(summary.get('failures', []))} failed expectations, "
            f"see {summary_path}): refusing to preprocess it"
        )
    current = {s: v["sha256"] for s, v in read_manifest(paths)["splits"].items()}
    if summary.get("snapshot_sha256") != current:
        raise DataValidationError(
            f"the snapshot changed since it was validated ({summary_path}): run validate_snapshot again"
        )


# --- tokens -------------------------------------------------------------------------------


def _token_frame(split_dir: Path) -> tuple[pd.DataFrame, dict]:
    """Shards -> one row per example with the per-row facts GX checks (lengths, id range)."""
    files = sorted(split_dir.glob("part-*.parquet"))
    if not files:
        raise FileNotFoundError(f"no token shards (part-*.parquet) in {split_dir}: run preprocess first")
    raw = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    schema = {f.name: str(f.type) for f in pq.read_schema(files[0])}

    def per_row(column: str, fn) -> pd.Series:
        if column not in raw.columns:
            return None
        return raw[column].map(lambda a: None if a is None or len(a) == 0 else fn(a))

    helpers = {
        "input_len": per_row("input_ids", len),
        "mask_len": per_row("attention_mask", len),
        "id_min": per_row("input_ids", lambda a: int(a.min())),
        "id_max": per_row("input_ids", lambda a: int(a.max())),
        "first_id": per_row("input_ids", lambda a: int(a[0])),
        "mask_min": per_row("attention_mask", lambda a: int(a.min())),
        "mask_max": per_row("attention_mask", lambda a: int(a.max())),
    }
    frame = pd.DataFrame({k: v for k, v in helpers.items() if v is not None})
    if "label" in raw.columns:
        frame["label"] = raw["label"]
    return frame, schema


def validate_tokens(config: BenchmarkConfig, paths: RunPaths) -> dict:
    """GX suites on the token shards of both splits; returns the summary or raises."""
    from pipelines.data.tokens import load_tokenizer

    manifest = read_manifest(paths)
    paths.validation.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(config.data.tokenizer_source)
    vocab_size, cls_id = len(tokenizer), tokenizer.cls_token_id
    context = _context(paths)
    results, schemas = {}, {}
    for split in SNAPSHOT_SPLITS:
        frame, schemas[split] = _token_frame(paths.token_split(split))
        snapshot_labels = pd.read_parquet(paths.snapshot_split(split), columns=["label"])["label"]
        check_order = "label" in frame.columns and len(snapshot_labels) == len(frame)
        if check_order:
            frame["snapshot_label"] = snapshot_labels.to_numpy()
        expectations = token_expectations(
            config, manifest["splits"][split]["rows"], vocab_size, cls_id, check_order,
            expected_labels(manifest))
        results[split] = _run_suite(context, paths, "tokens", split, frame, expectations)
    extra = {"vocab_size": vocab_size, "cls_token_id": cls_id, "max_seq_len": config.data.max_seq_len,
             "shard_schema": schemas}
    return _finish(paths, context, "tokens", results, extra)
