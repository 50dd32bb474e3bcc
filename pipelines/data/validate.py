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

Fails with ``DataValidationError`` whose message lists each failed expectation as
split, expectation type, column and observed value. The data contract (suite
``snapshot_contract``) refuses test rows whose text is also in train above
``max_overlap_fraction`` (IMDB itself has 0.5 %), repeated texts within a split above
``max_duplicate_fraction``, fewer rows than requested and classes below ``min_rows_per_class``
(the last two pass with ``allow_small_data``, and such a run is never a regression baseline).
"""

from __future__ import annotations

import json
import logging
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from pipelines.config import BenchmarkConfig
from pipelines.data.manifest import SNAPSHOT_SPLITS, ManifestError, read_manifest, task_labels
from pipelines.fileio import atomic_write_text
from pipelines.paths import RunPaths

log = logging.getLogger(__name__)



class DataValidationError(ValueError):
    """Data failed its expectations; the message lists each failure."""


# --- GX plumbing --------------------------------------------------------------------------


def _context(paths: RunPaths):
    """Ephemeral GX context whose suites and results live on disk, so Data Docs list both stages."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    def fs(class_name: str, folder: Path) -> dict:
        backend = {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(folder)}
        return {"class_name": class_name, "store_backend": backend}

    store = paths.validation / "gx_store"
    defaults = InMemoryStoreBackendDefaults()  # checkpoints etc. stay in memory
    stores = dict(defaults.stores)
    stores[defaults.expectations_store_name] = fs("ExpectationsStore", store / "expectations")
    stores[defaults.validation_results_store_name] = fs("ValidationResultsStore", store / "validations")
    site = {
        "class_name": "SiteBuilder",
        "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                          "base_directory": str(paths.data_docs)},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }
    config = DataContextConfig(
        store_backend_defaults=defaults,
        stores=stores,
        data_docs_sites={"local_site": site},
        analytics_enabled=False,  # no network here, and none wanted
        progress_bars=ProgressBarsConfig(globally=False),
    )
    return gx.get_context(mode="ephemeral", project_config=config)


def _run_suite(
    context, paths: RunPaths, stage: str, split: str, frame: pd.DataFrame, expectations: list
) -> dict:
    """One ExpectationSuite + ValidationDefinition on a dataframe; result as a JSON dict."""
    import great_expectations as gx

    name = f"{stage}_{split}"
    # a rerun replaces this suite's earlier results instead of piling them up in the docs
    shutil.rmtree(paths.validation / "gx_store" / "validations" / name, ignore_errors=True)
    source = context.data_sources.add_or_update_pandas(stage)
    batch = source.add_dataframe_asset(split).add_batch_definition_whole_dataframe(f"{name}_all")
    suite = context.suites.add_or_update(gx.ExpectationSuite(name=name, expectations=expectations))
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=name, data=batch, suite=suite)
    )
    result = definition.run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
    as_dict = result.to_json_dict()
    atomic_write_text(paths.validation_result(stage, split), json.dumps(as_dict, indent=2, default=str))
    return as_dict


def _short(value: Any, limit: int = 120) -> str:
    if isinstance(value, np.generic):  # np.float64(1.0) -> 1.0 in messages
        value = value.item()
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exception_message(info: Any) -> str | None:
    """GX nests exception info per metric; find the first message raised."""
    if isinstance(info, dict):
        if info.get("raised_exception") and info.get("exception_message"):
            return str(info["exception_message"])
        for value in info.values():
            found = _exception_message(value)
            if found:
                return found
    return None


def failures_of(split: str, result: dict) -> list[dict]:
    """Failed expectations of one GX result -> [{split, expectation, column, observed, expected}].

    Errors of expectations on a column that does not exist are folded into that column's
    ``expect_column_to_exist`` failure: one line per missing column, not one per expectation.
    """
    failed = [item for item in result["results"] if not item["success"]]
    missing = {
        item["expectation_config"]["kwargs"].get("column")
        for item in failed
        if item["expectation_config"]["type"] == "expect_column_to_exist"
    }
    out = []
    for item in failed:
        cfg = item["expectation_config"]
        kwargs = {k: v for k, v in cfg["kwargs"].items() if k != "batch_id"}
        column = kwargs.get("column") or "/".join(
            str(kwargs[k]) for k in ("column_A", "column_B") if k in kwargs
        ) or "(table)"
        res = item.get("result") or {}
        error = _exception_message(item.get("exception_info"))
        if cfg["type"] == "expect_column_to_exist":
            observed = "column missing"
        elif error and kwargs.get("column") in missing:
            continue  # a follow-on error of the missing column, already listed
        elif error:
            observed = f"error: {error}"
        elif "observed_value" in res:
            observed = _short(res["observed_value"])
        elif "unexpected_count" in res:
            observed = (
                f"{res['unexpected_count']} of {res.get('element_count')} rows unexpected, "
                f"e.g. {_short(res.get('partial_unexpected_list', [])[:3])}"
            )
        else:
            observed = _short(res)
        expected = {k: v for k, v in kwargs.items() if k not in ("column", "column_A", "column_B")}
        failure = {"split": split, "expectation": cfg["type"], "column": column,
                   "observed": observed, "expected": _short(expected) if expected else ""}
        if (cfg.get("meta") or {}).get("notes"):  # what the bound means and how to change it
            failure["note"] = str(cfg["meta"]["notes"])
        out.append(failure)
    return out


