"""Network namespaces and cgroups named for the process that owns them, and the sweep that removes
what a dead owner left.

An emulated cluster's namespaces and cgroups (``pipelines.cluster.emulated``) outlive a process
that dies without stopping them (SIGKILL, a crash). So their names carry the owner's PID and its
start time (``bmc<pid>s<start>-``, the start in clock ticks after boot, /proc/<pid>/stat field
22), and :func:`sweep` (run by every cluster's ``start()``) removes what a dead owner left behind
and never touches a live owner's, also when the owner's PID was reused by another process since
(by hand: ``python -c "from pipelines.cluster import sweep; print(sweep())"``). It only ever looks
at names of that form. ``process_start`` is the same proof for a recorded process
(``pipelines.cluster.owned``, ``pipelines.cluster.netns``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from pipelines.cluster.processes import stop_tree

CGROUP_ROOT = Path("/sys/fs/cgroup")
# the cgroup v1 controllers an emulated host has a cgroup in (and the sweep looks in): cpuset its core,
# memory its limit, cpuacct its CPU time (pipelines.measure.resources), cpu its CFS quota
# (EmulatedHost.limit_cpu, a straggler); mounted as "cpu,cpuacct" the last two are one directory
CONTROLLERS = ("cpuset", "memory", "cpuacct", "cpu")
OWNER_PATTERN = r"^bmc(\d+)s(\d+)-"  # the owner's PID and its start (clock ticks after boot)


def _cmd(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def owner_pid(name: str, pattern: str = OWNER_PATTERN) -> int | None:
    match = re.match(pattern, name)
    return int(match.group(1)) if match else None


def process_start(pid: int) -> int | None:
    """A process's start in clock ticks after boot (/proc/<pid>/stat field 22); None if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_prefix(pid: int | None = None) -> str:
    """``bmc<pid>s<start>``: names a live process for good (a reused PID has another start)."""
    pid = os.getpid() if pid is None else pid
    return f"bmc{pid}s{process_start(pid)}"


def _owner_is_dead(name: str, pattern: str) -> bool:
    """The owner a name carries is gone: its PID is free, or now names a process started later."""
    match = re.match(pattern, name)
    if not match:
        return False  # not a name of ours: never touched
    pid, start = int(match.group(1)), (int(match.group(2)) if match.lastindex and match.lastindex > 1 else None)
    now = process_start(pid)
    return now is None or (start is not None and now != start)


def list_netns() -> list[str]:
    if shutil.which("ip") is None:  # no iproute2 (e.g. a container): no namespace of ours can exist
        return []
    out = _cmd(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def find_cgroups(pattern: str = OWNER_PATTERN, max_depth: int = 4) -> list[Path]:
    """Cgroup directories (cpuset and memory, any depth up to max_depth) whose name matches."""
    found: list[Path] = []
    for controller in CONTROLLERS:
        top = CGROUP_ROOT / controller
        for dirpath, dirnames, _ in os.walk(top):
            depth = len(Path(dirpath).relative_to(top).parts)
            matched = [d for d in dirnames if re.match(pattern, d)]
            found.extend(Path(dirpath) / d for d in matched)
            dirnames[:] = [] if depth >= max_depth else [d for d in dirnames if d not in matched]
    return found


def _cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (FileNotFoundError, ValueError):
        return []


def _netns_pids(netns: str) -> list[int]:
    out = _cmd(["ip", "netns", "pids", netns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_pids(pids: list[int], grace_s: float = 3.0) -> None:
    """SIGTERM, wait up to grace_s, then SIGKILL whatever is left (never this process)."""
    stop_tree(set(pids) - {os.getpid()}, grace_s, kill_wait_s=grace_s, tree=False)


def remove_netns_and_cgroups(netns: list[str], cgroups: list[Path]) -> None:
    """Kill every process in the namespaces and cgroups, then delete them (missing ones are fine)."""
    pids = [p for ns in netns for p in _netns_pids(ns)] + [p for cg in cgroups for p in _cgroup_pids(cg)]
    kill_pids(pids)
    for ns in netns:
        _cmd(["ip", "netns", "del", ns], check=False)
    for cgroup in cgroups:
        for _ in range(50):  # rmdir fails (EBUSY) while an exiting task is still charged
            try:
                cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                kill_pids(_cgroup_pids(cgroup), grace_s=0.1)
                time.sleep(0.1)


def sweep(prefix_pattern: str = OWNER_PATTERN) -> list[str]:
    """Remove namespaces and cgroups whose owner (PID and start, ``OWNER_PATTERN``) is gone; return their names."""
    dead_ns = [ns for ns in list_netns() if _owner_is_dead(ns, prefix_pattern)]
    dead_cg = [cg for cg in find_cgroups(prefix_pattern) if _owner_is_dead(cg.name, prefix_pattern)]
    remove_netns_and_cgroups(dead_ns, dead_cg)
    return dead_ns + [str(cg) for cg in dead_cg]
