"""The report's "Network" section: where the cells ran across (emulated) hosts, how each
platform's communication phase and epoch time grow as the link's bandwidth shrinks, the bytes
the links moved per step, and the break-even bandwidth of each communication strategy (fp16,
powersgd-r<k>, localsgd-<n>): the bandwidth below which its epoch time beats the default's.

Only for runs with more than one network or a non-local one (``has_networks``); a local run's
report has no such section. Bandwidths: ``pipelines.cluster.emulated.NetworkSpec``; "unshaped"
is the veth link, ~9 Gbit/s measured (bench/RESULTS.md), placed there on the axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import DEFAULT_STRATEGY
from pipelines.report.tables import _fmt, _md_table, _text, networked, split_table
from pipelines.runfolder.summary import Aggregate, RunSummary

UNSHAPED_BITS_PER_SECOND = 9e9  # an unshaped veth link between two emulated hosts (measured ~9.4 Gbit/s)

NETWORK_COLUMNS = ["backend", "strategy", "workers", "network", "bandwidth", "communication s (median)",
                   "epoch s (median)", "epoch vs fastest network", "link MB/step (all traffic)",
                   "link MB/training step", "comm MB/step (payload)"]
NETWORK_BYTES = ("link MB/step (all traffic)", "link MB/training step", "comm MB/step (payload)")  # 2nd table
BREAK_EVEN_COLUMNS = ["backend", "strategy", "workers", "epoch time vs default per network",
                      "break-even bandwidth"]


def networks_of(summary: RunSummary) -> list[str]:
    """The run's networks: its config's (summary.networks), then any other an aggregate names."""
    return list(dict.fromkeys([*summary.networks, *(a.network for a in summary.aggregates)]))


def has_networks(summary: RunSummary) -> bool:
    """Whether the report gets a Network section: more than one network, or one not on this host."""
    return networked(summary)


def bandwidth(network: str) -> float | None:
    """Bits/s of a network's links: its rate, ~9 Gbit/s unshaped; None where unknown (local, ssh)."""
    from pipelines.config.links import NetworkSpec

    try:
        spec = NetworkSpec.parse(network)
    except ValueError:
        return None  # "local" (loopback) or "ssh" (real machines): not a shaped link
    return float(spec.bits_per_second or UNSHAPED_BITS_PER_SECOND)


def format_bandwidth(bits: float | None, network: str | None = None) -> str:
    """``1 Gbit/s``, ``250 Mbit/s``; the unshaped link: ``~9 Gbit/s (unshaped)``."""
    if bits is None:
        return "n/a"
    if network == "unshaped":
        return f"~{bits / 1e9:.0f} Gbit/s (unshaped)"
    if bits >= 1e9:
        return f"{bits / 1e9:.3g} Gbit/s"
    return f"{bits / 1e6:.3g} Mbit/s"


def _mb(value: float | None, missing: str = "n/a") -> str:
    return missing if value is None else f"{value / 2**20:.3f}"


def _over_networks(summary: RunSummary) -> list[Aggregate]:
    """The multi-worker aggregates (1-worker cells run on one host: no link), grouped by
    (backend, strategy, workers), fastest network first."""
    order = {n: i for i, n in enumerate(networks_of(summary))}
    aggs = [a for a in summary.aggregates if a.workers > 1]
    return sorted(aggs, key=lambda a: (str(a.backend), a.strategy, a.workers,
                                       -(bandwidth(a.network) or 0.0), order.get(a.network, 0)))


def network_rows(summary: RunSummary) -> list[list[str]]:
    """Per (backend, strategy, workers, network): communication phase, epoch time and its ratio
    to the same cell on the fastest network, bytes on the links and handed to collectives per step."""
    rows, fastest = [], {}
    for a in _over_networks(summary):
        group = (a.backend, a.strategy, a.workers)
        if a.epoch_seconds is not None:
            fastest.setdefault(group, a.epoch_seconds)  # the first (fastest network) one that finished
        base = fastest.get(group)
        ratio = None if a.epoch_seconds is None or not base else a.epoch_seconds / base
        rows.append([str(a.backend), a.strategy, str(a.workers), a.network,
                     format_bandwidth(bandwidth(a.network), a.network), _fmt(a.communication_seconds),
                     _fmt(a.epoch_seconds), "n/a" if ratio is None else f"{ratio:.2f}x",
                     _mb(a.link_bytes_per_step), _mb(a.link_bytes_per_train_step, "not measured"),
                     _mb(a.comm_bytes_per_step)])
    return rows


# --- break-even bandwidth ------------------------------------------------------------------------

@dataclass(frozen=True)
class BreakEven:
    """Where a strategy starts to pay off against the default: ``kind`` "between" (an
    interpolated ``bits_per_second``), "always" (faster at every measured network), "never"
    (slower down to the lowest), "mixed" (faster only on faster links) or "unknown" (nothing to compare)."""

    kind: str
    bits_per_second: float | None = None
    text: str = ""


