"""The what-if answer in words: for the CLI (``text``), the report's "Your cluster" (``markdown``)
and JSON. A platform is named faster only where the 95 % intervals separate; else "within noise"."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.config.sections import WhatIfConfig
from pipelines.whatif.model import Model
from pipelines.whatif.predict import Prediction, calibrated, order_changes, predict, separated


@dataclass
class Answer:
    target: WhatIfConfig  # with the step the calibration found, if it did
    device: str  # what the step is: stated, calibrated to the reference, or the run's own
    predictions: list[Prediction]  # fastest first
    changes: list[str]  # where the order of two platforms flips
    link_efficiency: str

    def as_json(self) -> dict:
        return {"target": self.target.model_dump(), "device": self.device, "link_efficiency": self.link_efficiency,
                "predictions": [p.as_json() for p in self.predictions], "order_changes": self.changes}


def ask(model: Model, target: WhatIfConfig, reference: str) -> Answer:
    """``model``'s platforms on ``target`` (its step calibrated to ``reference``'s time where it states one)."""
    stated = target.step_ms is not None
    target = calibrated(model, target, reference)
    if stated:
        device = f"a training step of {target.step_ms:g} ms per rank (stated)"
    elif target.step_ms is not None:
        device = (f"a training step of {target.step_ms:.3g} ms per rank: the step at which {reference} takes "
                  f"{target.reference_seconds:g} s on {target.reference_workers} host(s) of one rank")
    else:
        device = (f"this run's device ({model.device}, {model.device_review_seconds * 1000:.3g} ms per review on a "
                  f"whole rank; a batch of {model.batch_per_worker} per rank)")
    predictions = predict(model, target)
    efficiency = (f"{model.link_efficiency * 100:.0f} % (fitted)" if model.link_efficiency_fitted else
                  f"{model.link_efficiency * 100:.0f} % (measured before, bench/RESULTS.md: these cells do not "
                  "separate it)")
    return Answer(target=target, device=device, predictions=predictions,
                  changes=order_changes(model, target, predictions), link_efficiency=efficiency)


def cluster_text(t: WhatIfConfig) -> str:
    job = t.job
    return (f"{t.hosts} host(s) x {t.workers_per_host} rank(s) over {t.network} links, "
            f"{job.train_samples:,} reviews x {job.epochs} epoch(s), tested on {job.test_samples:,}")


def ranking(predictions: list[Prediction]) -> str:
    """Which platform is faster, only where the intervals separate."""
    if not predictions:
        return "no platform to rank"
    lead = predictions[0]
    tied = [p.key for p in predictions[1:] if not separated(lead, p)]
    slower = [f"{p.key} {(p.total / lead.total - 1) * 100:+.0f} %" for p in predictions[1:] if separated(lead, p)]
    if tied:
        text = f"{', '.join([lead.key, *tied])} are within noise of each other (their 95 % intervals overlap)"
    else:
        text = f"{lead.key} is fastest beyond noise"
    return text + (f"; slower beyond noise: {', '.join(slower)}" if slower else "")


def leaning_on(predictions: list[Prediction]) -> list[str]:
    """Each note once, with the platforms it holds for: "<platform>, <platform>/fp16: warmup: no cell measured it"."""
    by_note: dict[str, list[str]] = {}
    for p in predictions:
        for note in p.notes:
            by_note.setdefault(note, []).append(p.key)
    return [f"{', '.join(keys)}: {note}" for note, keys in sorted(by_note.items())]


def _row(p: Prediction) -> list[str]:
    top = sorted(((v, k) for k, v in p.phases.items() if v > 0), reverse=True)[:3]
    return [p.key, f"{p.total:,.0f}", f"{p.low:,.0f}-{p.high:,.0f}", f"{p.fixed / p.total * 100:.0f} %" if p.total
            else "n/a", ", ".join(f"{k} {v:,.0f} s" for v, k in top)]


COLUMNS = ["platform", "predicted s", "95 % interval", "fixed share", "largest phases"]


def text(answer: Answer) -> str:
    """The CLI's answer."""
    lines = [f"What if: {cluster_text(answer.target)}", f"Device: {answer.device}",
             f"Link efficiency: {answer.link_efficiency}", ""]
    rows = [COLUMNS] + [_row(p) for p in answer.predictions]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines += ["", "Ranking: " + ranking(answer.predictions) + "."]
    if answer.changes:
        lines += ["", "Where the order changes:"] + [f"- {c}" for c in answer.changes]
    notes = leaning_on(answer.predictions)
    if notes:
        lines += ["", "Leaning on:"] + [f"- {n}" for n in notes]
    return "\n".join(lines)
