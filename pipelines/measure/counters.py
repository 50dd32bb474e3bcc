"""Counters the resource sampler reads at a cell's start and end (``pipelines.measure.resources``):
an emulated host's cgroups (cpuacct, memory peak, cpuset) and link, and this machine's GPUs."""

from __future__ import annotations

import subprocess
from pathlib import Path

_GPU_QUERY = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]


def cgroup_file(host, name: str) -> Path | None:
    """The file ``name`` of one of the host's cgroups; None if it has none (an SSH host)."""
    return next((Path(c, name) for c in getattr(host, "cgroups", None) or () if Path(c, name).exists()), None)


def read_int(path: Path | None) -> int | None:
    try:
        return int(path.read_text().split()[0]) if path else None
    except (OSError, ValueError, IndexError):
        return None


def host_marks(host, first: bool, notes: list[str]) -> dict:
    """A host's counters now: cpuacct.usage (ns), its memory cgroup's peak (bytes; reset to 0 by the
    first call), its cpuset's size and its link's tx/rx; None where unreadable (an SSH host)."""
    from pipelines.cluster.emulated import parse_cpu_list

    peak, cpuset = cgroup_file(host, "memory.max_usage_in_bytes"), cgroup_file(host, "cpuset.cpus")
    try:
        if first and peak is not None:
            peak.write_text("0")  # the peak from now on (an SSH host has no cgroups)
    except OSError as err:
        notes.append(f"{host.name}: memory peak not reset: {err}")
    out = {"cpu_ns": read_int(cgroup_file(host, "cpuacct.usage")), "peak": read_int(peak), "tx": None,
           "rx": None, "cpus": len(parse_cpu_list(cpuset.read_text())) if cpuset else None}
    try:
        out["tx"], out["rx"] = host.link_bytes()
    except Exception as err:
        notes.append(f"{host.name}: link counters unreadable: {type(err).__name__}: {err}")
    return out


def gpu_sample() -> list[list[float]]:
    """[utilisation %, memory used MB] of each of this machine's GPUs (nvidia-smi); [] if none."""
    try:
        out = subprocess.run(_GPU_QUERY, capture_output=True, text=True, timeout=5, check=True).stdout
        return [[float(x) for x in line.split(",")] for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


def oom_kills(host) -> int | None:
    """Processes the kernel killed for the host's memory limit so far (``oom_kill`` of its memory
    cgroup's ``memory.oom_control``); None where unreadable (an SSH host, an old kernel)."""
    control = cgroup_file(host, "memory.oom_control")
    try:
        lines = control.read_text().splitlines() if control else []
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith("oom_kill ")), None)


class MemoryLimitKill(RuntimeError):
    """A cell's process was killed by its host's memory limit (``cluster.memory_mb_per_host``)."""


def memory_limit_kill(config, hosts, before: dict[str, int | None]) -> MemoryLimitKill | None:
    """The error to report when a host's memory limit killed processes since ``before`` (host name ->
    ``oom_kills`` at the attempt's start), else None."""
    killed = {h.name: now - before[h.name] for h in hosts or ()
              if before.get(h.name) is not None and (now := oom_kills(h)) is not None and now > before[h.name]}
    if not killed:
        return None
    where = ", ".join(f"{name}: {n} process(es)" for name, n in killed.items())
    return MemoryLimitKill(
        f"killed by the host's memory limit (cluster.memory_mb_per_host={config.cluster.memory_mb_per_host} MB; "
        f"the kernel's OOM killer in the host's memory cgroup: {where}): raise cluster.memory_mb_per_host or "
        f"lower training.batch_size / data.max_seq_len")
