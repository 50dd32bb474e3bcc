"""The report's tables: platform texts (caveats, study overheads, colours), cell formatting,
the comparison, strategies and phases tables as rows of strings, and Markdown tables."""

from __future__ import annotations

import html
import re
from typing import Any

from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import DEFAULT_NETWORK, DEFAULT_STRATEGY
from pipelines.runfolder.summary import Aggregate, RunSummary
from pipelines.training import phases

# --- what the report says per platform: read from its record (pipelines.platforms) -----------

def _platform(backend: Any):
    """The registered platform of a backend name; None for one no longer registered (old runs)."""
    from pipelines import platforms

    return platforms.find(str(backend))


def mode_caveat(backend: Any, mode: str | None) -> str | None:
    """Why a platform's (non-cluster) mode does not measure its cluster overhead; None if nothing to say."""
    platform = _platform(backend)
    return platform.mode_caveats.get(mode) if platform and mode else None


def study_overhead(backend: Any) -> float | None:
    """The published study's overhead over its reference platform for a platform (0.21 = 21 % slower);
    None if not studied."""
    platform = _platform(backend)
    return platform.study_overhead if platform else None


def backend_colour(backend: Any) -> str | None:
    """The platform's plot colour; None: the plot's own colour cycle."""
    platform = _platform(backend)
    return platform.colour if platform else None


def reference_label() -> str:
    """The reference platform's human name (its record's ``label``, else its name): the report's
    overheads are measured against it."""
    from pipelines import platforms

    reference = platforms.get(platforms.reference())
    return reference.label or reference.name


# --- formatting ------------------------------------------------------------------------------

def _interval(ci, kind: str = "num", with_n: bool = False) -> str:
    """A 95 % interval "low - high"; "n/a" without one or with under 2 repeats (a zero-width one)."""
    if ci.low is None or ci.n < 2:
        return "n/a"
    text = f"{_fmt(ci.low, kind)} - {_fmt(ci.high, kind)}"
    return f"{text} ({ci.n})" if with_n else text


def has_intervals(summary: RunSummary) -> bool:
    """Whether any aggregate rests on 2+ repeats: only then do intervals mean something."""
    return any(max(a.total_seconds_ci.n, a.test_accuracy_ci.n) > 1 for a in summary.aggregates)


def _fmt(value: Any, kind: str = "num") -> str:
    if value is None:
        return "n/a"
    if kind == "pct":
        return f"{value * 100:+.1f} %"
    if kind == "ratio":
        return f"{value:.2f}"
    if kind in ("acc", "cost"):
        return f"{value:.4f}"
    return f"{value:.2f}"


def _mode(a: Aggregate, missing: str) -> str:
    """How the platform ran, and how the training rows reached its ranks: "cluster, dataframe feed"."""
    mode = a.platform_mode or missing
    return f"{mode}, {a.data_feed} feed" if a.data_feed else mode


# Markdown's own syntax, as character references: no table cell breaks, code spans, links or
# images (``[x](javascript:...)``), no backslash escapes; control characters (line breaks) -> space
_MARKDOWN = str.maketrans({"|": "&#124;", "`": "&#96;", "[": "&#91;", "]": "&#93;", "\\": "&#92;",
                           **{c: " " for c in [*map(chr, range(32)), "\x7f", "\u2028", "\u2029"]}})
_PLAIN = re.compile(r"[\w.:/@+=,~-]*")  # shows the same in a code span and as text


def _text(value: Any) -> str:
    """A value from results or config (errors, sources, names, hosts, modes), inert in Markdown and
    in the HTML made from it: no tags, entities, links, code spans or table breaks; shown as is."""
    return html.escape(str(value), quote=False).translate(_MARKDOWN)


def _code(value: Any) -> str:
    """A value as a code span when that shows it as is (ids, hashes), else as escaped text."""
    text = str(value)
    return f"`{text}`" if _PLAIN.fullmatch(text) else _text(text)


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table; every cell is escaped here (``_text``), the header is the code's own."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_text(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# --- the platform comparison --------------------------------------------------------------------

