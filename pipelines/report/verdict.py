"""The report's opening verdict: what the run found, in a few sentences generated from its summary.

Per worker count (and network, when the run has several): the fastest platform and its time, each
other platform's overhead over it and the phase that carries most of the difference; each platform's
total projected to the study's job (or the configured one: ``pipelines.report.projection``) and from
which job length its fixed cost stays under 5 % of its total; whether the
platforms' test accuracies are at parity (within ``PARITY_POINTS``); the modes whose overhead is
not the platform's cluster overhead; the failed cells (first line of their error); the regression
check's outcome when ``report/regression.json`` is there (a re-report after the check). The chart
under it is ``verdict.png`` (``pipelines.report.plots.plot_verdict``).

Each sentence is kept as parts: the code's own words (may hold Markdown emphasis) and values from
results (escaped with ``_text`` in Markdown, shown as is in the plain text of ``verdict.json``,
which the Benchmarks page reads and Jinja escapes).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from typing import Any

from pipelines.runfolder.fileio import atomic_write_text
from pipelines.runfolder.paths import DEFAULT_STRATEGY, RunPaths
from pipelines.report.lifetimes import lifetime_sentences
from pipelines.report.network import networks_of
from pipelines.report.projection import FIXED_PERCENT, fixed_range, job_text, projected
from pipelines.report.tables import PHASE_ORDER, _text, mode_caveat, networked
from pipelines.runfolder.summary import Aggregate, RunSummary

PARITY_POINTS = 2.0  # accuracy parity: median test accuracies within this many percentage points
TIE = 0.01  # a platform less than 1 % slower than the fastest is "about as fast"
MAX_GROUPS = 3  # worker counts / networks told in full; the rest in one sentence
MAX_FAILED = 3  # failed cells named; the rest counted
ERROR_CHARS = 160
MESSAGE_CHARS = 240
CHART = "verdict.png"
VERDICT_FILE = "verdict.json"
VERSION = 1

Parts = list[tuple[str, bool]]  # (text, is a value from results)


def _say(template: str, **values: Any) -> Parts:
    """``template``'s words as code text, each ``{name[:spec]}`` as a value part."""
    parts: Parts = []
    for literal, name, spec, _ in string.Formatter().parse(template):
        if literal:
            parts.append((literal, False))
        if name is not None:
            parts.append((format(values[name], spec or ""), True))
    return parts


def _joined(pieces: list[Parts], sep: str) -> Parts:
    out: Parts = []
    for i, piece in enumerate(pieces):
        out += ([(sep, False)] if i else []) + piece
    return out


@dataclass(frozen=True)
class Finding:
    """One sentence of the verdict; ``kind``: fastest, projection (totals projected to the job),
    parity, modes, failed, regression (the check passed or set the baseline), regressed (it failed),
    nothing (no finished cell)."""

    kind: str
    parts: Parts

    def markdown(self) -> str:
        return "".join(_text(t) if value else t for t, value in self.parts)

    def plain(self) -> str:
        return "".join(t if value else t.replace("**", "") for t, value in self.parts)


@dataclass
class Verdict:
    lead: Parts
    findings: list[Finding] = field(default_factory=list)
    chart: str | None = CHART

    def markdown_lines(self) -> list[str]:
        """The section's Markdown: the lead, a blank line, the bullets, the chart."""
        lead = Finding("lead", self.lead).markdown()
        lines = [lead, "", *(f"- {f.markdown()}" for f in self.findings)]
        if self.chart:
            lines += ["", f"![Total time per platform, by phase]({self.chart})"]
        return lines

    def as_json(self) -> dict[str, Any]:
        return {"version": VERSION, "lead": Finding("lead", self.lead).plain(), "chart": self.chart,
                "findings": [{"kind": f.kind, "text": f.plain()} for f in self.findings]}


# --- the groups: one per (network, workers) --------------------------------------------------------

def _total(a: Aggregate) -> float | None:
    return a.total_seconds.median


def groups(summary: RunSummary) -> list[tuple[str, list[Aggregate]]]:
    """(label, aggregates) per (network, workers), the run's networks in order, then workers; each
    group's finished aggregates fastest first, then those with no finished repeat."""
    order = {n: i for i, n in enumerate(networks_of(summary))}
    out: dict[tuple[int, int], list[Aggregate]] = {}
    for a in summary.aggregates:
        out.setdefault((order.get(a.network, len(order)), a.workers), []).append(a)
    named = networked(summary)
    result = []
    for (_, workers), aggs in sorted(out.items()):
        label = f"{workers} worker{'s' if workers != 1 else ''}"
        if named:
            label += f" over {aggs[0].network}"
        aggs = sorted(aggs, key=lambda a: (_total(a) is None, _total(a) or 0.0))
        result.append((label, aggs))
    return result


