"""Each platform's communication and epoch time across link bandwidths, side by side.

    .venv/bin/python bench/network_sweep.py                       # every platform, 2 workers
    .venv/bin/python bench/network_sweep.py --backends ddp,spark --epochs 1 --train-samples 512
    .venv/bin/python bench/network_sweep.py --from-run runs/network-sweep-20250101-020000

Runs the benchmark on the emulated cluster (profile ``cluster``: hosts = network namespaces,
one core each, links shaped with ``tc``) once per network, as one run:

    python -m pipelines run --profile cluster --set 'networks=["unshaped","1gbit","100mbit"]' \\
        --set 'worker_counts=[2]' --set repeats=1 --output <dir> --run-id <id>

then reads ``<dir>/<id>/report/summary.json`` and prints one row per platform (and strategy)
with its communication phase and median epoch time at every network, and their ratios to the
unshaped link (the fastest network measured when unshaped is not among them). ``--from-run``
prints the table of an existing run folder without training. Needs root (the emulated
cluster); the training takes a while (every platform x network), the table is instant.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from pipelines.runfolder.paths import DEFAULT_STRATEGY, PROJECT_ROOT, RunPaths
from pipelines.runfolder.summary import Aggregate, RunSummary, read_summary

DEFAULT_NETWORKS = ("unshaped", "1gbit", "100mbit")


def _compact(value: list) -> str:
    return json.dumps(value, separators=(",", ":"))


def sweep_command(args: argparse.Namespace) -> list[str]:
    """The ``python -m pipelines run`` command line of the sweep."""
    cmd = [sys.executable, "-m", "pipelines", "run", "--profile", args.profile,
           "--set", f"networks={_compact(args.networks)}",
           "--set", f"worker_counts={_compact(args.workers)}", "--set", f"repeats={args.repeats}",
           "--output", str(args.output), "--run-id", args.run_id]
    if args.backends:
        cmd += ["--set", f"backends={_compact(args.backends)}"]
    if args.strategies:
        cmd += ["--set", f"strategies={_compact(args.strategies)}"]
    if args.epochs is not None:
        cmd += ["--set", f"epochs={args.epochs}"]
    if args.train_samples is not None:
        cmd += ["--set", f"train_samples={args.train_samples}"]
    return cmd


def networks_and_reference(summary: RunSummary) -> tuple[list[str], str | None]:
    """The run's networks that have aggregates (in the run's order) and the one ratios refer to:
    unshaped, else the first (the profile lists the fastest first)."""
    networks = [n for n in summary.networks if any(a.network == n for a in summary.aggregates)]
    networks += [n for n in dict.fromkeys(a.network for a in summary.aggregates) if n not in networks]
    if not networks:
        return [], None
    return networks, "unshaped" if "unshaped" in networks else networks[0]


def sweep_table(summary: RunSummary) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per (platform, strategy, workers > 1) the communication phase and median
    epoch time at every network of the run, and their ratios to the reference network's."""
    networks, ref = networks_and_reference(summary)
    header = ["platform", "strategy", "workers"]
    for n in networks:
        header += [f"{n} comm s", f"{n} epoch s"]
    for n in networks:
        if n != ref:
            header += [f"{n} comm x", f"{n} epoch x"]
    groups: dict[tuple, dict[str, Aggregate]] = {}
    for a in summary.aggregates:
        if a.workers > 1:
            groups.setdefault((str(a.backend), a.strategy, a.workers), {})[a.network] = a
    rows = []
    for (backend, strategy, workers), by_net in groups.items():
        row = [backend, strategy, str(workers)]
        for n in networks:
            a = by_net.get(n)
            row += [_num(a and a.communication_seconds), _num(a and a.epoch_seconds)]
        base = by_net.get(ref)
        for n in networks:
            if n != ref:
                a = by_net.get(n)
                row += [_ratio(a, base, "communication_seconds"), _ratio(a, base, "epoch_seconds")]
        rows.append(row)
    rows.sort(key=lambda r: (r[0], r[1] != DEFAULT_STRATEGY, r[1], int(r[2])))
    return header, rows


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _ratio(a: Aggregate | None, base: Aggregate | None, field: str) -> str:
    mine, ref = getattr(a, field, None), getattr(base, field, None)
    return "n/a" if mine is None or not ref else f"{mine / ref:.2f}x"


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_run(run_dir: Path) -> int:
    summary = read_summary(RunPaths(run_dir))
    header, rows = sweep_table(summary)
    if not rows:
        print(f"{run_dir}: no multi-worker cell finished; nothing went over a link")
        return 1
    networks, ref = networks_and_reference(summary)
    print(f"run {summary.run} (cluster {summary.cluster}; networks {', '.join(networks)}): communication "
          f"phase (whole training) and median epoch time, seconds; x = ratio to {ref}")
    print(format_table(header, rows))
    if summary.failed:
        print(f"{len(summary.failed)} failed cell(s): " + "; ".join(f.cell for f in summary.failed))
    return 0


def _list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-run", type=Path, help="print the table of this run folder; no training")
    parser.add_argument("--networks", type=_list, default=list(DEFAULT_NETWORKS),
                        help="comma-separated link settings (default unshaped,1gbit,100mbit)")
    parser.add_argument("--workers", type=lambda t: [int(n) for n in _list(t)], default=[2],
                        help="comma-separated worker counts (default 2)")
    parser.add_argument("--backends", type=_list, help="comma-separated platforms (default: the profile's)")
    parser.add_argument("--strategies", type=_list,
                        help="comma-separated strategies, e.g. default,powersgd-r2")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--train-samples", type=int)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profile", default="cluster")
    parser.add_argument("--output", type=Path, default=PROJECT_ROOT / "runs",
                        help="output root (default runs/)")
    parser.add_argument("--run-id", default=f"network-sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    if args.from_run is not None:
        return print_run(args.from_run)
    cmd = sweep_command(args)
    print("+", " ".join(cmd), flush=True)
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=PROJECT_ROOT, check=False)
    print(f"run finished with code {done.returncode} after {time.monotonic() - started:.0f} s", flush=True)
    run_dir = args.output / args.run_id
    if not RunPaths(run_dir).summary.exists():
        print(f"{RunPaths(run_dir).summary} missing: the run did not get to its report", file=sys.stderr)
        return done.returncode or 1
    return print_run(run_dir) or done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
