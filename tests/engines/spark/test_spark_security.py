"""The embedded Spark cluster (``pipelines.engines.spark.cluster``) is the run's own: its master takes
jobs only from drivers that hold the run's secret, the secret is on no command line, and its
daemons do not outlive the run that owns them (a SIGKILLed CLI included, or the next start
sweeps them).

    .venv/bin/python -m pytest tests/engines/spark/test_spark_security.py -q     # ~4-6 min on 2 busy cores
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.engines.spark import cluster as spark_cluster, daemons as spark_daemons
from pipelines.runfolder.paths import RunPaths
from pipelines.engines.spark.session import get_spark, spark_env, stop_spark
from tests.engines.spark.test_spark_embedded import _spark_daemons

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
UP_S = 240.0  # cluster start in a child process on a loaded 2-core machine
GONE_S = 30.0  # a SIGTERMed master/worker JVM is gone within this
REFUSED_S = 180.0  # an unauthenticated driver's first registration attempt fails within this (JVM start included)
REFUSAL = "Failed to connect to master"  # StandaloneAppClient, logged on each refused attempt

# A CLI-like process: starts clusters (argv: "tied"|"run" folder ...), says so, then waits to be killed.
CHILD = """
import sys, time
from pathlib import Path
from pipelines.engines.spark import cluster as spark_cluster, daemons as spark_daemons
from pipelines.runfolder.paths import RunPaths
spark_cluster._DIE_WITH_OWNER = sys.argv[1] == "1"
for kind, folder in zip(sys.argv[2::2], sys.argv[3::2]):
    url = spark_cluster.start(RunPaths(Path(folder)), workers=1, tied_to_caller=kind == "tied")
    print("UP", kind, url, flush=True)
time.sleep(900)
"""


def _start_child(tmp: Path, die_with_owner: bool, *clusters: tuple[str, Path]) -> subprocess.Popen:
    """Run CHILD until every cluster is up; -> the running process."""
    args = [a for kind, folder in clusters for a in (kind, str(folder))]
    log = open(tmp / f"child-{time.monotonic_ns()}.log", "w+")  # noqa: SIM115 - the child's output, read while it runs
    proc = subprocess.Popen([sys.executable, "-c", CHILD, "1" if die_with_owner else "0", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + UP_S
    while time.monotonic() < deadline and proc.poll() is None:
        log.seek(0)
        if log.read().count("UP ") == len(clusters):
            return proc
        time.sleep(0.5)
    proc.kill()
    log.seek(0)
    pytest.fail(f"the child's clusters did not come up (exit {proc.poll()}):\n{log.read()[-3000:]}")


def _gone(folder: Path, within: float) -> bool:
    deadline = time.monotonic() + within
    while _spark_daemons(folder) and time.monotonic() < deadline:
        time.sleep(0.5)
    return not _spark_daemons(folder)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Leftovers of a SIGKILLed process (a tied cluster whose daemons missed their death signal,
    and a DAG-style cluster owned by its run), then this process's ``start``, which sweeps."""
    tmp = tmp_path_factory.mktemp("spark-security")
    tied, dag, own = RunPaths(tmp / "killed-cli"), RunPaths(tmp / "dag-run"), RunPaths(tmp / "next-run")
    child = _start_child(tmp, False, ("tied", tied.root), ("run", dag.root))
    child.kill()  # SIGKILL: no handler, no finally
    child.wait()
    time.sleep(3)
    seen = SimpleNamespace(tied_after_kill=_spark_daemons(tied.engine_cluster("spark")),
                           dag_after_kill=_spark_daemons(dag.engine_cluster("spark")))
    min_age, spark_daemons.SWEEP_MIN_AGE_S = spark_daemons.SWEEP_MIN_AGE_S, 2.0
    try:
        url = spark_cluster.start(own, workers=1)  # the next run on this host
        seen.tied_after_start = _spark_daemons(tied.engine_cluster("spark"))
        seen.dag_after_start = _spark_daemons(dag.engine_cluster("spark"))
        dag.report.mkdir(parents=True)
        dag.summary.write_text("{}")  # the DAG run finished, its teardown never ran
        seen.swept_after_finish = spark_daemons.sweep()
        seen.dag_after_finish = _spark_daemons(dag.engine_cluster("spark"))
        yield SimpleNamespace(url=url, paths=own, seen=seen)
    finally:
        spark_daemons.SWEEP_MIN_AGE_S = min_age
        stop_spark(jvm=True)
        for paths in (own, tied, dag):
            spark_cluster.stop(paths)


def test_next_start_sweeps_what_a_killed_run_left(cluster):
    seen = cluster.seen
    assert len(seen.tied_after_kill) == 2 and len(seen.dag_after_kill) == 2  # master + worker each, alive
    assert seen.tied_after_start == []  # its owner is dead: swept by the next start
    assert len(seen.dag_after_start) == 2  # owned by its (unfinished) run, not by the killed task: kept
    assert seen.dag_after_finish == [] and len(seen.swept_after_finish) == 2  # the run finished: swept


