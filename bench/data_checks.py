"""Cost of the normalised + near-duplicate data checks on the full IMDB (25k train + 25k test).

    source scripts/airflow_env.sh && .venv/bin/python bench/data_checks.py            # 1 round
    .venv/bin/python bench/data_checks.py --rounds 3 --json /tmp/data_checks.json      # medians

Ingests the whole data set once (the ``paper`` profile: every review; the source is the site
default, ``BENCHMARK_DATASET_SOURCE`` from scripts/airflow_env.sh, else ../shared/data/imdb),
then times the whole ``validate_snapshot`` step (all GX suites, Data Docs, summary) with the
new checks and without them (``text_duplicates`` replaced by an empty report, i.e. the exact
checks only), interleaved per round. Prints wall and CPU seconds side by side with their
ratio, the checks' own time against the data stage's (ingest + validate; with ``--tokens`` also
Spark tokenization and the token checks, on local[2]), and the fractions the real data gives
against the contract's bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from pipelines.runfolder.paths import PROJECT_ROOT, RunPaths

SHARED = Path(os.environ.get("SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))


def _config(output_root: Path):
    from pipelines.config import load_config

    source = os.environ.get("BENCHMARK_DATASET_SOURCE") or str(SHARED / "imdb")
    tokenizer = os.environ.get("BENCHMARK_TOKENIZER_SOURCE") or str(SHARED / "bert-tiny")
    return load_config("paper", {"dataset_source": source, "tokenizer_source": tokenizer,
                                 "output_root": str(output_root), "spark_master": "local[2]"})


def _tokens(config, paths: RunPaths) -> float:
    """Wall seconds of the rest of the data stage: Spark tokenization + the token checks."""
    from pipelines.data.preprocess import preprocess
    from pipelines.data.validate import validate_tokens

    wall, _, _ = _timed(lambda: (preprocess(config, paths), validate_tokens(config, paths)))
    print(f"  preprocess + validate_tokens: {wall:.1f} s wall", flush=True)
    return wall


def _timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def _validate(config, paths: RunPaths, with_checks: bool) -> tuple[float, float, dict]:
    from pipelines.data import validate
    from pipelines.data.near_duplicates import DuplicateReport

    if with_checks:
        return _timed(lambda: validate.validate_snapshot(config, paths))
    with mock.patch.object(validate, "text_duplicates", lambda frames, threshold: DuplicateReport()):
        return _timed(lambda: validate.validate_snapshot(config, paths))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def _print_facts(config, summary: dict) -> None:
    from pipelines.data.expectations import near_bounds

    facts, rows = summary["contract"]["facts"], summary["near_duplicates"]["rows"]
    near_dup, near_overlap = near_bounds(config)
    print("\nfractions on the real data (rows) vs the contract's bound:")
    for column in sorted(facts):
        if not ("duplicate" in column or "test_rows" in column):
            continue
        if column.startswith("near_duplicate"):
            bound = near_dup
        elif column == "test_rows_near_train_fraction":
            bound = near_overlap
        elif "test_rows" in column:
            bound = config.data.max_overlap_fraction
        else:
            bound = config.data.max_duplicate_fraction
        count = f" ({rows[column]})" if column in rows else ""
        print(f"  {column:<42} {facts[column]:.4%}{count:<8} <= {bound:.2%}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="with/without pairs, interleaved (default 1)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--tokens", action="store_true", help="also time tokenization (the whole data stage)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="data-checks-") as tmp:
        from pipelines.data.ingest import ingest

        config = _config(Path(tmp) / "runs")
        paths = RunPaths(Path(tmp) / "runs" / "bench")
        ingest_wall, _, manifest = _timed(lambda: ingest(config, paths))
        rows = {s: v["rows"] for s, v in manifest["splits"].items()}
        print(f"source {config.data.dataset_source}: rows {rows}; ingest {ingest_wall:.1f} s wall")
        times: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
        checks = []
        summary: dict = {}
        for round_ in range(args.rounds):
            order = ("without", "with") if round_ % 2 == 0 else ("with", "without")
            for kind in order:
                wall, cpu, result = _validate(config, paths, kind == "with")
                times[kind].append((wall, cpu))
                if kind == "with":
                    summary = result
                    checks.append(result["near_duplicates"]["seconds"])
                print(f"  round {round_ + 1}: validate_snapshot {kind:<7} checks: {wall:6.1f} s wall "
                      f"{cpu:6.1f} s CPU", flush=True)
        tokens_wall = _tokens(config, paths) if args.tokens else 0.0  # the last run validated the snapshot

    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    check_s = statistics.median(checks)
    stage_with = ingest_wall + med["with"][0] + tokens_wall
    print(f"\nvalidate_snapshot on {rows['train'] + rows['validation']} train + {rows['test']} test reviews "
          f"(median of {args.rounds}):")
    print(f"  {'':<30} {'wall s':>8} {'CPU s':>8}")
    print(f"  {'without the new checks':<30} {med['without'][0]:8.1f} {med['without'][1]:8.1f}")
    print(f"  {'with the new checks':<30} {med['with'][0]:8.1f} {med['with'][1]:8.1f}")
    print(f"  {'ratio with / without':<30} {_ratio(med['with'][0], med['without'][0]):>8} "
          f"{_ratio(med['with'][1], med['without'][1]):>8}")
    print(f"  the checks themselves (text_duplicates): {check_s:.1f} s wall = "
          f"{check_s / med['with'][0]:.0%} of validate_snapshot, {check_s / stage_with:.0%} of the data stage "
          f"(ingest {ingest_wall:.1f} s + validate {med['with'][0]:.1f} s"
          + (f" + tokenize and check tokens {tokens_wall:.1f} s)" if args.tokens else ")"))
    _print_facts(config, summary)
    if args.json:
        args.json.write_text(json.dumps({
            "rows": rows, "ingest_s": ingest_wall, "tokens_s": tokens_wall, "rounds": args.rounds, "validate_s": times,
            "median": med, "checks_s": checks, "facts": summary["contract"]["facts"],
            "near_duplicates": {k: v for k, v in summary["near_duplicates"].items() if k != "examples"},
        }, indent=2))


if __name__ == "__main__":
    sys.exit(main())
