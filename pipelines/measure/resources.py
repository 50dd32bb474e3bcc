"""What a cell's processes use while it trains: CPU, memory, bytes, GPU (``<cell>/resources.json``).

``TrainingBackend.run`` wraps the launch in ``sample(cell, hosts, daemons)``; ``usage()`` is the cell's
``ResourceUsage`` (``pipelines.runfolder.results`` says what each figure is). The cell's processes: this one
(the driver) and those started under it during the cell, ``daemons`` and theirs, and all in an
emulated host's cgroups (cpuacct, memory: they measure the host; /proc splits it). Ranks wrote
``<cell>/ranks/rank-<k>.pid`` (``process_kinds.write_rank_pid``, from the shared loop); the rest is the
platform's, by ``process_kinds.process_kind``. One pass over /proc every ``interval_s`` (a process's CPU after its last sample
is not counted locally; the hosts' cgroups count all); what ran beside the cell: ``outside``. It
never fails a cell (what it cannot measure is logged and noted)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.measure.counters import cgroup_file as _cgroup
from pipelines.measure.counters import gpu_sample as _gpu_sample
from pipelines.measure.counters import host_marks as _host_marks
from pipelines.measure.listeners import listening
from pipelines.measure.outside import host_busy_seconds, is_infrastructure, outside_figures, run_processes_outside
from pipelines.measure.process_kinds import RANKS_DIR, _kind_of, _netns, _ns_bytes, _Proc, _proc_table, rank_pids
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import CellPaths
from pipelines.runfolder.results import HostUsage, ResourceUsage

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5
LISTENERS_EVERY = 4  # samples between two reads of the listening sockets (a JVM has hundreds of fds)
RESOURCES_FILE = "resources.json"
DRIVER = "driver"  # the process running TrainingBackend.run: its kind and its per_host key
MB = 1024 * 1024


def read_timeline(cell_dir) -> list[dict]:
    """The samples of resources.json (``t``: s since ``ResourceUsage.started``; CPU %: 100 = one core)."""
    try:
        return json.loads((Path(cell_dir) / RESOURCES_FILE).read_text()).get("timeline", [])
    except (OSError, ValueError, AttributeError):
        return []


@dataclass
class _Scope:
    """CPU sums and memory peaks of one part of the cell (all of it, the driver, one host)."""

    cpu: dict = field(default_factory=lambda: defaultdict(float))  # seconds: ranks, platform, kind:<k>
    peak: dict = field(default_factory=lambda: defaultdict(float))  # bytes: ranks, platform, total, kind:<k>

    def add(self, now: dict) -> None:
        now["total"] = now["ranks"] + now["platform"]
        for key, value in now.items():
            self.peak[key] = max(self.peak[key], value)

    def part(self, cpu: float | None, cpus: int | None, wall: float, seen: bool = True) -> dict:
        """The figures ResourceUsage and HostUsage share."""
        ranks = self.cpu["ranks"]
        return {"cpus": cpus, "cpu_seconds": cpu,
                "cpu_utilisation": cpu / (wall * cpus) if cpu is not None and cpus else None,
                "ranks_cpu_seconds": ranks if seen else None,
                "ranks_peak_rss_mb": _mb(self.peak["ranks"]) if seen else None,
                "platform_cpu_seconds": max(0.0, cpu - ranks) if cpu is not None else None,
                "platform_peak_rss_mb": _mb(self.peak["platform"]) if seen else None,
                "platform_processes": _kinds(self.peak, _mb)}


def _kinds(values: dict, fmt) -> dict[str, float]:
    """The ``kind:<k>`` entries of a scope, largest first."""
    kinds = {k.split(":", 1)[1]: fmt(v) for k, v in values.items() if k.startswith("kind:")}
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))



def _mb(value: float) -> float:
    return round(value / MB, 2)


class Sampler:
    """Samples the cell's processes on a thread between ``start`` and ``stop``; ``usage()`` after."""

    def __init__(self, cell_dir, hosts=None, daemons=(), interval_s: float = DEFAULT_INTERVAL_S):
        self.cell_dir, self.interval_s = Path(cell_dir), float(interval_s)
        self.hosts, self.daemons = list(hosts or []), [int(p) for p in daemons]
        self.me, self.started, self.ended, self.notes = os.getpid(), time.time(), time.time(), []
        self._procs: dict[int, _Proc] = {}
        self._before: set[int] = set()  # processes under this one before the cell: not the cell's
        self._samples, self._marks = [], []  # the samples; host -> _host_marks at the start, at the end
        self._ns: dict[str, list] = {}  # the cell's network namespace -> [a pid in it, tx, rx, tx, rx at the start]
        self._own_ns, self._gpu = _netns(self.me), shutil.which("nvidia-smi") is not None
        self._stop, self._thread, self._failures = threading.Event(), None, 0
        self._sampler_cpu, self._usage, self._gpus = 0.0, None, 0
        self._busy: list[float | None] = []  # the machine's busy CPU seconds at the start and the end
        self._before_kinds, self._outside = {}, {}  # the run's processes before the cell; kinds left

    def start(self) -> Sampler:
        try:
            shutil.rmtree(self.cell_dir / RANKS_DIR, ignore_errors=True)  # an earlier attempt's ranks
            self._marks.append({h.name: _host_marks(h, True, self.notes) for h in self.hosts})
            self.started = time.time()
            self._busy.append(host_busy_seconds())
            self._safe_sample()
            self._thread = threading.Thread(target=self._run, name="resources-sampler", daemon=True)
            self._thread.start()
        except Exception as err:
            self.notes.append(f"the sampler did not start: {type(err).__name__}: {err}")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            self._safe_sample()
            self._busy.append(host_busy_seconds())
            self._outside = run_processes_outside(self._before_kinds, _proc_table())
            self.ended = time.time()
            self._marks.append({h.name: _host_marks(h, False, self.notes) for h in self.hosts})
            self._usage, rows = self._compute()
            atomic_write_json(self.cell_dir / RESOURCES_FILE, {"usage": self._usage.model_dump(),
                                                                "timeline": rows})
        except Exception as err:
            log.warning("resources of %s not measured: %s: %s", self.cell_dir.name, type(err).__name__, err)
            self._usage = None

    def usage(self) -> ResourceUsage | None:  # once stopped; None if nothing could be measured
        return self._usage

    def _run(self) -> None:
        began = time.thread_time()
        while not self._stop.wait(self.interval_s):
            self._safe_sample()
        self._sampler_cpu = time.thread_time() - began

    def _safe_sample(self) -> None:
        try:
            self._sample()
        except Exception as err:  # never fails the cell: logged once, tried again next interval
            self._failures += 1
            if self._failures == 1:
                log.warning("resources: a sample of %s failed: %r", self.cell_dir.name, err)

    def _members(self, table: dict[int, tuple]) -> dict[int, str]:
        """pid -> where, of the cell's processes now."""
        children: dict[int, list[int]] = defaultdict(list)
        for pid, info in table.items():
            children[info[0]].append(pid)
        out: dict[int, bool] = {}  # pid -> started under this process (not under a daemon)
        for roots, ours in ((self.daemons, False), ([self.me], True)):
            stack = [p for p in roots if p in table]
            while stack:
                pid = stack.pop()
                if pid not in out:
                    out[pid] = ours
                    stack.extend(children.get(pid, ()))
        hosted = {}
        for h in self.hosts:
            procs = _cgroup(h, "cgroup.procs")
            hosted.update((int(p), h.name) for p in (procs.read_text().split() if procs else ()))
        if not self._samples:  # the first pass: what already ran under this process is not the cell's
            self._before = {p for p, ours in out.items() if ours and p != self.me}
            # beside the cell: neither its hosts' processes (the cell's) nor the hosts' keeper
            self._before_kinds = {p: (table[p][3], _kind_of(p, table[p][1])) for p in self._before
                                  if p not in hosted and not is_infrastructure(p)}
        where = {p: DRIVER for p in out if p not in self._before}
        where.update(hosted)
        return {p: w for p, w in where.items() if p in table}

    def _sample(self) -> None:
        table = _proc_table()
        first, entries = not self._samples, {}
        for pid, where in self._members(table).items():
            (_, name, cpu, start, rss), proc = table[pid], self._procs.get(pid)
            if proc is None or proc.ctime != start:  # new: from 0 (on the first pass: from now)
                kind = DRIVER if pid == self.me else _kind_of(pid, name)
                self._procs[pid] = proc = _Proc(start, where, name, kind, cpu if first else 0.0, before=first)
                ns = _netns(pid) if where == DRIVER and not self.hosts else None
                if ns and ns != self._own_ns:
                    # one that was there before the cell (the run's, with its standing cluster) counts
                    # from now; one made during the cell from its start
                    base = _ns_bytes(pid) if first and ns not in self._ns else (0, 0)
                    self._ns.setdefault(ns, [pid, *base, *base])[0] = pid
            elif proc.name != name and pid != self.me:  # it exec'd (sh -> torchrun): what it is now
                proc.name, proc.kind = name, _kind_of(pid, name)
            entries[pid] = (max(0.0, cpu - proc.cpu), rss)
            proc.cpu = max(proc.cpu, cpu)
        for ns in self._ns.values():  # the cell's network namespaces: the largest seen (they grow)
            tx, rx = _ns_bytes(ns[0])
            ns[1], ns[2] = max(ns[1], tx), max(ns[2], rx)
        if first or self._stop.is_set() or len(self._samples) % LISTENERS_EVERY == 0:
            for pid, ports in listening(p for p in entries if p != self.me).items():
                self._procs[pid].listens |= ports
        gpus = _gpu_sample() if self._gpu else []
        self._gpus = max(self._gpus, len(gpus))
        self._samples.append({"t": time.time() - self.started, "pids": entries, "gpu": gpus and {
            "gpu_utilisation": sum(g[0] for g in gpus) / len(gpus), "gpu_memory_mb": sum(g[1] for g in gpus)}
        })

    def _accumulate(self, ranks: set[int]) -> tuple[dict[str, _Scope], list[dict]]:
        """Per scope ("cell", DRIVER, each host) the CPU sums and memory peaks; the timeline."""
        scopes: dict[str, _Scope] = defaultdict(_Scope)
        timeline, prev_t = [], None
        for s in self._samples:
            dt = s["t"] - prev_t if prev_t is not None else 0.0
            now: dict[str, dict] = defaultdict(lambda: defaultdict(float))  # scope -> key -> RSS bytes
            cpu = {"ranks": 0.0, "platform": 0.0}  # the cell's CPU seconds in this interval
            for pid, (dcpu, rss) in s["pids"].items():
                proc, side = self._procs[pid], "ranks" if pid in ranks else "platform"
                cpu[side] += dcpu
                for scope in ("cell", proc.where):
                    for key in (side, f"kind:{proc.kind}") if side == "platform" else (side,):
                        scopes[scope].cpu[key] += dcpu
                        now[scope][key] += rss
            for scope, values in now.items():
                scopes[scope].add(values)
            rates = {f"{k}_cpu_percent": round(100 * v / dt, 1) if dt else 0.0 for k, v in cpu.items()}
            timeline.append({"t": round(s["t"], 3), "ranks_rss_mb": _mb(now["cell"]["ranks"]),
                             "platform_rss_mb": _mb(now["cell"]["platform"]), **(s["gpu"] or {}), **rates})
            prev_t = s["t"]
        return scopes, timeline

    def _per_host(self, scopes: dict[str, _Scope], wall: float) -> dict[str, HostUsage]:
        """Across hosts: each host's usage (its cgroups, split by /proc) and the driver's (/proc)."""
        per_host, drv, (start, end) = {}, scopes[DRIVER], self._marks
        for h in self.hosts:
            s, e = start[h.name], end[h.name]
            seen, d = s["peak"] is not None, {k: None if None in (s[k], e[k]) else e[k] - s[k] for k in s}
            cpu = None if d["cpu_ns"] is None else d["cpu_ns"] / 1e9
            per_host[h.name] = HostUsage(
                **scopes[h.name].part(cpu, s["cpus"], wall, seen),
                source="cgroup" if seen else "none", peak_memory_mb=_mb(e["peak"]) if seen else None,
                bytes_sent=d["tx"], bytes_received=d["rx"],
                note=None if seen else "no cgroups there (an SSH host): CPU and memory not measured")
        drv_cpu = max(0.0, drv.cpu["ranks"] + drv.cpu["platform"] - self._sampler_cpu)
        per_host[DRIVER] = HostUsage(**drv.part(drv_cpu, None, wall), source="proc",
                                     peak_memory_mb=_mb(drv.peak["total"]))
        return per_host

    def _compute(self) -> tuple[ResourceUsage, list[dict]]:
        ranks = rank_pids(self.cell_dir) & set(self._procs)
        scopes, timeline = self._accumulate(ranks)
        wall, cell, per_host = max(self.ended - self.started, 1e-6), scopes["cell"], {}
        if self.hosts:  # the hosts' cgroups (the sum of each host's peak) and the driver's processes
            per_host = self._per_host(scopes, wall)
            hosts, parts = [per_host[h.name] for h in self.hosts], per_host.values()
            cpu, peak = (sum(getattr(u, k) or 0.0 for u in parts) for k in ("cpu_seconds", "peak_memory_mb"))
            cpus = sum(u.cpus or 0 for u in hosts) or None
            moved = [(u.bytes_sent, u.bytes_received) for u in hosts if u.bytes_sent is not None]
        else:
            cpu = max(0.0, cell.cpu["ranks"] + cell.cpu["platform"] - self._sampler_cpu)
            cpus, peak = len(os.sched_getaffinity(0)), _mb(cell.peak["total"])
            moved = [(n[1] - n[3], n[2] - n[4]) for n in self._ns.values()]
            if not moved:
                self.notes.append("bytes: the cell shares this machine's network namespace: not its own")
        gpu = [(r["gpu_utilisation"], r["gpu_memory_mb"]) for r in timeline if "gpu_utilisation" in r]
        return ResourceUsage(
            **cell.part(cpu, cpus, wall), source="hosts" if self.hosts else "process tree",
            started=self.started,
            wall_seconds=wall, interval_s=self.interval_s, samples=len(self._samples), peak_rss_mb=peak,
            ranks=len(ranks), sampler_cpu_seconds=self._sampler_cpu, per_host=per_host, notes=self.notes,
            bytes_sent=sum(m[0] for m in moved) if moved else None,
            bytes_received=sum(m[1] for m in moved) if moved else None, gpus=self._gpus or None,
            gpu_utilisation_mean=sum(g[0] for g in gpu) / len(gpu) if gpu else None,
            gpu_peak_memory_mb=max((g[1] for g in gpu), default=None), run_processes_outside=self._outside,
            **self._what_ran(ranks),
            **outside_figures(*(self._busy + [None, None])[:2], cpu, wall, os.cpu_count() or 1)), timeline


    def _what_ran(self, ranks: set[int]) -> dict:
        """Processes by kind (ranks as "rank") and the TCP ports they listened on: those started in
        the window (the cell's) apart from those alive before it (a standing cluster's)."""
        out = {"processes_started": defaultdict(int), "processes_standing": defaultdict(int),
               "listening": defaultdict(set), "standing_listening": defaultdict(set)}
        for pid, proc in self._procs.items():
            if pid == self.me:
                continue
            kind, side = "rank" if pid in ranks else proc.kind, "standing" if proc.before else "started"
            out[f"processes_{side}"][kind] += 1
            if proc.listens:
                out["standing_listening" if proc.before else "listening"][kind] |= proc.listens
        return {k: {kind: sorted(v) if isinstance(v, set) else v for kind, v in sorted(d.items())}
                for k, d in out.items()}


@contextmanager
def sample(cell, hosts=None, daemons=(), interval_s: float = DEFAULT_INTERVAL_S) -> Iterator[Sampler]:
    """Sample the cell's processes while the block runs (``cell``: its CellPaths or folder);
    ``sampler.usage()`` after it. The measure itself never raises."""
    sampler = Sampler(cell.root if isinstance(cell, CellPaths) else cell, hosts, daemons, interval_s).start()
    try:
        yield sampler
    finally:
        sampler.stop()
