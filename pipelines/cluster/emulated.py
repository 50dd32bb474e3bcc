"""An emulated cluster on one machine: N "hosts" as network namespaces, shaped links, cgroups.

Why: every benchmark cell ran on one host over loopback, where the network costs nothing. Here each
host is a Linux network namespace ``bmc<pid>-<name>-h<k>`` with its own address on a private /24
(10.213.0.0/24, ``.1`` + k; every cluster has its own isolated switch, so clusters may reuse it), a
cpuset cgroup (one core) and a memory cgroup (optional limit). The hosts' ``eth0`` veths meet on a
Linux bridge that lives in a dedicated switch namespace ``bmc<pid>-<name>-sw``: the root namespace
gets no cluster address, no cluster link and no route, so it cannot reach the hosts and the hosts
cannot reach anything beyond each other (this workplace's network policy).

Shaping is ``tc tbf`` on both ends of every host link (host egress on ``eth0``, host ingress on the
switch-side port's egress): ``burst`` = max(64 KiB, 1 ms at the rate) so a whole GSO/TSO
super-packet (at most 64 KiB) fits in the bucket and fast rates are not capped by timer granularity;
``latency 50ms`` bounds the queue to about rate x 50 ms, so TCP sees drops instead of an unbounded
buffer. This kernel has no ``netem``: bandwidth can be limited, delay can not. Why not Mininet: it
needs Open vSwitch and its ``mnexec`` built from source; ``ip``/``tc`` need only iproute2.

Ownership: the namespaces and cgroups are named for the process that owns the cluster, and every
``start()`` first sweeps what a dead owner left (``pipelines.cluster.leftovers``). Cgroups are made
under the owner's own cgroup of each controller, so a host's processes stay inside whatever
accounting and limits the owner already lives under.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Self

from pipelines.config.links import MAX_RATE, MIN_RATE, NetworkSpec  # noqa: F401 (the cluster's links)
from pipelines.cluster.leftovers import (CGROUP_ROOT, CONTROLLERS, _cgroup_pids, _cmd, _netns_pids, kill_pids,
                                         list_netns, owner_prefix, remove_netns_and_cgroups, sweep)
# still importable from here until pipelines.platforms.ray.standing imports it from leftovers

PROC_CGROUP = Path("/proc/self/cgroup")  # this process's cgroups, one line per hierarchy
SUBNET = "10.213.0"  # /24; only ever configured inside this code's own namespaces
_NAME = re.compile(r"^[a-z0-9_]{1,16}$")
# Runs inside the child before the real program: join the cgroups, then exec (same PID throughout:
# sh execs ip, ip execs the program), so nothing of the program ever runs outside its host.
_JOIN_AND_EXEC = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; '
                  'n=$((n-1)); done; exec "$@"')


def missing_cgroup_controllers(root: Path | None = None, own: Path | None = None) -> list[str]:
    """The cgroup v1 controllers of ``CONTROLLERS`` this machine does not give this process (a
    cgroup-v2-only machine gives none: its one hierarchy is listed as ``0::/...``)."""
    root, own = root or CGROUP_ROOT, own or PROC_CGROUP
    try:
        named = {n for line in own.read_text().splitlines() for n in line.split(":", 2)[1].split(",") if n}
    except OSError:
        named = set()
    return [c for c in CONTROLLERS if c not in named or not (root / c).is_dir()]


def why_unavailable() -> str | None:
    """Why no emulated cluster can be built on this machine (not root, no iproute2, no
    ``ip netns``, no cgroup v1 controllers), or None when one can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, cgroups)"
    missing = missing_cgroup_controllers()
    if missing:
        v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        return (f"the emulated hosts need the cgroup v1 controllers {', '.join(CONTROLLERS)} (a host's cores, memory "
                f"limit and CPU time); this machine lacks {', '.join(missing)}"
                + (" (cgroup v2 only: boot with systemd.unified_cgroup_hierarchy=0, or run on real machines with "
                   "cluster.kind=ssh)" if v2 else ""))
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) not installed: scripts/system_deps.sh"
    probe = f"bmcprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    if made.returncode != 0:
        return f"ip netns does not work here: {made.stderr.strip()}"
    return None