def _finish(paths: RunPaths, context, stage: str, results: dict[str, dict], extra: dict) -> dict:
    """Build Data Docs, write the summary, raise on any failure (docs and JSON kept either way)."""
    shutil.rmtree(paths.data_docs, ignore_errors=True)  # rebuilt from the stores: no stale pages
    context.build_data_docs()
    failures = [f for split, res in results.items() for f in failures_of(split, res)]
    summary = {
        "stage": stage,
        "success": not failures,
        "failures": failures,
        "statistics": {split: res["statistics"] for split, res in results.items()},
        "results": {split: f"{stage}_{split}.json" for split in results},
        "data_docs": str(paths.data_docs / "index.html"),
        "validated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **extra,
    }
    atomic_write_text(paths.validation_summary(stage), json.dumps(summary, indent=2, default=str))
    if failures:
        lines = [
            f"  - {f['split']}: {f['expectation']} on {f['column']}: observed {f['observed']}"
            + (f" (expected {f['expected']})" if f["expected"] else "")
            + (f": {f['note']}" if f.get("note") else "")
            for f in failures
        ]
        raise DataValidationError(
            f"{stage} validation failed, {len(failures)} expectation(s):\n" + "\n".join(lines)
            + f"\nresults: {paths.validation}, data docs: {summary['data_docs']}"
        )
    log.info("%s validation passed; data docs %s", stage, summary["data_docs"])
    return summary


# --- snapshot -----------------------------------------------------------------------------


def expected_labels(manifest: dict) -> list[int]:
    """The task's label set (manifest); when the train labels do not form 0..K-1, the set they
    should have been (0..K-1 for K distinct labels), so GX names every row outside it."""
    try:
        return task_labels(manifest)
    except ManifestError as err:
        log.warning("%s", err)
        count = len(manifest.get("splits", {}).get("train", {}).get("rows_per_label") or {})
        return list(range(max(count, 2)))


def class_share_bound(config: BenchmarkConfig, num_classes: int, split: str = "test") -> float:
    """Smallest allowed share of one class: ``min_class_fraction`` is the bound for two classes,
    scaled to K classes (0.4 for 2 classes -> 0.267 for 3).

    A train split made imbalanced on purpose (``class_ratio``) is held to the share the ratio
    asks for instead (ratio / (1 + (K-1) ratio), less 10 % for rounding), so the contract still
    catches a train split even more skewed than requested; test keeps ``min_class_fraction``."""
    bound = config.min_class_fraction * 2 / num_classes
    if split == "train" and config.class_ratio is not None:
        intended = config.class_ratio / (1 + (num_classes - 1) * config.class_ratio)
        return min(bound, 0.9 * intended)
    return bound


def class_frame(frame: pd.DataFrame, labels: list[int]) -> pd.DataFrame:
    """One row per label of the task: its share of the split (what the balance suite checks)."""
    counts = frame["label"].value_counts() if "label" in frame.columns else pd.Series(dtype="int64")
    total = max(len(frame), 1)
    return pd.DataFrame({"label": labels, "share": [float(counts.get(k, 0)) / total for k in labels]})


def class_expectations(config: BenchmarkConfig, labels: list[int], split: str = "test") -> list:
    import great_expectations.expectations as gxe

    bound = class_share_bound(config, len(labels), split)
    note = ("" if split != "train" or config.class_ratio is None
            else f" (class_ratio={config.class_ratio}: train imbalanced on purpose)")
    if split == "train" and config.class_ratio is None:
        note = " (an imbalanced train split on purpose: set class_ratio, which relaxes this bound for train)"
    return [gxe.ExpectColumnValuesToBeBetween(column="share", min_value=bound,
                                              meta={"notes": f"every class holds >= {bound:.3f} of {split}{note}"})]


def snapshot_expectations(config: BenchmarkConfig, expected_rows: int, labels: list[int]) -> list:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnToExist(column="text"),
        gxe.ExpectColumnToExist(column="label"),
        gxe.ExpectTableColumnsToMatchSet(column_set=["text", "label"], exact_match=True),
        gxe.ExpectTableRowCountToEqual(value=expected_rows),  # what the manifest promised
        gxe.ExpectTableRowCountToBeBetween(min_value=1),  # an empty split is never fine
        gxe.ExpectColumnValuesToBeOfType(column="text", type_="str"),
        gxe.ExpectColumnValuesToBeOfType(column="label", type_="int64"),
        gxe.ExpectColumnValuesToNotBeNull(column="text"),
        gxe.ExpectColumnValuesToNotBeNull(column="label"),
        gxe.ExpectColumnValuesToNotMatchRegex(column="text", regex=r"^\s*$"),  # blank after strip
        gxe.ExpectColumnValueLengthsToBeBetween(
            column="text", min_value=config.min_text_chars, max_value=config.max_text_chars
        ),
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=labels),  # the manifest's task
    ]


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


