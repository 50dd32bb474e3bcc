"""Stragglers: one host slow for a whole cell (``matrix.fault = "slow_host"`` / ``"slow_link"``).

A synchronous platform waits for its slowest rank at every collective; this measures what one slow
host costs each platform and strategy. The victim is the cell's LAST host (``fault_victim=worker``,
the default) or its first (``coordinator``: the platform's, ``Platform.coordinator_note``), slowed
from before the launch to after it, in every attempt (``matrix.fault_epoch`` plays no part: the
whole cell is slow), and restored right after, so the next cell finds a healthy cluster:

- ``slow_host``: the host's CPU cut to ``matrix.slow_fraction`` of its cores with the cgroup v1
  ``cpu`` controller's CFS quota (``EmulatedHost.limit_cpu``: quota = fraction x period x cores),
  over everything on it (ranks, launcher agents, platform daemons); restored: no quota;
- ``slow_link``: the host's link (both ends) re-shaped to ``slow_fraction`` of the cell's network
  rate (``EmulatedHost.shape_link``); restored: the cell's network. An ``unshaped`` network has no
  rate to cut: it counts as ``UNSHAPED_BASE`` (10 Gbit/s; a veth pair moved ~13 Gbit/s here), so
  the slow link is ``slow_fraction`` x 10 Gbit/s, and the record says the base was assumed.

``<cell>/straggler.json`` records what was done; ``record`` puts it in ``CellResult.straggler``.
The per-rank step times that show who waited for whom are every rank's own
(``CellResult.rank_steps``, ``pipelines.training.record.TrainingRecord.rank_steps``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

from pipelines.cluster.leftovers import CONTROLLERS
from pipelines.config.links import MIN_RATE, NetworkSpec
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import CellPaths

log = logging.getLogger(__name__)
KINDS = ("slow_host", "slow_link")
UNSHAPED_BASE = NetworkSpec("10gbit", 10 * 10**9)


def straggler_file(cell: CellPaths):
    return cell.root / "straggler.json"


def victim(config, hosts: list):
    """The host slowed: the last (``fault_victim=worker``) or the first (``coordinator``)."""
    return hosts[0] if config.matrix.fault_victim == "coordinator" else hosts[-1]


def throttled_seconds(host) -> float | None:
    """How long the CFS quota has held ``host`` back so far (its cpu cgroup's ``cpu.stat``)."""
    try:
        stat = (host.cgroups[CONTROLLERS.index("cpu")] / "cpu.stat").read_text().split()
        return int(stat[stat.index("throttled_time") + 1]) / 1e9
    except (OSError, ValueError, AttributeError, IndexError):
        return None


def slow_rate(network: NetworkSpec, fraction: float) -> tuple[NetworkSpec, NetworkSpec]:
    """(the base the fraction applies to, the slow link): ``unshaped`` counts as ``UNSHAPED_BASE``."""
    base = network if network.bits_per_second is not None else UNSHAPED_BASE
    bits = round(base.bits_per_second * fraction)
    if bits < MIN_RATE:
        raise ValueError(f"matrix.slow_fraction (flat name: slow_fraction): {fraction} of {base.text} is "
                         f"{bits / 10**6:g} Mbit/s, below the 1 Mbit/s that tc tbf shapes reliably: use a "
                         f"fraction of at least {MIN_RATE / base.bits_per_second:g}")
    return base, NetworkSpec(f"{bits / 10**6:g}mbit", bits)


def _cell_network(hosts) -> NetworkSpec:
    """The network the cell's links are shaped to (``ClusterHosts``: its own, else the cluster's)."""
    cluster = getattr(hosts, "cluster", None)
    return NetworkSpec.parse(getattr(hosts, "network", None) or cluster.network)


@contextlib.contextmanager
def inject(config, cell: CellPaths, hosts: list | None, platform: str) -> Iterator[dict | None]:
    """Around a launch across ``hosts``: the victim slow while the block runs, healthy after."""
    kind = config.matrix.fault
    straggler_file(cell).unlink(missing_ok=True)  # never a previous attempt's or run's record
    if kind not in KINDS:
        yield None
        return
    if not hosts or len(hosts) < 2 or getattr(hosts, "cluster", None) is None:
        log.warning("fault=%s: %s runs on %s: no emulated host to slow, nothing injected", kind, cell.name,
                    f"one host ({hosts[0].name})" if hosts else "this machine")
        yield None
        return
    host, fraction = victim(config, hosts), config.matrix.slow_fraction
    record = {"kind": kind, "host": host.name, "fraction": fraction, "platform": platform}
    if kind == "slow_host":
        throttled_before = throttled_seconds(host)
        record["cpu_quota_us"] = host.limit_cpu(fraction)

        def restore() -> None:
            throttled = throttled_seconds(host)
            host.limit_cpu(None)
            if throttled is not None and throttled_before is not None:  # the quota did bite, this long
                atomic_write_json(straggler_file(cell), {**record, "throttled_seconds": throttled - throttled_before})
    else:
        network = _cell_network(hosts)
        base, slow = slow_rate(network, fraction)
        host.shape_link(slow)
        record.update(network=network.text, base=base.text, base_assumed=network.bits_per_second is None,
                      rate_bits_per_second=slow.bits_per_second)
        restore = lambda: host.shape_link(network)  # noqa: E731
    log.warning("fault %s: %s at %.0f %% (%s) for the whole of %s", kind, host.name, fraction * 100,
                {k: v for k, v in record.items() if k not in ("kind", "host", "fraction", "platform")}, cell.name)
    atomic_write_json(straggler_file(cell), record)
    try:
        yield record
    except BaseException:
        try:
            restore()
        except Exception as err:  # the cell's own error is the one to raise
            log.error("fault %s: restoring %s failed: %s", kind, host.name, err)
        raise
    restore()


def record(cell: CellPaths) -> dict | None:
    """``CellResult.straggler``: what ``inject`` did to the cell, or None."""
    try:
        return json.loads(straggler_file(cell).read_text())
    except (FileNotFoundError, ValueError):
        return None