def break_even(points: list[tuple[float, float]], names: dict[float, str] | None = None) -> BreakEven:
    """``points``: (bandwidth in bits/s, strategy's epoch time - default's); ``names``: bandwidth ->
    network name for the text. The bandwidth below which the difference is negative, interpolated
    linearly in log-bandwidth between the two measured networks where its sign changes (scanning up
    from the lowest bandwidth)."""
    pts = sorted(points)  # lowest bandwidth first
    if not pts:
        return BreakEven("unknown", None, "n/a (no network with both cells)")

    def name(bits: float) -> str:
        return (names or {}).get(bits) or format_bandwidth(bits)

    if all(d < 0 for _, d in pts):
        return BreakEven("always", None, "pays off at every measured network")
    if pts[0][1] >= 0:
        if any(d < 0 for _, d in pts):
            faster = ", ".join(name(b) for b, d in pts if d < 0)
            return BreakEven("mixed", None, f"slower at {name(pts[0][0])}; faster only at {faster}")
        return BreakEven("never", None, f"never, down to {name(pts[0][0])}")
    i = next(i for i, (_, d) in enumerate(pts) if d >= 0)  # the first network where it loses
    (b_lo, d_lo), (b_hi, d_hi) = pts[i - 1], pts[i]
    x_lo, x_hi = math.log(b_lo), math.log(b_hi)
    bits = math.exp(x_lo + (0.0 - d_lo) * (x_hi - x_lo) / (d_hi - d_lo))
    text = f"below ~{format_bandwidth(bits)} (between {name(b_lo)} and {name(b_hi)})"
    return BreakEven("between", bits, text)


def _strategy_settings(config: BenchmarkConfig, name: str) -> Any:
    return next((s for s in config.matrix.strategies if s.name == name), None)


def is_comm_strategy(config: BenchmarkConfig, name: str) -> bool:
    """A strategy that changes what goes over the link: a comm hook, local SGD (sync_every > 1), a
    pipeline (activations instead of gradients) or async (gradients and weights to and from a server)."""
    s = _strategy_settings(config, name)
    if s is None:  # not in this config (an older run's): judge by its name
        return name.startswith(("fp16", "bf16", "powersgd", "localsgd", "pipeline", "async"))
    return not s.is_default and (s.comm_hook != "none" or s.sync_every > 1 or s.pipeline_microbatches > 0
                                 or s.asynchronous)


def break_even_rows(summary: RunSummary, config: BenchmarkConfig) -> list[list[str]]:
    """Per (backend, comm strategy, workers): its epoch time vs the default's at each network,
    and the break-even bandwidth."""
    default = {(a.backend, a.network, a.workers): a for a in summary.aggregates
               if a.strategy == DEFAULT_STRATEGY}
    groups: dict[tuple, list[Aggregate]] = {}
    for a in _over_networks(summary):
        if is_comm_strategy(config, a.strategy):
            groups.setdefault((a.backend, a.strategy, a.workers), []).append(a)
    rows = []
    for (backend, strategy, workers), aggs in groups.items():
        points, parts = [], []
        for a in aggs:
            base = default.get((a.backend, a.network, a.workers))
            bits = bandwidth(a.network)
            if base is None or a.epoch_seconds is None or not base.epoch_seconds:
                parts.append(f"{a.network} n/a")
                continue
            parts.append(f"{a.network} {_fmt(a.epoch_seconds / base.epoch_seconds - 1, 'pct')}")
            if bits is not None:
                points.append((bits, a.epoch_seconds - base.epoch_seconds))
        names = {bandwidth(a.network): a.network for a in aggs if bandwidth(a.network) is not None}
        rows.append([str(backend), strategy, str(workers), " / ".join(parts), break_even(points, names).text])
    return rows


def network_lines(summary: RunSummary, config: BenchmarkConfig) -> list[str]:
    """The section's Markdown: the table, the note, the break-even table."""
    nets = networks_of(summary)
    named = [n if bandwidth(n) is None or n == "unshaped" else f"{n} ({format_bandwidth(bandwidth(n))})"
             for n in nets]
    veth = (f" (the unshaped link: the hosts' veths, ~{UNSHAPED_BITS_PER_SECOND / 1e9:.0f} Gbit/s measured)"
            if "unshaped" in nets else "")
    lines = [f"Cluster: {_text(summary.cluster)}; networks: {', '.join(_text(n) for n in named)}{veth}."]
    rows = network_rows(summary)
    if not rows:
        return lines + ["", "No multi-worker cell: nothing went over a link."]
    lines += ["", *split_table(NETWORK_COLUMNS, rows, NETWORK_BYTES),  # _md_table escapes every cell
              "Medians over repeats. Communication = the training's gradient all-reduce phase, all epochs "
              "(see 'Where the time goes'); epoch = one epoch's train + evaluation + checkpoint (median "
              "over epochs); 'vs fastest network' = this epoch time / the same cell's on the fastest network "
              "measured. Link MB/step (all traffic): the bytes every host's link sent during the launch / "
              "optimizer steps trained (gradients, evaluation, rendezvous, any data the platform moved); link "
              "MB/training step: what the links sent during the training steps alone (the ranks read their "
              "host's counters around each epoch's steps; 'not measured' where the platform's training loop does "
              "not read them); comm MB/step: the payload one rank handed to collectives per step. 1-worker cells "
              "run on one host: no link, not shown."]
    even = break_even_rows(summary, config)
    if even:
        lines += ["", "Break-even bandwidth of the communication strategies: the bandwidth below which the "
                  "strategy's epoch time beats the default's (interpolated linearly in log-bandwidth between "
                  "the measured networks where the difference changes sign).", "",
                  _md_table(BREAK_EVEN_COLUMNS, even)]
    return lines