def test_sigkilled_cli_takes_its_cluster_with_it(tmp_path):
    paths = RunPaths(tmp_path / "cli")
    child = _start_child(tmp_path, True, ("tied", paths.root))
    try:
        assert len(_spark_daemons(paths.engine_cluster("spark"))) == 2
        child.kill()
        child.wait()
        assert _gone(paths.engine_cluster("spark"), GONE_S), _spark_daemons(paths.engine_cluster("spark"))
    finally:
        child.kill()
        spark_cluster.stop(paths)


def _cmdlines() -> list[bytes]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            out.append((proc / "cmdline").read_bytes())
        except OSError:
            continue
    return out


def test_state_is_private_and_the_secret_is_on_no_command_line(cluster):
    info = json.loads(cluster.paths.engine_cluster_info("spark").read_text())
    secret = info["secret"]
    assert re.fullmatch(r"[0-9a-f]{64}", secret)
    assert cluster.paths.engine_cluster_info("spark").stat().st_mode & 0o777 == 0o600
    assert cluster.paths.engine_cluster("spark").stat().st_mode & 0o777 == 0o700
    for pid in info["pids"]:  # the daemons read it from their environment (readable by this user only)
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"_SPARK_AUTH_SECRET={secret}".encode() in environ
        assert b"-Dspark.authenticate=true" in Path(f"/proc/{pid}/cmdline").read_bytes()
    spark = get_spark(cluster.url, app_name="with-secret")  # a driver JVM (spark-submit) runs now
    assert spark.sparkContext.getConf().get("spark.authenticate.secret") == secret
    assert not [c for c in _cmdlines() if secret.encode() in c], "the secret is on a command line"
    assert spark_daemons.secret_for("spark://127.0.0.1:7077") is None  # another master gets no secret


def test_driver_with_the_secret_runs_jobs(cluster):
    spark = get_spark(cluster.url, app_name="with-secret")
    assert spark.sparkContext.parallelize(range(4), 2).map(lambda x: x * 2).sum() == 12
    spark_daemons.SECRETS.clear()  # another process of the run: it finds the secret through the master
    assert spark_daemons.secret_for(cluster.url) == json.loads(cluster.paths.engine_cluster_info("spark").read_text())["secret"]
    assert "Registered app with-secret" in (cluster.paths.engine_cluster("spark") / "master.log").read_text()


INTRUDER = """
import sys
from pyspark.sql import SparkSession
b = SparkSession.builder.master(sys.argv[1]).appName(sys.argv[2]).config("spark.ui.enabled", "false")
b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
if len(sys.argv) > 3:
    b = b.config("spark.authenticate", "true").config("spark.authenticate.secret", sys.argv[3])
print("RESULT", b.getOrCreate().sparkContext.parallelize(range(4), 2).sum(), flush=True)
"""


def _first_refusal(proc: subprocess.Popen, stderr_path: Path, deadline: float) -> str:
    """Waits until the driver logs its first failed registration (Spark then retries 3 x 20 s before
    giving up, which proves nothing more), or exits; returns its stderr so far."""
    while time.monotonic() < deadline and proc.poll() is None:
        if REFUSAL in stderr_path.read_text(errors="replace"):
            break
        time.sleep(0.5)
    return stderr_path.read_text(errors="replace")


def test_driver_without_the_secret_is_refused(cluster, tmp_path):
    """Another local user's job: no secret, or a guessed one. Both are refused by the master."""
    env = {k: v for k, v in {**os.environ, **spark_env()}.items() if k != "_SPARK_AUTH_SECRET"}
    runs = {}
    for name, secret in (("intruder-no-secret", []), ("intruder-guess", ["0" * 64])):
        stderr_path = tmp_path / f"{name}.stderr"
        with stderr_path.open("w") as stderr:
            runs[name] = (subprocess.Popen([sys.executable, "-c", INTRUDER, cluster.url, name, *secret], env=env,
                                           stdout=subprocess.PIPE, stderr=stderr, text=True), stderr_path)
    deadline = time.monotonic() + REFUSED_S
    try:
        stderrs = {name: _first_refusal(proc, path, deadline) for name, (proc, path) in runs.items()}
    finally:
        for proc, _ in runs.values():
            proc.kill()
    master_log = (cluster.paths.engine_cluster("spark") / "master.log").read_text()
    for name, (proc, _) in runs.items():
        stdout = proc.communicate(timeout=30)[0]
        assert "RESULT" not in stdout, (name, stdout, stderrs[name][-3000:])
        assert REFUSAL in stderrs[name], (name, stderrs[name][-3000:])
        assert f"Registered app {name}" not in master_log