def main_phase(a: Aggregate, fastest: Aggregate) -> tuple[str, float] | None:
    """The phase with the largest extra time of ``a`` over ``fastest`` (start-up / training for
    summaries without phases); None when no phase took longer."""
    if a.phases and fastest.phases:
        extra = {p: a.phases.get(p, 0.0) - fastest.phases.get(p, 0.0) for p in PHASE_ORDER}
    else:
        extra = {"start-up": (a.startup_seconds.median or 0.0) - (fastest.startup_seconds.median or 0.0),
                 "training": (a.training_seconds.median or 0.0) - (fastest.training_seconds.median or 0.0)}
    phase = max(extra, key=lambda p: extra[p])
    return (phase, extra[phase]) if extra[phase] > 0 else None


def _overlap(a: Aggregate, b: Aggregate) -> str | None:
    """Where their 95 % intervals overlap, the gap is within the noise: the repeats' intervals where
    both medians rest on 2+ repeats, else the what-if fit's (pipelines.whatif); which, or None."""
    for name, x, y in (("the repeats'", a.total_seconds_ci, b.total_seconds_ci),
                       ("the what-if fit's", a.total_seconds_fit, b.total_seconds_fit)):
        if None in (x.low, x.high, y.low, y.high) or (name == "the repeats'" and min(x.n, y.n) < 2):
            continue
        return name if x.low <= y.high and y.low <= x.high else None
    return None


def _names(aggs: list[Aggregate]) -> str:
    return ", ".join(str(a.backend) for a in aggs)


def _overhead(a: Aggregate, fastest: Aggregate) -> Parts:
    base, gap = _total(fastest), _total(a) - _total(fastest)
    rel = gap / base if base else 0.0
    if rel < TIE:
        return _say("{b} is about as fast ({pct:+.1f} %)", b=str(a.backend), pct=rel * 100)
    parts = _say("{b} is {pct:.1f} % slower (+{gap:.2f} s)", b=str(a.backend), pct=rel * 100, gap=gap)
    phase = main_phase(a, fastest)
    if phase:
        parts += _say(", most of it in {phase} (+{extra:.2f} s)", phase=phase[0], extra=phase[1])
    whose = _overlap(a, fastest)
    if whose:
        parts += _say(", within {whose} 95 % intervals: within noise, no ranking", whose=whose)
    return parts


def _group_finding(label: str, aggs: list[Aggregate]) -> list[Finding]:
    done = [a for a in aggs if _total(a) is not None]
    missing = [a for a in aggs if _total(a) is None]
    if not done:
        return [Finding("nothing", _say("At {label} no platform finished a repeat ({names}).",
                                        label=label, names=_names(missing)))]
    fastest = done[0]
    if len(done) > 1:
        lead = "At {label}, **{b}** is fastest: {t:.2f} s total"
    else:  # one platform configured here, or the others failed
        lead = "At {label}, only **{b}** finished: {t:.2f} s total" if missing else \
            "At {label}, **{b}** (the only platform) took {t:.2f} s total"
    parts = _say(lead, label=label, b=str(fastest.backend), t=_total(fastest))
    if fastest.workers > 1 and fastest.scaling_efficiency is not None:
        parts += _say(" (scaling efficiency {e:.2f})", e=fastest.scaling_efficiency)
    parts += [(".", False)]
    if len(done) > 1:
        parts += [(" ", False)] + _joined([_overhead(a, fastest) for a in done[1:]], "; ") + [(".", False)]
    if missing:
        parts += _say(" No finished repeat: {names}.", names=_names(missing))
    return [Finding("fastest", parts)]


def _told_in_full(grouped: list[tuple[str, list[Aggregate]]]) -> list[int]:
    """The groups told in full: all when one more sentence would tell the rest; else MAX_GROUPS,
    each network's largest worker count first (the most distributed cells), in the run's order."""
    if len(grouped) <= MAX_GROUPS + 1:
        return list(range(len(grouped)))
    top = {}
    for _, aggs in grouped:
        top[aggs[0].network] = max(top.get(aggs[0].network, 0), aggs[0].workers)
    first = [aggs[0] for _, aggs in grouped]
    ranked = sorted(range(len(grouped)), key=lambda i: (first[i].workers != top[first[i].network], i))
    return sorted(ranked[:MAX_GROUPS])


def _rest_finding(rest: list[tuple[str, list[Aggregate]]]) -> Finding:
    pieces = []
    for label, aggs in rest:
        done = [a for a in aggs if _total(a) is not None]
        pieces.append(_say("at {label} {b} ({t:.2f} s)", label=label, b=str(done[0].backend),
                           t=_total(done[0])) if done else _say("at {label} none finished", label=label))
    return Finding("fastest", _say("Fastest elsewhere: ") + _joined(pieces, "; ") + [(".", False)])