def contract_frame(frames: dict[str, pd.DataFrame], manifest: dict, labels: list[int]) -> pd.DataFrame:
    """One row of data-contract facts: leakage, duplicates, rows against the request, class sizes."""
    facts: dict[str, float] = {}
    if all("text" in f.columns for f in frames.values()):
        train_texts = set(frames["train"]["text"].dropna()) | set(frames["validation"]["text"].dropna())
        test = frames["test"]["text"]
        facts["test_rows_in_train_fraction"] = float(test.isin(train_texts).mean()) if len(test) else 0.0
        for split, frame in frames.items():
            facts[f"duplicate_fraction_{split}"] = float(frame["text"].duplicated().mean()) if len(frame) else 0.0
    splits = manifest.get("splits", {})
    sampled = {"train": splits.get("train", {}).get("rows", 0) + splits.get("validation", {}).get("rows", 0),
               "test": splits.get("test", {}).get("rows", 0)}
    for split in ("train", "test"):
        requested = splits.get(split, {}).get("requested_samples")
        facts[f"rows_short_{split}"] = float(max(0, (requested or 0) - sampled[split]))
        counts = frames[split]["label"].value_counts() if "label" in frames[split].columns else pd.Series()
        facts[f"smallest_class_{split}"] = float(min((counts.get(k, 0) for k in labels), default=0))
    return pd.DataFrame([facts])


def contract_expectations(config: BenchmarkConfig, columns: list[str]) -> list:
    import great_expectations.expectations as gxe

    out = []
    for column in columns:
        if column == "test_rows_in_train_fraction":
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, max_value=config.max_overlap_fraction))
        elif column.startswith("duplicate_fraction_"):
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, max_value=config.max_duplicate_fraction))
        elif column.startswith("rows_short_") and not config.allow_small_data:
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, max_value=0))
        elif column.startswith("smallest_class_") and not config.allow_small_data:
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, min_value=config.min_rows_per_class))
    return out


def contract_relaxed(config: BenchmarkConfig, facts: dict) -> bool:
    """The data passed only because allow_small_data let it: such a run is never a baseline."""
    small = any(v > 0 for k, v in facts.items() if k.startswith("rows_short_")) or any(
        v < config.min_rows_per_class for k, v in facts.items() if k.startswith("smallest_class_"))
    return config.allow_small_data and small


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
    # the data contract: no leakage into test, few duplicates, the rows and classes asked for
    contract = contract_frame(frames, manifest, labels)
    results["contract"] = _run_suite(context, paths, "snapshot", "contract", contract,
                                     contract_expectations(config, list(contract.columns)))
    facts = contract.iloc[0].to_dict()
    overlap = _overlap(frames)
    if overlap["test_rows_in_train"]:
        log.warning("%d test reviews also appear in train (exact duplicates)", overlap["test_rows_in_train"])
    extra = {
        "train_test_overlap": overlap,
        "snapshot_sha256": {s: manifest["splits"][s]["sha256"] for s in SNAPSHOT_SPLITS},
        "labels": labels,
        "contract": {"facts": facts, "relaxed": contract_relaxed(config, facts)},
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


def token_expectations(config: BenchmarkConfig, expected_rows: int, vocab_size: int, cls_id: int | None,
                       check_order: bool, labels: list[int]) -> list:
    import great_expectations.expectations as gxe

    length = config.max_seq_len
    helpers = ("input_len", "mask_len", "id_min", "id_max", "first_id", "mask_min", "mask_max", "label")
    expectations = [gxe.ExpectColumnToExist(column=c) for c in helpers] + [
        gxe.ExpectTableRowCountToEqual(value=expected_rows),  # same rows as the snapshot
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="input_len", min_value=length, max_value=length),
        gxe.ExpectColumnValuesToBeBetween(column="mask_len", min_value=length, max_value=length),
        gxe.ExpectColumnValuesToBeBetween(column="id_min", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="id_max", max_value=vocab_size - 1),
        gxe.ExpectColumnValuesToBeBetween(column="mask_min", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="mask_max", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToNotBeNull(column="label"),
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=labels),
    ]
    if cls_id is not None:
        expectations.append(gxe.ExpectColumnValuesToBeInSet(column="first_id", value_set=[cls_id]))
    if check_order:  # labels line up with the snapshot row by row: the order contract holds
        expectations.append(gxe.ExpectColumnPairValuesToBeEqual(column_A="label", column_B="snapshot_label"))
    return expectations


def validate_tokens(config: BenchmarkConfig, paths: RunPaths) -> dict:
    """GX suites on the token shards of both splits; returns the summary or raises."""
    from pipelines.data.tokens import load_tokenizer

    manifest = read_manifest(paths)
    paths.validation.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(config.tokenizer_source)
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
    extra = {"vocab_size": vocab_size, "cls_token_id": cls_id, "max_seq_len": config.max_seq_len,
             "shard_schema": schemas}
    return _finish(paths, context, "tokens", results, extra)