# The comparison in three narrow tables (none needs more than 1280 px): time, quality, throughput/cost.
# Intervals only when some cell has 2+ repeats (``has_intervals``); "network" after "workers"
# when the run's cells are not all local (``with_network``).
INTERVAL_COLUMNS = ("total s 95 % CI (n)", "test accuracy 95 % CI")
TIME_COLUMNS = [
    "backend", "mode", "workers", "repeats ok", "total s (median)", "total s 95 % CI (n)",
    "training s (median)", "overhead vs reference (total)", "overhead vs reference (training)", "resumed",
]
QUALITY_COLUMNS = ["backend", "workers", "test accuracy (median)", "test accuracy 95 % CI",
                   "test F1 (median)", "time to target s"]
# cost: priced from the price sheet ("What each platform costs"); peak memory in three scopes, each
# the largest over the repeats: the ranks (their RSS summed at the peak sample), the platform (every
# other process of the cell: launcher, JVMs, Ray daemons, the driver) and the whole cell (all of them)
MEMORY_COLUMNS = ("peak MB: ranks (max)", "peak MB: platform (max)", "peak MB: whole cell (max)")
RESOURCE_COLUMNS = ["backend", "workers", "samples/s (median)", "scaling efficiency", "cost USD (median)",
                    *MEMORY_COLUMNS]
COMPARISON_TABLES = (("Time", TIME_COLUMNS), ("Quality", QUALITY_COLUMNS),
                     ("Throughput, cost and resources", RESOURCE_COLUMNS))


def with_network(columns: list[str], summary: RunSummary) -> list[str]:
    """The columns, with "network" after "workers" when the run's cells are not all local."""
    if not networked(summary):
        return columns
    at = columns.index("workers")
    return [*columns[:at], "network", *columns[at:]]


def networked(summary: RunSummary) -> bool:
    """Whether any cell ran across hosts (or the run has several networks): tables name the network."""
    nets = {*summary.networks, *(a.network for a in summary.aggregates)}
    return len(nets) > 1 or nets != {DEFAULT_NETWORK}


def _net(a: Aggregate, summary: RunSummary) -> list[str]:
    return [a.network] if networked(summary) else []


