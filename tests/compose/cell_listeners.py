"""(h) Listeners seen from inside the Celery workers while their cells train.

A one-host cell (ddp, Determined) runs in a network namespace of its own, loopback only
(pipelines/platforms/torchrun.py: ``unshare --user --map-root-user --net`` inside the container,
which docker/seccomp/cells.json allows). ``Watcher`` polls every Celery worker container with
``docker exec`` while the DAG runs: PROBE lists, in the container, every process of a cell (its
command names a cell folder), its network namespace, and the listening sockets it holds in the
container's namespace and in its own; plus every other listener of the container on an address
beyond loopback (Airflow's log server, a Spark driver's ports), with its command. ``evidence``
then requires that each one-host cell was seen training in a namespace that is not the
container's and that no process of a one-host cell listened in the container's namespace; a cell
on the stack's Spark cluster (its driver process must be reachable by the executors) is listed.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

# Run inside a worker container (`python3 -`, cwd /opt/project where pipelines/ is): one JSON line.
PROBE = r'''
import json, os
from pipelines.measure.listeners import _listening_sockets, _netns, _socket_inodes, is_loopback

def argv(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []

home = _netns(os.getpid())  # docker exec: the container's namespace
table = _listening_sockets(os.getpid())
cells, others = [], []
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    pid, cmd = int(entry), argv(entry)
    if cmd and os.path.basename(cmd[0]) == "unshare":  # about to enter the cell's namespace: its exec is seen
        continue
    inodes = _socket_inodes(pid)
    ns = _netns(pid)
    here = sorted({table[i] for i in inodes if i in table}) if ns == home else []
    if "--cell-dir" in cmd[:-1]:
        own = _listening_sockets(pid) if ns != home else {}
        cells.append({"pid": pid, "cell": os.path.basename(cmd[cmd.index("--cell-dir") + 1].rstrip("/")),
                      "program": " ".join(cmd[:4])[:160], "netns": ns, "isolated": ns != home,
                      "listens_in_container": here,
                      "listens_in_own_namespace": sorted({own[i] for i in inodes if i in own})})
    elif any(not is_loopback(a) for a in here):
        others.append({"pid": pid, "program": " ".join(cmd[:4])[:160], "listens": here})
print(json.dumps({"netns": home, "cells": cells, "others": others}))
'''

ONE_HOST_BACKENDS = ("ddp", "determined")  # the stack's cells that train inside the Celery workers


class Watcher:
    """Polls the workers' containers (name -> samples) until ``stop``; never raises."""

    def __init__(self, containers: list[str], interval_s: float = 2.0):
        self.containers, self.interval_s = containers, interval_s
        self.samples: dict[str, list[dict]] = {c: [] for c in containers}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cell-listeners", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name in self.containers:
                try:
                    out = subprocess.run(["docker", "exec", "-i", name, "python3", "-"], input=PROBE,
                                         capture_output=True, text=True, timeout=60)
                    if out.returncode == 0:
                        self.samples[name].append({"t": time.time(), **json.loads(out.stdout)})
                    elif len(self.errors) < 20:
                        self.errors.append(f"{name}: exit {out.returncode}: {out.stderr[-300:]}")
                except Exception as err:  # a probe must not stop the run it watches
                    if len(self.errors) < 20:
                        self.errors.append(f"{name}: {err!r}")
            self._stop.wait(self.interval_s)


