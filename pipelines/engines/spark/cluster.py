"""The embedded Spark standalone cluster: ``spark_master="embedded"``.

Teams run Spark training on a cluster, not in TorchDistributor's local mode (torchrun on the
driver). With ``spark_master="embedded"`` the run starts a real standalone cluster from the
pyspark distribution (``$SPARK_HOME/bin/spark-class`` Master + Workers), bound to 127.0.0.1 and
sized to the host (one 1-core worker per CPU core), uses it for preprocessing and for every
spark cell (barrier tasks on its executors), and stops it at the end, also when a step failed.
Started as the run's service (``EMBEDDED_SERVICE``) it runs in the run's loopback-only network
namespace (``pipelines.cluster.netns``), and so does every driver that uses it: the data stage's
tokenization and each cell's driver process (``namespace``).

The cluster outlives the process that started it (the DAG starts it in one task and stops it in
a teardown task), so what is needed to stop it lives in the run folder:
``<run>/spark-cluster/cluster.json`` (0600 in a 0700 folder: master URL, each daemon's pid, start
time and uid, owner, secret, scratch folder) beside the master/worker logs. ``stop`` signals those
daemons only while each is proved the same process (``pipelines.cluster.owned``): a reused pid is left
alone, whatever its command line says. Spark's, Python's and the JVMs' temp files go to a 0700 scratch
folder made for the cluster (``pipelines.runfolder.scratch``), never a fixed name in /tmp.

    start(paths); ...; stop(paths)          # through pipelines.run.services (EMBEDDED_SERVICE):
                                            # the DAG's start_services / stop_services tasks,
                                            # and the CLI's `run` (stages.run_clusters, tied to it)
    with embedded_cluster(paths, config):   # the same for a block, from a config in hand (tests)
        ...
    master_url(config, paths)               # what Spark connects to ("local[*]", spark://..., or
                                            # the embedded cluster's URL)
    daemons.secret_for(url)                 # the embedded cluster's secret (session.py reads it)

Security: every cluster gets a secret of its own (``secrets.token_hex``) and runs with
``spark.authenticate=true``: the master and workers read it from ``_SPARK_AUTH_SECRET`` in their
environment (Spark's own variable; never on a command line that ``ps`` shows), the run's
drivers get it from ``pipelines.engines.spark.session.get_spark`` (``spark.authenticate.secret``, set
through py4j after the gateway JVM started, so not on spark-submit's command line either), and
the executors from their worker. A driver without it is refused by the master. The master's REST
submission server, the UI's kill links and its decommission endpoint are off.

Lifetime: ``start(paths, tied_to_caller=True)`` (the CLI) ties the daemons to the calling process
(``PR_SET_PDEATHSIG``: SIGTERM when it ends, SIGKILL included). Each daemon carries its state file
and owner in its environment (``PIPELINES_SPARK_STATE``, ``PIPELINES_SPARK_OWNER``), and every
``start`` first runs ``sweep()``: it kills the daemons of a dead owner, and those of a DAG-started
cluster (owned by its run, not by a task) once nothing records them any more (state file gone or
not listing them) or their run has finished (its report/summary.json is newer than the cluster).
The sweep and the secret lookup read this host's daemons: ``daemons.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pipelines.cluster import netns, owned
from pipelines.cluster.processes import free_ports_on, start_session
from pipelines.config import BenchmarkConfig
from pipelines.engines.spark import EMBEDDED
from pipelines.engines.spark.daemons import ENV_OWNER, ENV_STATE, SECRETS, STOP_S, owner_mark, sweep
from pipelines.measure.signals import raise_on_sigterm
from pipelines.runfolder.fileio import atomic_write_json
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.scratch import check_scratch, make_scratch, remove_scratch

NAME = "spark"  # the engine: the run folder's <NAME>-cluster/

log = logging.getLogger(__name__)
STARTUP_S = 120.0  # JVM start on a loaded 2-core box
# Not secret (the command line shows them): authentication on, the unauthenticated ways in off.
DAEMON_OPTS = ("-Dspark.authenticate=true -Dspark.master.rest.enabled=false -Dspark.ui.killEnabled=false "
               "-Dspark.master.ui.decommission.allow.mode=DENY")
_DIE_WITH_OWNER = True  # tests turn it off to leave what the sweep must find


def cluster_folder(paths: RunPaths) -> Path:
    """The run's cluster folder: its daemons' logs and work dirs, and its state file."""
    return paths.engine_cluster(NAME)


def info_file(paths: RunPaths) -> Path:
    """``cluster.json`` while it runs: URL, daemons, owner, secret, scratch folder, namespace."""
    return paths.engine_cluster_info(NAME)


class ClusterNotRunning(RuntimeError):
    """spark_master="embedded" but the run's cluster was not started (or is gone)."""


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _spark_class(home: Path, args: list[str], env: dict, log_file: Path, tied: bool,
                 prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    with open(log_file, "a") as out:  # appended: a cluster started again in the run keeps its history
        return start_session([*prefix, str(home / "bin" / "spark-class"), *args], die_with_parent=tied and _DIE_WITH_OWNER,
                             env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _log_size(log_file: Path) -> int:
    return log_file.stat().st_size if log_file.exists() else 0


def _wait_for_line(log_file: Path, needle: str, procs: list[subprocess.Popen], since: int = 0) -> None:
    """Until ``needle`` is in ``log_file`` after its first ``since`` bytes (an earlier start's lines)."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        with open(log_file, "rb") as f:
            f.seek(since)
            if needle in f.read().decode(errors="replace"):
                return
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a Spark process of the embedded cluster exited; {log_file}:\n"
                               f"{log_file.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)
    raise RuntimeError(f"no {needle!r} in {log_file} after {STARTUP_S:.0f}s")


def host_workers() -> int:
    """Workers for this host: one 1-core worker per CPU core."""
    return max(1, os.cpu_count() or 1)


def _daemon_env(paths: RunPaths, secret: str, owner: str | None, scratch: Path) -> dict[str, str]:
    env = {**os.environ, "SPARK_HOME": str(_spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(cluster_folder(paths)), "SPARK_NO_DAEMONIZE": "1",
           "PYSPARK_PYTHON": sys.executable, "_SPARK_AUTH_SECRET": secret,
           ENV_STATE: str(info_file(paths).resolve()),
           # the cluster's temp files in its scratch folder: the workers' local dirs (shuffle, block managers),
           # Python's (workers, torchrun, ranks), every JVM's (JAVA_TOOL_OPTIONS: the executors' too)
           "SPARK_LOCAL_DIRS": str(scratch), "TMPDIR": str(scratch),
           "JAVA_TOOL_OPTIONS": f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} -Djava.io.tmpdir={scratch}".strip()}
    for key in ("SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS"):
        env[key] = f"{os.environ.get(key, '')} {DAEMON_OPTS}".strip()
    env.pop(ENV_OWNER, None)
    if owner:
        env[ENV_OWNER] = owner
    return env


def start(paths: RunPaths, workers: int | None = None, tied_to_caller: bool = False,
          where: netns.Namespace | None = None) -> str:
    """Start master + workers for the run (idempotent: a live cluster is kept); returns its URL.

    ``tied_to_caller``: the daemons end with this process (the CLI), SIGKILL included; else they
    outlive it until ``stop`` (the DAG's setup task) or a later ``sweep``. ``where``: the network
    namespace they run in (the run's, ``pipelines.cluster.netns``; recorded, so its drivers join
    it: ``namespace``); by default this process's."""
    if is_running(paths):
        return master_url_of(paths)
    swept = sweep()
    if swept:
        log.warning("killed %d Spark daemon(s) left by dead runs: %s", len(swept), swept)
    workers = workers or host_workers()
    home, folder = _spark_home(), cluster_folder(paths)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # the state file holds the secret
    if not folder.is_symlink():
        folder.chmod(0o700)
    check_scratch(folder)  # ours, not a link, 0700
    secret = secrets.token_hex(32)
    owner = owner_mark(os.getpid()) if tied_to_caller else None
    where = where or netns.host()
    port, master_ui, *worker_uis = free_ports_on(where, workers + 2)  # free where the daemons bind them
    url = f"spark://127.0.0.1:{port}"
    scratch = make_scratch("spark")
    env = _daemon_env(paths, secret, owner, scratch)
    record = {"url": url, "pids": [], "daemons": [], "started": time.time(), "owner": owner, "secret": secret,
              "scratch": str(scratch), "isolation": where.isolation, "not_isolated": where.not_isolated,
              "netns": netns.run_state(paths) if where.kind == "run" else None}
    procs: list[subprocess.Popen] = []

    def started(proc: subprocess.Popen | None = None) -> None:  # recorded at once: stop() stops a failed start
        if proc is not None:
            procs.append(proc)
            record["pids"].append(proc.pid)
            record["daemons"].append(owned.record(proc.pid))
        atomic_write_json(info_file(paths), record)  # through mkstemp: 0600 from its first byte

    started()  # the scratch folder, before any daemon
    logs = [folder / "master.log", *(folder / f"worker{i}.log" for i in range(1, workers + 1))]
    since = {log_file: _log_size(log_file) for log_file in logs}
    try:
        started(_spark_class(home, ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                    "--port", str(port), "--webui-port", str(master_ui)],
                             env, folder / "master.log", tied_to_caller, where.prefix))
        _wait_for_line(logs[0], "I have been elected leader", procs, since[logs[0]])
        for i in range(1, workers + 1):
            started(_spark_class(home, [
                "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
                "--memory", "1g", "--webui-port", str(worker_uis[i - 1]), "--work-dir", str(folder / f"worker{i}"),
            ], env, folder / f"worker{i}.log", tied_to_caller, where.prefix))
        for i in range(1, workers + 1):
            _wait_for_line(logs[i], "Successfully registered with master", procs, since[logs[i]])
    except BaseException:
        stop(paths)
        raise
    SECRETS[url] = secret
    log.info("embedded Spark cluster up: %s, %d worker(s) x 1 core, authenticated%s (logs: %s)", url,
             workers, ", tied to this process" if tied_to_caller else "", folder)
    return url


def driver_namespace(config: BenchmarkConfig, paths: RunPaths) -> netns.Namespace | None:
    """Where a driver on the run's embedded cluster must run (``namespace``), or None: the config
    has no embedded cluster, or it is not up."""
    if config.engine("spark").master != EMBEDDED or not info_file(paths).exists():
        return None
    return namespace(paths)


def namespace(paths: RunPaths) -> netns.Namespace:
    """Where the run's cluster runs, for a driver using it: the run's network namespace when it
    was started there (``EmbeddedService``), else this host's (``not_isolated``: why, when the run's
    namespace could not be made and cluster.allow_unisolated_cells let it start exposed)."""
    info = _read(paths)
    return netns.enter(info["netns"]) if info.get("netns") else netns.host(info.get("not_isolated"))


def _read(paths: RunPaths) -> dict:
    try:
        return json.loads(info_file(paths).read_text())
    except FileNotFoundError:
        raise ClusterNotRunning(
            f"spark_master=embedded, but {info_file(paths)} is missing: the run's Spark cluster "
            "was not started (the CLI's `run` and the DAG's start_services task start it)") from None


def master_url_of(paths: RunPaths) -> str:
    """The run's cluster URL (its secret is then known to this process: ``secret_for``)."""
    info = _read(paths)
    SECRETS[info["url"]] = info["secret"]
    return info["url"]


def is_running(paths: RunPaths) -> bool:
    if not info_file(paths).exists():
        return False
    daemons = _read(paths).get("daemons", [])
    return bool(daemons) and all(owned.ours(d) for d in daemons)


def stop(paths: RunPaths) -> list[int]:
    """Stop every process of the run's cluster (SIGTERM, then SIGKILL) and remove its scratch
    folder; returns the pids stopped."""
    if not info_file(paths).exists():
        return []
    info = _read(paths)
    stopped = owned.stop_groups(info.get("daemons", []), STOP_S)  # and the executors each started
    remove_scratch(info.get("scratch"))
    SECRETS.pop(info["url"], None)
    info_file(paths).unlink(missing_ok=True)
    log.info("embedded Spark cluster stopped (%d process(es))", len(stopped))
    return stopped


@contextlib.contextmanager
def embedded_cluster(paths: RunPaths, config: BenchmarkConfig) -> Iterator[str | None]:
    """Start the run's cluster when the config asks for it and none runs; stop the one it
    started afterwards, whatever happened (a cluster started by someone else is left alone).
    The cluster is tied to this process: a SIGKILLed CLI leaves no daemon behind."""
    if config.engine("spark").master != EMBEDDED or is_running(paths):
        yield None
        return
    with raise_on_sigterm():  # a SIGTERM'd run still stops its cluster
        try:
            yield start(paths, tied_to_caller=True)
        finally:
            stop(paths)


def master_url(config: BenchmarkConfig, paths: RunPaths) -> str:
    """The master Spark connects to: the embedded cluster's URL, or the configured master."""
    if config.engine("spark").master != EMBEDDED:
        return config.engine("spark").master
    url = master_url_of(paths)
    if not is_running(paths):
        raise ClusterNotRunning(f"the run's embedded Spark cluster ({url}) is not running; see "
                                f"{cluster_folder(paths)}/*.log")
    return url


class EmbeddedService:
    """The embedded cluster as the run's standing Spark cluster on this host (``pipelines.run.services``),
    when the engine's ``engines.spark.master`` is "embedded": the data stage uses it (started at
    setup), then the cells of the platforms that train on this engine and declare it as a service."""

    name = "embedded Spark cluster"

    def at_setup(self, config: BenchmarkConfig) -> bool:
        return config.engine("spark").master == EMBEDDED

    def wanted(self, config: BenchmarkConfig) -> bool:
        return config.engine("spark").master == EMBEDDED and config.cluster.kind == "local"

    def running(self, paths: RunPaths) -> bool:
        return is_running(paths)

    def start(self, paths: RunPaths, config: BenchmarkConfig, tied_to_caller: bool = False) -> str:
        # in the run's network namespace: its drivers (the data stage's, the cells') join it there;
        # where none can be made, refused unless cluster.allow_unisolated_cells (isolation.NotIsolated)
        where = netns.ensure_run(paths, tied_to_caller, allow_unisolated=config.cluster.allow_unisolated_cells)
        return start(paths, tied_to_caller=tied_to_caller, where=where)

    def stop(self, paths: RunPaths) -> list[int]:
        return stop(paths)


EMBEDDED_SERVICE = EmbeddedService()