# --- projected to the job -----------------------------------------------------------------------------

def _projections_overlap(a, b) -> bool:
    """Two projections whose 95 % intervals (the what-if fit's, over the repeats) overlap: the
    data do not say which is faster. Without intervals (no fit), they are not said to overlap."""
    if None in (a.low_seconds, a.high_seconds, b.low_seconds, b.high_seconds):
        return False
    return a.low_seconds <= b.high_seconds and b.low_seconds <= a.high_seconds


def _projection_finding(summary: RunSummary, told: list[tuple[str, list[Aggregate]]]) -> Finding | None:
    """Each told group's platforms ranked by their total projected to the summary's job, and the
    job lengths from which their fixed costs stay under 5 %."""
    pieces = []
    for label, aggs in told:
        ranked = projected(aggs)
        if not ranked:
            continue
        lead = ranked[0][1]
        best = lead.total_seconds
        piece = _say("at {label} {b} {t:,.0f} s", label=label, b=str(ranked[0][0].backend), t=best)
        for a, proj in ranked[1:]:
            piece += _say(", {b} {pct:+.1f} %", b=str(a.backend), pct=(proj.total_seconds / best - 1) * 100)
            if _projections_overlap(lead, proj):
                piece += _say(" (within noise)")
        pieces.append(piece)
    if not pieces:
        return None
    parts = _say("Projected to {job} from each cell's fixed and per-epoch seconds: ", job=job_text(summary.job))
    parts += _joined(pieces, "; ") + [(".", False)]
    if any(text == " (within noise)" for piece in pieces for text, _ in piece):
        parts += _say(" Within noise: the 95 % intervals of the what-if fit (over the cells and repeats) overlap, "
                      "so these data do not say which is faster.")
    ends = fixed_range([a for _, aggs in told for a in aggs])
    if ends:
        low, high = (_say("{n:,.0f} reviews x epochs ({b}, {w} worker{s})", b=str(a.backend), w=a.workers,
                          n=a.projection.fixed_under_5pct_sample_epochs, s="s" if a.workers != 1 else "")
                     for a in ends)
        parts += _say(" The fixed cost (provision, launch, teardown) stays under {pct} % of the total from ",
                      pct=FIXED_PERCENT) + low + ([(" to ", False)] + high if ends[0] is not ends[1] else [])
        parts += [(".", False)]
    return Finding("projection", parts)


# --- accuracy, modes, failures, regression -----------------------------------------------------------

def _acc(a: Aggregate) -> float | None:
    return a.test_accuracy.median


def _parity_finding(summary: RunSummary, grouped: list[tuple[str, list[Aggregate]]]) -> Finding | None:
    scored = [(label, [a for a in aggs if _acc(a) is not None]) for label, aggs in grouped]
    scored = [(label, aggs) for label, aggs in scored if aggs]
    if not scored:
        return None
    compared = [(label, sorted(aggs, key=lambda a: -_acc(a))) for label, aggs in scored if len(aggs) > 1]
    if not compared:
        accs = _joined([_say("{acc:.4f} ({b} at {label})", acc=_acc(a), b=str(a.backend), label=label)
                        for label, aggs in scored for a in aggs], ", ")
        parts = _say("Accuracy: one platform per worker count, so no parity to check; median test "
                     "accuracy ") + accs + [(".", False)]
    else:
        off = [(label, a, aggs[0]) for label, aggs in compared for a in aggs[1:]
               if (_acc(aggs[0]) - _acc(a)) * 100 > PARITY_POINTS]
        if off:
            parts = _say("Accuracy is not at parity (more than {tol:g} points below the best at the same "
                         "setting): ", tol=PARITY_POINTS) + _joined(
                [_say("{b} at {label} {acc:.4f} vs {best}'s {top:.4f} ({gap:.1f} points)", b=str(a.backend),
                      label=label, acc=_acc(a), best=str(best.backend), top=_acc(best),
                      gap=(_acc(a) - _acc(best)) * 100) for label, a, best in off], "; ") + [(".", False)]
        else:
            label, aggs = max(compared, key=lambda g: _acc(g[1][0]) - _acc(g[1][-1]))
            parts = _say("Accuracy is at parity: at each setting the platforms' median test accuracies are "
                         "within {tol:g} points of each other (largest gap {gap:.1f} points, at {label}).",
                         tol=PARITY_POINTS, gap=(_acc(aggs[0]) - _acc(aggs[-1])) * 100, label=label)
    if "random_init" in summary.model_sources:
        parts += _say(" The model started from random weights: accuracies are not comparable with published "
                      "BERT-tiny results.")
    return Finding("parity", parts)


def _lifetime_finding(summary: RunSummary) -> Finding | None:
    sentences = lifetime_sentences(summary)
    return Finding("lifetimes", _say("Cluster lifetimes: " + " ".join(sentences))) if sentences else None