def evidence(watcher: Watcher, cells: list[tuple[str, int]], check_error: type[Exception]) -> tuple[str, dict]:
    """(h) from ``watcher``'s samples; ``cells``: (backend, workers) the run trained."""
    seen: dict[str, dict] = {}  # cell -> what was seen of it across samples
    others: dict[str, set] = {}
    for name, samples in watcher.samples.items():
        for sample in samples:
            for proc in sample["cells"]:
                cell = seen.setdefault(proc["cell"], {"container": name, "samples": 0, "processes": set(),
                                                      "isolated": True, "in_container": set(), "own": set()})
                cell["samples"] += 1
                cell["processes"].add(proc["program"].split(" -m ")[-1][:60])
                cell["isolated"] &= proc["isolated"]
                cell["in_container"].update(proc["listens_in_container"])
                cell["own"].update(proc["listens_in_own_namespace"])
            for proc in sample["others"]:
                others.setdefault(proc["program"][:80], set()).update(proc["listens"])
    wanted = [f"{b}-w{w}-r0" for b, w in cells if b in ONE_HOST_BACKENDS]
    missing = [c for c in wanted if c not in seen]
    one_host = {c: s for c, s in seen.items() if c.rpartition("-w")[0] in ONE_HOST_BACKENDS}
    exposed = {c: sorted(s["in_container"]) for c, s in one_host.items() if s["in_container"] or not s["isolated"]}
    # a cell on the stack's Spark or Ray cluster: its driver process (pipelines/platforms/driver.py) runs in
    # the worker's namespace (Spark's executors on other containers connect back to it; Ray Client's
    # driver connects out to the head)
    on_cluster = {c: sorted(s["in_container"]) for c, s in seen.items() if c not in one_host}
    polls = sum(len(s) for s in watcher.samples.values())
    if not wanted or missing:
        raise check_error(f"(h) one-host cells never seen training inside a Celery worker: {missing or wanted} "
                          f"({polls} polls; probe errors: {watcher.errors[:3]})")
    if exposed:
        raise check_error(f"(h) cell processes in the Celery worker's own network namespace, listening there: "
                          f"{exposed}")
    parts = [f"{c} in {s['container']} ({s['samples']} process sightings, its own namespace listening on "
             f"{', '.join(sorted(s['own'])) or 'nothing'})" for c, s in sorted(one_host.items())]
    line = (f"(h) {polls} polls of the Celery workers while the run trained: every one-host cell's process ran in "
            f"a network namespace of its own (none listened in the worker's): " + "; ".join(parts)
            + "; the drivers of cells on the stack's Spark or Ray cluster, in the worker's namespace: " + ("; ".join(f"{c} on {', '.join(a) or 'nothing'}" for c, a in sorted(on_cluster.items()))
                                 or "none")
            + "; the workers' own listeners beyond loopback: "
            + ("; ".join(f"{p} on {', '.join(sorted(a))}" for p, a in sorted(others.items())) or "none"))
    detail = {"polls": polls, "probe_errors": watcher.errors,
              "cells": {c: {**s, "processes": sorted(s["processes"]), "in_container": sorted(s["in_container"]),
                            "own": sorted(s["own"])} for c, s in seen.items()},
              "cluster_cell_drivers": on_cluster, "worker_listeners": {p: sorted(a) for p, a in others.items()}}
    return line, detail


# Run inside a worker container (`python3 -`, as the container's user): the run's network namespace
# (pipelines/cluster/netns.py: a holder in a user + network namespace, entered with nsenter) holds a
# listener on every interface; it answers inside, not on the container's addresses; stop_run ends all.
RUN_NAMESPACE_PROBE = r'''
import json, os, socket, subprocess, sys, tempfile
from pipelines.cluster import netns
from pipelines.measure.listeners import listening
from pipelines.runfolder.paths import RunPaths

paths = RunPaths(tempfile.mkdtemp(prefix="netns-probe-"))
out = {"uid": os.getuid(), "problem": netns.run_problem()}
where = netns.ensure_run(paths)
out.update(kind=where.kind, prefix=list(where.prefix))
code = "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)"
proc = where.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
port = int(proc.stdout.readline())
out.update(port=port, listening=sorted(listening([proc.pid]).get(proc.pid, [])),
           own_netns=netns.of_process(proc.pid) != netns.of_process(os.getpid()))
inside = subprocess.run([*where.prefix, sys.executable, "-c",
                         f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5).close()"])
out["answers_inside"] = inside.returncode == 0
refused, tried = [], sorted({socket.gethostbyname(socket.gethostname()), "127.0.0.1"})
out["tried"] = tried
for address in tried:
    try:
        socket.create_connection((address, port), timeout=5).close()
    except OSError:
        refused.append(address)
out["refused_from_the_container"] = sorted(refused)
out["stopped"] = len(netns.stop_run(paths))
out["left"] = proc.poll() is not None or proc.wait(15) is not None
print(json.dumps(out))
'''


def evidence_run_namespace(container: str, check_error: type[Exception]) -> tuple[str, dict]:
    """(i) the run's network namespace, made and entered inside a Celery worker (non-root, its seccomp
    profile): where a standing cluster on the worker (a Ray head) and its drivers would run."""
    out = subprocess.run(["docker", "exec", "-i", container, "python3", "-"], input=RUN_NAMESPACE_PROBE,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise check_error(f"(i) the run namespace probe failed in {container}: {out.stderr[-1500:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    if not (found["kind"] == "run" and found["own_netns"] and found["answers_inside"] and found["uid"] != 0
            and found["refused_from_the_container"] == found["tried"] and len(found["tried"]) == 2
            and found["stopped"] >= 2 and found["left"]):
        raise check_error(f"(i) the run's network namespace in {container} is not what it should be: {found}")
    line = (f"(i) the run's network namespace in {container} (uid {found['uid']}): entered with "
            f"nsenter --{found['prefix'][-2]} ...; a listener on 0.0.0.0:{found['port']} there answered inside and was "
            f"refused at {', '.join(found['refused_from_the_container'])} from the worker; stop_run ended "
            f"{found['stopped']} process(es)")
    return line, found
