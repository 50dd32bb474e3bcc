"""What ran beside a timed cell: the run's own processes outside the cell, and the host's CPU
that processes outside the cell used during its window (``ResourceUsage.outside``).

A cell is timed alone: nothing of the run (the data stage's JVM, another platform's cluster)
should be alive beside it, and the host's other load should stay small. The sampler
(``pipelines.measure.resources``) records both; the report flags a cell whose outside share is
over ``OUTSIDE_SHARE_BOUND``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.cluster.netns import holder_folder

# the share of the host's CPU capacity that processes outside the cell may use during its window
# before the report flags the cell: 10 % of the cores (a quiet machine stays well under 2 %)
OUTSIDE_SHARE_BOUND = 0.10
_TICK = os.sysconf("SC_CLK_TCK")


def host_busy_seconds() -> float | None:
    """CPU seconds the whole machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _TICK


def outside_figures(busy_before: float | None, busy_after: float | None, cell_cpu: float | None,
                    wall: float, cpus: int) -> dict:
    """Host CPU seconds outside the cell during the window, and their share of the host's capacity."""
    if busy_before is None or busy_after is None or cell_cpu is None or wall <= 0:
        return {"outside_cpu_seconds": None, "outside_cpu_share": None}
    outside = max(0.0, busy_after - busy_before - cell_cpu)
    return {"outside_cpu_seconds": round(outside, 3), "outside_cpu_share": round(outside / (wall * cpus), 4)}


# the emulated hosts themselves: their keeper holds the namespaces and cgroups, idle (the machine
# the cells run on, not a process beside them); the holder of the run's network namespace, idle;
# Python's multiprocessing helpers, which outlive the pool that started them and sleep on a pipe
INFRASTRUCTURE = ("pipelines.cluster.keeper", "multiprocessing.resource_tracker", "multiprocessing.forkserver")


def is_infrastructure(pid: int) -> bool:
    if holder_folder(pid) is not None:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return any(marker in cmdline for marker in INFRASTRUCTURE)


def run_processes_outside(before: dict[int, tuple[int, str]], table: dict[int, tuple]) -> dict[str, int]:
    """Kind -> count of the run's processes that ran before the cell (under its driver, not the
    cell's) and are still alive: ``before`` is pid -> (start ticks, kind) taken at the first sample."""
    out: dict[str, int] = {}
    for pid, (start, kind) in before.items():
        if pid in table and table[pid][3] == start:  # the same process (a reused pid starts later)
            out[kind] = out.get(kind, 0) + 1
    return out