def _modes_finding(summary: RunSummary) -> Finding | None:
    modes = dict.fromkeys((str(a.backend), a.platform_mode) for a in summary.aggregates
                          if a.repeats_ok and a.platform_mode and mode_caveat(a.backend, a.platform_mode))
    if not modes:
        return None
    pieces = [_say("{b} ({mode})", b=b, mode=m) for b, m in modes]
    named = _joined(pieces[:-1], ", ") + [(" and ", False)] + pieces[-1] if len(pieces) > 1 else pieces[0]
    verb = " ran in modes that do not" if len(pieces) > 1 else " ran in a mode that does not"
    return Finding("modes", named + _say(verb + " measure a cluster's overhead; see 'Beside the published "
                                         "study'."))


def _first_line(text: Any, limit: int) -> str:
    lines = str(text or "").strip().splitlines()
    line = lines[0].strip() if lines else "no error recorded"
    return line if len(line) <= limit else line[:limit - 3].rstrip() + "..."


def _failed_finding(summary: RunSummary) -> Finding | None:
    if not summary.failed:
        return None
    n = len(summary.failed)
    named = _joined([_say("{cell} — {error}", cell=f.cell, error=_first_line(f.error, ERROR_CHARS))
                     for f in summary.failed[:MAX_FAILED]], "; ")
    parts = _say("**{n} cell{s} failed:** ", n=n, s="s" if n > 1 else "") + named
    if n > MAX_FAILED:
        parts += _say("; and {k} more", k=n - MAX_FAILED)
    return Finding("failed", parts + _say(". Details under 'Failed cells'."))


def _regression_finding(regression: dict[str, Any] | None) -> Finding | None:
    if not isinstance(regression, dict) or not regression.get("status"):
        return None
    status, message = str(regression["status"]), _first_line(regression.get("message"), MESSAGE_CHARS)
    templates = {"failed": "**Regression check failed:** {message}.",
                 "passed": "Regression check passed: {message}."}
    template = templates.get(status, "Regression check ({status}): {message}.")
    return Finding("regressed" if status == "failed" else "regression",
                   _say(template, status=status, message=message.rstrip(".")))


def regression_finding(regression: dict[str, Any] | None) -> dict[str, str] | None:
    """The regression sentence as verdict.json holds findings (the page adds it to a verdict
    written before the check ran)."""
    finding = _regression_finding(regression)
    return None if finding is None else {"kind": finding.kind, "text": finding.plain()}


# --- the verdict ----------------------------------------------------------------------------------------

def _lead(summary: RunSummary) -> Parts:
    repeats = max((a.repeats for a in summary.aggregates), default=0)
    strategies = sorted({a.strategy for a in summary.aggregates} - {DEFAULT_STRATEGY})
    if repeats == 1:  # no interval says how far apart two platforms really are
        parts = _say("What this run found (each cell's total wall time, one repeat: no intervals, so gaps "
                     "of a few percent can be run-to-run noise")
    else:
        parts = _say("What this run found (each cell's total wall time, median over {n} repeats", n=repeats)
    if strategies:
        parts += _say("; strategy {strategy}", strategy=", ".join(strategies))
    return parts + [("):", False)]


def build_verdict(summary: RunSummary, regression: dict[str, Any] | None = None,
                  chart: str | None = CHART) -> Verdict:
    """The verdict of ``summary`` (the platform view: one strategy); ``regression``: regression.json."""
    grouped = groups(summary)
    findings: list[Finding] = []
    if not any(_total(a) is not None for a in summary.aggregates):
        findings.append(Finding("nothing", _say("No cell finished, so there is nothing to compare.")))
    else:
        full = _told_in_full(grouped)
        for i in full:
            findings += _group_finding(*grouped[i])
        if len(full) < len(grouped):
            findings.append(_rest_finding([g for i, g in enumerate(grouped) if i not in full]))
        projection = _projection_finding(summary, [grouped[i] for i in full])
        findings += [projection] if projection else []
    extra = (_parity_finding(summary, grouped), _modes_finding(summary), _lifetime_finding(summary),
             _failed_finding(summary),
             _regression_finding(regression))
    findings += [f for f in extra if f is not None]
    return Verdict(lead=_lead(summary), findings=findings, chart=chart)


def read_regression(paths: RunPaths) -> dict[str, Any] | None:
    """report/regression.json if the check has run (a re-report after it); else None."""
    try:
        data = json.loads(paths.regression.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_verdict(verdict: Verdict, paths: RunPaths) -> None:
    """report/verdict.json: what the Benchmarks page's run view shows first."""
    atomic_write_text(paths.report / VERDICT_FILE, json.dumps(verdict.as_json(), indent=2))
