"""The what-if model proved on cells it never saw: fit on one part of a campaign, predict the other.

    .venv/bin/python bench/whatif_validate.py CAMPAIGN_DIR [--json OUT]

``CAMPAIGN_DIR`` holds the run folders ``bench/whatif_validate.sh`` trains (each a
``python -m pipelines run --profile cluster``); an axis whose runs are missing is skipped, said so.
Every axis fits ``pipelines.whatif`` on its fit cells and predicts each held-out cell at that cell's
own hosts, ranks, link, CPU share and job, then prints per platform the median and largest absolute
error of the cell total, and the term that was furthest off (predicted - measured, seconds):

  hosts      fit 1-2 hosts, predict 3-4 (run "hosts": 4 hosts of half a core, 1-4 workers, unshaped)
  bandwidth  fit unshaped + 1gbit, predict 100mbit + 50mbit (run "links": 2 hosts, 2 workers)
  device     fit hosts of a whole core (run "core1"), predict half a core (the "hosts" run's 1-2 host
             cells): a device twice as slow
  job        fit 1 epoch (run "epochs1", trained right after "epochs3"; else the "hosts" run's 1-2 host
             cells), predict 3 epochs (run "epochs3")
  strategy   fit the default strategy, predict fp16 and powersgd-r2 from their payloads alone (run
             "strategies": 2 hosts at 100mbit; one run, so the machine's speed is the same for both)

Hosts share this machine's 2 cores: each has a CPU quota of half a core (``cluster.cpu_per_host``),
the same in fit and prediction except on the device axis, which is about that share.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from pipelines.config.sections import ProjectedJob, WhatIfConfig
from pipelines.whatif import fit, observations
from pipelines.whatif.model import DEFAULT_STRATEGY, Model
from pipelines.whatif.observe import Observation
from pipelines.whatif.predict import Prediction, WhatIfError, predict_one

MEDIAN_OK, WORST_OK = 0.15, 0.30  # the bar: median |error| <= 15 %, no cell beyond 30 %


def _cells(campaign: Path, run: str) -> list[Observation]:
    folder = campaign / run
    return observations(folder) if (folder / "config.json").exists() else []


def axes(campaign: Path) -> dict[str, tuple[list[Observation], list[Observation]]]:
    """axis -> (fit cells, held-out cells); an axis without both is left out."""
    hosts, links, core1 = _cells(campaign, "hosts"), _cells(campaign, "links"), _cells(campaign, "core1")
    epochs3, strategies = _cells(campaign, "epochs3"), _cells(campaign, "strategies")
    epochs1 = _cells(campaign, "epochs1")
    small = [o for o in hosts if o.hosts <= 2]
    default = [o for o in strategies if o.strategy == DEFAULT_STRATEGY]
    found = {
        "hosts": (small, [o for o in hosts if o.hosts >= 3]),
        "bandwidth": ([o for o in links if o.network in ("unshaped", "1gbit")],
                      [o for o in links if o.network in ("100mbit", "50mbit")]),
        "device": (core1, small),
        "job": (epochs1 or small, epochs3),
        "strategy": (default, [o for o in strategies if o.strategy != DEFAULT_STRATEGY]),
    }
    return {axis: (f, p) for axis, (f, p) in found.items() if f and p}


def target_of(o: Observation, model: Model) -> WhatIfConfig:
    """The held-out cell's own cluster, CPU share and job, as a question to the model."""
    share = o.host_cores / model.cores_per_host
    return WhatIfConfig(hosts=o.hosts, workers_per_host=o.workers_per_host,
                        network=o.network if o.rate_bps else "unshaped", step_ms=None, reference_seconds=None,
                        cpu_share=None if abs(share - 1) < 1e-9 else share,
                        job=ProjectedJob(train_samples=o.train_samples, epochs=o.epochs, test_samples=o.test_samples))


def measured_phases(o: Observation) -> dict[str, float]:
    """The held-out cell's phases as the prediction names them."""
    return {"provision": o.provision, "launch": o.launch, "teardown": o.teardown, "warm-up": o.warmup or 0.0,
            "compute": o.compute, "communication": o.communication, "data": o.data,
            "evaluation": sum(o.eval_epochs) + o.final_test, "checkpoint": sum(o.checkpoint_epochs) + o.export,
            "other": o.other}


def worst_term(pred: Prediction, o: Observation) -> tuple[str, float]:
    measured = measured_phases(o)
    return max(((p, pred.phases[p] - measured[p]) for p in pred.phases), key=lambda kv: abs(kv[1]))


def validate(campaign: Path) -> list[dict]:
    rows = []
    for axis, (fit_cells, held_out) in axes(campaign).items():
        model = fit(fit_cells)
        by_platform: dict[str, list[dict]] = {}
        for o in held_out:
            try:
                # the strategy's payload is known before it runs (its hook's bytes): the held-out cell's
                pred = predict_one(model, o.platform, target_of(o, model), o.strategy, o.batch_per_worker,
                                   o.payload_bytes)
            except WhatIfError as err:
                print(f"  {axis}: {o.cell}: not predicted: {err}", file=sys.stderr)
                continue
            term, off = worst_term(pred, o)
            by_platform.setdefault(o.platform, []).append({
                "cell": o.cell, "measured": o.total, "predicted": pred.total, "low": pred.low, "high": pred.high,
                "error": pred.total / o.total - 1, "worst_term": term, "worst_term_off_s": off})
        for platform, cells in sorted(by_platform.items()):
            errors = [abs(c["error"]) for c in cells]
            worst = max(cells, key=lambda c: abs(c["error"]))
            rows.append({"axis": axis, "platform": platform, "fit_cells": sum(o.platform == platform for o in fit_cells),
                         "held_out": len(cells), "median_abs_error": statistics.median(errors),
                         "max_abs_error": max(errors), "inside_interval": sum(c["low"] <= c["measured"] <= c["high"]
                                                                              for c in cells),
                         "worst_cell": worst["cell"], "worst_term": worst["worst_term"],
                         "worst_term_off_s": worst["worst_term_off_s"],
                         "ok": statistics.median(errors) <= MEDIAN_OK and max(errors) <= WORST_OK, "cells": cells})
    return rows


def table(rows: list[dict]) -> str:
    head = ["axis", "platform", "fit", "held out", "median |err|", "max |err|", "in 95 %", "worst term (pred - meas)",
            "bar"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['axis']} | {r['platform']} | {r['fit_cells']} | {r['held_out']} | "
                     f"{r['median_abs_error'] * 100:.1f} % | {r['max_abs_error'] * 100:.1f} % | "
                     f"{r['inside_interval']}/{r['held_out']} | {r['worst_term']} {r['worst_term_off_s']:+.1f} s "
                     f"({r['worst_cell']}) | {'met' if r['ok'] else 'missed'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("campaign", type=Path)
    parser.add_argument("--json", type=Path, help="write every held-out cell's prediction here")
    args = parser.parse_args(argv)
    if not args.campaign.is_dir():
        parser.error(f"{args.campaign}: not a folder")
    rows = validate(args.campaign)
    if not rows:
        print(f"{args.campaign}: no axis has both its fit and its held-out cells (run bench/whatif_validate.sh)",
              file=sys.stderr)
        return 1
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
