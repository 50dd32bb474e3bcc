"""Two benchmark runs side by side: the config fields that differ and each cell's change.

    from pipelines.web.comparison import compare_runs
    diff = compare_runs(older, newer)      # RunRecords from pipelines.web.trends.RunIndex

Used by the Benchmarks page's "Compare two runs" view (pipelines/web/view.py). Pure: reads
nothing but the two records.
"""

from __future__ import annotations

import json
from typing import Any

from pipelines import platforms
from pipelines.web.trends import RunRecord

# metric, label ({reference}: the reference platform's name, filled in by compare_runs), scale
COMPARED = (("total_seconds", "total s", 1), ("training_seconds", "training s", 1),
            ("samples_per_second", "samples/s", 1), ("overhead_vs_reference_total", "overhead vs {reference} %", 100),
            ("test_accuracy", "test accuracy %", 100))


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.dumps(value) if isinstance(value, list) else value}


def compare_runs(a: RunRecord, b: RunRecord) -> dict[str, Any]:
    """Config fields that differ, and per cell (backend-wN) both runs' medians and b's change."""
    fa, fb = _flatten(a.config), _flatten(b.config)
    diff = [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    keys = list(a.aggregates) + [k for k in b.aggregates if k not in a.aggregates]
    failed_a = {f["key"] for f in a.failed}
    failed_b = {f["key"] for f in b.failed}
    reference = platforms.reference()
    rows = []
    for key in keys:
        ga, gb = a.aggregates.get(key, {}), b.aggregates.get(key, {})
        row: dict[str, Any] = {"cell": key, "metrics": [],
                               "repeats": (f"{ga.get('repeats_ok', '-')}/{ga.get('repeats', '-')}",
                                           f"{gb.get('repeats_ok', '-')}/{gb.get('repeats', '-')}"),
                               "failed": (key in failed_a, key in failed_b)}
        for metric, label, scale in COMPARED:
            label = label.format(reference=reference)
            if metric == "overhead_vs_reference_total" and (ga or gb).get("backend") == reference:
                row["metrics"].append({"metric": metric, "label": label, "a": None, "b": None, "delta": None,
                                       "pct": None})  # the reference itself
                continue
            va, vb = ga.get(metric), gb.get(metric)
            va = None if va is None else va * scale
            vb = None if vb is None else vb * scale
            delta = None if va is None or vb is None else vb - va
            pct = None if delta is None or not va or scale != 1 else delta / va
            row["metrics"].append({"metric": metric, "label": label, "a": va, "b": vb, "delta": delta,
                                   "pct": pct})
        rows.append(row)
    return {"a": a, "b": b, "config_diff": diff, "config_same": len(set(fa) | set(fb)) - len(diff),
            "cells": rows}