def _own_cgroup(controller: str) -> Path:
    """This process's cgroup directory of a v1 controller (where new host cgroups go)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/")
    return CGROUP_ROOT / controller


def parse_cpu_list(text: str) -> list[int]:
    """``'0-2,5'`` -> ``[0, 1, 2, 5]`` (the kernel's cpu/mem list format)."""
    cpus: list[int] = []
    for part in filter(None, text.strip().split(",")):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


class EmulatedHost:
    """One host of a cluster: its namespace, address, core and cgroups."""

    def __init__(self, cluster: EmulatedCluster, index: int, core: int):
        self.index = index
        self.name = f"h{index}"
        self.netns = f"{cluster.prefix}-{self.name}"
        self.address = f"{SUBNET}.{index + 1}"
        self.core = core
        self.cgroups = [cluster.cgroup_parents[c] / self.netns for c in CONTROLLERS]
        self._cluster = cluster

    def run(self, argv: list[str], env: dict | None = None, **popen_kwargs) -> subprocess.Popen:
        """Start argv inside this host: it joins the cgroups, then execs in the namespace."""
        procs_files = [str(cg / "cgroup.procs") for cg in self.cgroups]
        env = {**(os.environ if env is None else env), "BENCHMARK_HOST": self.name}  # ranks say where they ran
        wrapped = ["/bin/sh", "-c", _JOIN_AND_EXEC, "sh", str(len(procs_files)), *procs_files,
                   self._cluster.ip_binary, "netns", "exec", self.netns, *map(str, argv)]
        proc = subprocess.Popen(wrapped, env=env, **popen_kwargs)
        self._cluster.processes.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every process on this host now (in its namespace or its cgroups)."""
        return sorted(set(_netns_pids(self.netns) + [p for cg in self.cgroups for p in _cgroup_pids(cg)]))

    def stop_processes(self, grace_s: float = 3.0) -> list[int]:
        """SIGTERM, then SIGKILL, everything on this host (e.g. the daemons a cell started); the
        host itself stays. Returns the pids it stopped."""
        pids = self.pids()
        kill_pids(pids, grace_s)
        return pids

    def limit_cpu(self, fraction: float | None) -> int:
        """This host at ``fraction`` of its share (CFS quota = fraction x the cluster's ``cpu_fraction``
        x period x cores; None: back to its share, no limit without one)."""
        cpu, cores = self.cgroups[CONTROLLERS.index("cpu")], parse_cpu_list((self.cgroups[0] / "cpuset.cpus").read_text())
        share = self._cluster.cpu_fraction
        if share is not None:
            fraction = share * (1.0 if fraction is None else fraction)
        period = 100_000 if fraction is None else 10_000  # 10 ms: throttled evenly, not in 75 ms gaps
        quota = -1 if fraction is None else max(1000, round(fraction * period * max(1, len(cores))))  # floor: 1 ms
        for name, value in (("quota", -1), ("period", period), ("quota", quota)):  # the period: while unlimited
            (cpu / f"cpu.cfs_{name}_us").write_text(str(value))
        return quota

    def shape_link(self, network: str | NetworkSpec) -> NetworkSpec:
        """This host's link alone (both ends) at ``network``; "unshaped" removes the shaping."""
        spec = NetworkSpec.parse(network)
        for ns, dev in ((self.netns, "eth0"), (self._cluster.switch_netns, f"p{self.index}")):
            _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", *spec.tbf_args()] if spec.tbf_args()
                 else ["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=bool(spec.tbf_args()))
        return spec

    def link_bytes(self) -> tuple[int, int]:
        """(tx_bytes, rx_bytes) of this host's eth0, from the kernel's interface counters."""
        out = _cmd(["ip", "-n", self.netns, "-s", "-j", "link", "show", "eth0"]).stdout
        stats = json.loads(out)[0]["stats64"]
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])

    def __repr__(self) -> str:
        return f"EmulatedHost({self.netns}, {self.address}, core {self.core})"