def comparison_values(a: Aggregate) -> dict[str, str]:
    """Every comparison column's text for one aggregate (the tables pick theirs)."""
    tta = a.time_to_target_seconds
    return {
        "backend": str(a.backend), "mode": _mode(a, "n/a"), "network": a.network, "workers": str(a.workers),
        "repeats ok": f"{a.repeats_ok}/{a.repeats}", "total s (median)": _fmt(a.total_seconds.median),
        "total s 95 % CI (n)": _interval(a.total_seconds_ci, with_n=True),
        "training s (median)": _fmt(a.training_seconds.median),
        "samples/s (median)": _fmt(a.samples_per_second.median),
        "scaling efficiency": _fmt(a.scaling_efficiency, "ratio"),
        "overhead vs reference (total)": _fmt(a.overhead_vs_reference_total, "pct"),
        "overhead vs reference (training)": _fmt(a.overhead_vs_reference_training, "pct"),
        "resumed": f"{a.resumed_cells}/{a.repeats_ok}",
        "test accuracy (median)": _fmt(a.test_accuracy.median, "acc"),
        "test accuracy 95 % CI": _interval(a.test_accuracy_ci, "acc"),
        "test F1 (median)": _fmt(a.test_f1.median, "acc"),
        "time to target s": "not reached" if tta is None else f"{tta:.2f} ({a.reached_target}/{a.repeats_ok})",
        "cost USD (median)": "n/a" if a.cost is None else f"{a.cost:.6f}",
        **{title: _mb(value) for title, value in zip(MEMORY_COLUMNS, (
            a.ranks_peak_rss_mb_max, a.platform_peak_rss_mb_max, a.peak_rss_mb_max))},
    }


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def comparison_tables(summary: RunSummary) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the time, quality and cost tables, one row per aggregate."""
    intervals = has_intervals(summary)
    values = [comparison_values(a) for a in summary.aggregates]
    out = []
    for title, columns in COMPARISON_TABLES:
        header = [c for c in with_network(columns, summary) if intervals or c not in INTERVAL_COLUMNS]
        out.append((title, header, [[v[c] for c in header] for v in values]))
    return out


def platform_view(summary: RunSummary, config: BenchmarkConfig) -> RunSummary:
    """The summary restricted to the run's first strategy ("default" unless changed): what the
    platform comparison, the study section and the plots compare; strategies get their own table."""
    first = config.matrix.strategies[0].name
    return summary.model_copy(update={"aggregates": [a for a in summary.aggregates if a.strategy == first]})


# --- training strategies (issue 13) -------------------------------------------------------------

STRATEGY_COLUMNS = [
    "backend", "strategy", "workers", "repeats ok", "total s (median)", "training s (median)",
    "training vs default", "samples/s (median)", "test accuracy (median)", "test macro-F1 (median)",
    "test recall per class", "comm MB/step", "phases: data / compute / communication s",
]


def strategy_rows(summary: RunSummary) -> list[list[str]]:
    """One row per (backend, strategy, workers): time, accuracy, macro-F1, per-class recall (the
    imbalance strategies' effect), payload per step handed to collectives (comm hooks, local SGD)."""
    default = {(a.backend, a.network, a.workers): a for a in summary.aggregates if a.strategy == DEFAULT_STRATEGY}
    rows = []
    # grouped by backend, network and workers; strategies in the run's order (stable sort)
    nets = {n: i for i, n in enumerate(dict.fromkeys(a.network for a in summary.aggregates))}
    for a in sorted(summary.aggregates, key=lambda a: (str(a.backend), nets[a.network], a.workers)):
        base = default.get((a.backend, a.network, a.workers))
        vs_default = None
        if base is not None and a is not base and base.training_seconds.median and a.training_seconds.median:
            vs_default = a.training_seconds.median / base.training_seconds.median - 1
        rows.append([
            str(a.backend), a.strategy, *_net(a, summary), str(a.workers), f"{a.repeats_ok}/{a.repeats}",
            _fmt(a.total_seconds.median), _fmt(a.training_seconds.median),
            "-" if a is base else _fmt(vs_default, "pct"), _fmt(a.samples_per_second.median),
            _fmt(a.test_accuracy.median, "acc"), _fmt(a.test_f1.median, "acc"),
            " / ".join(f"{r:.3f}" for r in a.recall_per_class) or "n/a",
            "n/a" if a.comm_bytes_per_step is None else f"{a.comm_bytes_per_step / 2**20:.3f}",
            " / ".join(f"{a.phases.get(p, 0.0):.2f}" for p in ("data", "compute", "communication"))
            if a.phases else "n/a",
        ])
    return rows


# the strategies table as three narrow ones: time; communication; quality
STRATEGY_COMMUNICATION = ("comm MB/step", "phases: data / compute / communication s")
STRATEGY_QUALITY = ("test accuracy (median)", "test macro-F1 (median)", "test recall per class")
STRATEGY_KEYS = ("backend", "strategy", "network", "workers")


def split_table(header: list[str], rows: list[list[str]], *parts: tuple[str, ...],
                keys: tuple[str, ...] = STRATEGY_KEYS) -> list[str]:
    """One wide table as narrower Markdown ones: each part's columns after the key columns
    (those of ``keys`` present in the header); the columns no part names go to the first."""
    keys = [c for c in header if c in keys]
    named = {c for part in parts for c in part}
    first = [c for c in header if c not in keys and c not in named]
    lines: list[str] = []
    for columns in (first, *parts):
        chosen = keys + [c for c in header if c in columns]
        at = [header.index(c) for c in chosen]
        lines += [_md_table(chosen, [[r[i] for i in at] for r in rows]), ""]
    return lines


def splits_model(config: BenchmarkConfig, strategy: str) -> bool:
    """A strategy that split the model's layers over the ranks (pipeline parallelism)."""
    chosen = next((s for s in config.matrix.strategies if s.name == strategy), None)
    if chosen is None:  # not in this config (an older run's): judge by its name
        return any(part.startswith("pipeline-") for part in strategy.split("+"))
    return chosen.pipeline_microbatches > 0


def model_split_lines(summary: RunSummary, config: BenchmarkConfig) -> list[str]:
    """Which cells split the model (pipeline parallelism), one line; none: nothing."""
    cells = sorted({(str(a.backend), a.strategy, a.workers) for a in summary.aggregates
                    if splits_model(config, a.strategy)})
    if not cells:
        return []
    return ["", "Split the model (pipeline parallelism, `pipeline-<microbatches>`: one stage of the layers per "
            "worker, GPipe over that many microbatches a batch; comm MB/step = the activations and their "
            "gradients every stage sent another, no gradient all-reduced): "
            + ", ".join(f"{_text(b)} {_text(s)} at {n} workers" for b, s, n in cells) + "; every other cell "
            "holds the whole model on every rank."]


def async_lines(summary: RunSummary) -> list[str]:
    """The asynchronous cells' staleness, one line; none: nothing."""
    cells = [a for a in summary.aggregates if a.staleness_mean is not None]
    if not cells:
        return []
    return ["", "Asynchronous (`async`, `async-<bound>`: every worker pushes its gradient to a parameter server "
            "in rank 0's process and pulls its weights, no barrier; staleness = server updates between the "
            "weights a gradient was computed on and those it was applied to; a gradient staler than the bound "
            "is dropped; comm MB/step = gradients up and weights down per server update): "
            + "; ".join(f"{_text(a.backend)} {_text(a.strategy)} at {a.workers} workers, {_text(a.network)}: "
                        f"mean {a.staleness_mean:.2f}, max {a.staleness_max}, {a.dropped_fraction:.0%} dropped"
                        for a in cells) + "."]


def _strategy_lines(summary: RunSummary, config: BenchmarkConfig) -> list[str]:
    lines = split_table(with_network(STRATEGY_COLUMNS, summary), strategy_rows(summary),
                        STRATEGY_COMMUNICATION, STRATEGY_QUALITY)
    lines.append("Each strategy is a cell of its own (pipelines.config.TrainingStrategy): `fp16`/`bf16`/"
                 "`powersgd-r<k>` are DistributedDataParallel gradient-compression hooks, `localsgd-<n>` averages the parameters "
                 "every n steps instead of all-reducing gradients, `fsdp` shards parameters, gradients and "
                 "optimizer state (FSDP2), `weighted_sampler`/`weighted_loss` counter class imbalance. Test "
                 "recall per class is label 0 / 1 / ...; the imbalance strategies should raise the minority "
                 "class's. comm MB/step: payload each rank hands to gradient/parameter collectives per "
                 "optimizer step (compressed sizes for the hooks; n/a for one worker and FSDP). Phases: the "
                 "training phase split as in 'Where the time goes' (FSDP's collectives are not hooks: its "
                 "communication counts as compute).")
    skipped = config.not_applicable_cells()
    if skipped:
        lines += ["", "Not applicable (no cell): " + ", ".join(f"{_text(s)} at {n} worker"
                                                               for s, n in skipped)
                  + ": one worker has no one to communicate with."]
    lines += model_split_lines(summary, config)
    lines += async_lines(summary)
    if config.data.class_ratio is not None:
        lines += ["", f"Train sample imbalanced on purpose: class_ratio={_text(config.data.class_ratio)} "
                  "(every label other than 0 has that fraction of label 0's rows); test stays stratified."]
    return lines


# --- where the time goes ------------------------------------------------------------------------

PHASE_ORDER = (phases.PROVISION, *phases.PHASES, phases.RETRIES)


def phase_order(summary: RunSummary) -> tuple[str, ...]:
    """The phase columns of a run: ``provision`` only where a cell brought up its own cluster."""
    has_provision = any(phases.PROVISION in a.phases for a in summary.aggregates)
    return tuple(p for p in PHASE_ORDER if p != phases.PROVISION or has_provision)


def phase_rows(summary: RunSummary) -> list[list[str]]:
    """Per (backend, workers): each phase's median seconds and its share of the total."""
    rows = []
    for a in summary.aggregates:
        if not a.phases:
            continue
        total = sum(a.phases.values())
        rows.append([a.key, _fmt(a.total_seconds.median, "s")] + [
            f"{a.phases[p]:.2f} ({a.phases[p] / total * 100:.0f} %)" if p in a.phases and total else "-"
            for p in phase_order(summary)])
    return rows


def _phase_lines(summary: RunSummary) -> list[str]:
    rows = phase_rows(summary)
    if not rows:
        return ["No finished cell recorded phases."]
    return [_md_table(["cell", "total", *phase_order(summary)], rows), "",
            "Phases (seconds, median over repeats; share of their sum): provision (where shown) = the "
            "platform's per-job cluster coming up inside the cell; launch = adapter entry to the first "
            "training step (processes, JVM/executors, platform start-up, data and model loading); data = "
            "waiting for batches; communication = a gradient all-reduce in flight (DistributedDataParallel comm-hook timer; overlap "
            "with the backward pass counts here) + epoch metrics' all-reduce; compute = the rest of the "
            "training steps; checkpoint = per-epoch checkpoints + model export; evaluation = per-epoch "
            "held-out + final test; teardown = result written to the attempt's end (process exit, session / "
            "cluster stop); retries = earlier failed attempts. Definitions: `pipelines/training/phases.py`."]
