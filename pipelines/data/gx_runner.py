"""Great Expectations plumbing of the validation stages: an ephemeral context whose stores live
in the run folder, running one suite on a dataframe, and turning results into the stage summary."""

from __future__ import annotations

import json
import logging
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipelines.runfolder.fileio import atomic_write_text
from pipelines.runfolder.paths import RunPaths

log = logging.getLogger("pipelines.data.validate")  # the stage's logger, as before the split


class DataValidationError(ValueError):
    """Data failed its expectations; the message lists each failure."""


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
        if (cfg.get("meta") or {}).get("examples"):  # a few offending rows (near-duplicate checks)
            failure["examples"] = list(cfg["meta"]["examples"])
        out.append(failure)
    return out


def example_line(example: dict) -> str:
    """``test[3] "text..." ~ train[12] "text..." (Jaccard 0.95)``: one matching pair of rows."""
    similarity = f" (Jaccard {example['jaccard']})" if "jaccard" in example else " (same normalised text)"
    return (f"{example.get('row')} {example.get('text', '')!r} ~ {example.get('match')} "
            f"{example.get('match_text', '')!r}{similarity}")


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
            + "".join(f"\n      e.g. {example_line(e)}" for e in f.get("examples", []))
            for f in failures
        ]
        raise DataValidationError(
            f"{stage} validation failed, {len(failures)} expectation(s):\n" + "\n".join(lines)
            + f"\nresults: {paths.validation}, data docs: {summary['data_docs']}"
        )
    log.info("%s validation passed; data docs %s", stage, summary["data_docs"])
    return summary