class EmulatedCluster:
    """N hosts on one shaped switch; a context manager (``start()`` on enter, ``stop()`` on exit)."""

    def __init__(self, name: str, hosts: int = 2, cores_per_host: int = 1,
                 memory_mb: int | None = None, network: str | NetworkSpec = "1gbit", cpu_fraction: float | None = None):
        if not _NAME.match(name):
            raise ValueError(f"cluster name must match {_NAME.pattern}; got {name!r}")
        if not 1 <= hosts <= 200:
            raise ValueError(f"hosts must be 1..200; got {hosts}")
        if cores_per_host != 1:
            raise ValueError("cores_per_host: only 1 is supported (a host is pinned to one core)")
        if memory_mb is not None and memory_mb <= 0:
            raise ValueError(f"memory_mb must be positive; got {memory_mb}")
        if cpu_fraction is not None and not 0 < cpu_fraction <= 1:
            raise ValueError(f"cpu_fraction must be in (0, 1]; got {cpu_fraction}")
        self.cpu_fraction = cpu_fraction
        self.name, self.n_hosts, self.memory_mb = name, hosts, memory_mb
        self.network = NetworkSpec.parse(network)
        self.prefix = f"{owner_prefix()}-{name}"
        self.switch_netns = f"{self.prefix}-sw"
        self.hosts: list[EmulatedHost] = []
        self.processes: list[subprocess.Popen] = []
        self.cgroup_parents = {c: _own_cgroup(c) for c in CONTROLLERS}
        self.ip_binary = shutil.which("ip") or "ip"
        self.started = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> Self:
        """Sweep dead owners' leftovers, then build switch, hosts, links and cgroups."""
        if shutil.which("ip") is None or shutil.which("tc") is None:
            raise RuntimeError("ip/tc not found: install iproute2 (scripts/system_deps.sh)")
        sweep()
        if any(ns == self.switch_netns or ns.startswith(self.prefix + "-h") for ns in list_netns()):
            raise RuntimeError(f"cluster {self.prefix} already exists in this process")
        cores = parse_cpu_list((self.cgroup_parents["cpuset"] / "cpuset.effective_cpus").read_text())
        mems = parse_cpu_list((self.cgroup_parents["cpuset"] / "cpuset.effective_mems").read_text())
        self.hosts = [EmulatedHost(self, k, cores[k % len(cores)]) for k in range(self.n_hosts)]
        self.started = True  # from here on stop() has something to undo
        try:
            self._make_switch()
            for host in self.hosts:
                self._make_link(host)
                self._make_cgroups(host, mems[0])
        except BaseException:
            self.stop()
            raise
        return self

    def _make_switch(self) -> None:
        sw = self.switch_netns
        _cmd(["ip", "netns", "add", sw])
        _cmd(["ip", "-n", sw, "link", "set", "lo", "up"])
        _cmd(["ip", "-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0"])
        _cmd(["ip", "-n", sw, "link", "set", "br0", "up"])

    def _make_link(self, host: EmulatedHost) -> None:
        """Host netns + veth: ``eth0`` in the host, ``p<k>`` on the bridge; tbf on both ends."""
        sw, ns, port = self.switch_netns, host.netns, f"p{host.index}"
        _cmd(["ip", "netns", "add", ns])
        _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
        # Both ends are created directly in their namespaces: nothing ever sits in the root one.
        _cmd(["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", sw])
        _cmd(["ip", "-n", sw, "link", "set", port, "master", "br0"])
        _cmd(["ip", "-n", sw, "link", "set", port, "up"])
        _cmd(["ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        _cmd(["ip", "-n", ns, "link", "set", "eth0", "up"])
        tbf = self.network.tbf_args()
        if tbf:
            _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", "tbf", *tbf])
            _cmd(["tc", "-n", sw, "qdisc", "replace", "dev", port, "root", "tbf", *tbf])

    def _make_cgroups(self, host: EmulatedHost, mem_node: int) -> None:
        cpuset, memory, *_ = host.cgroups
        for path in dict.fromkeys(p.resolve() for p in host.cgroups):  # "cpu,cpuacct" mounted together: one
            path.mkdir()
        (cpuset / "cpuset.cpus").write_text(str(host.core))
        (cpuset / "cpuset.mems").write_text(str(mem_node))
        if self.cpu_fraction is not None:
            host.limit_cpu(None)  # the host's share of its core
        if self.memory_mb is not None:
            limit = str(self.memory_mb * 1024 * 1024)
            (memory / "memory.limit_in_bytes").write_text(limit)
            memsw = memory / "memory.memsw.limit_in_bytes"  # present with swap accounting:
            if memsw.exists():  # without it a host could swap instead of hitting its limit
                memsw.write_text(limit)

    def stop(self) -> None:
        """Kill the hosts' processes, delete namespaces (and so the veths) and cgroups; idempotent."""
        if not self.started:
            return
        names = [self.switch_netns] + [h.netns for h in self.hosts]
        remove_netns_and_cgroups(names, [cg for h in self.hosts for cg in h.cgroups])
        for proc in self.processes:  # reap what we started so no zombies stay behind
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.processes.clear()
        self.started = False
