"""A SparkSession configured for this project: local by default, any master URL by config.

Sets what Spark needs on a single machine (loopback driver, the venv's python for workers)
and the project root on the workers' PYTHONPATH so ``pipelines`` imports there.
A session is reused within a process (``getOrCreate``) unless ``fresh=True`` (training cells),
except that a request for another
master (a ``spark://`` cluster vs ``local[...]``, or another cluster) stops the running one
first: ``getOrCreate`` would otherwise hand back the old session on the wrong master.
Local masters count as the same (``local[2]`` serves a ``local[*]`` request).

The run's embedded cluster (``pipelines.engines.spark.cluster``) authenticates its drivers: for its
master the session gets ``spark.authenticate`` and the cluster's secret
(``daemons.secret_for``). The secret is set on the SparkConf through py4j once the gateway
JVM runs (started first, with the other settings), never as a ``--conf`` of spark-submit's
command line, which ``ps`` shows to every local user.
"""

from __future__ import annotations

import os
import sys

from pipelines.runfolder.paths import PROJECT_ROOT


def spark_env() -> dict[str, str]:
    """Environment the driver and its python workers need (idempotent)."""
    pythonpath = os.environ.get("PYTHONPATH", "")
    if str(PROJECT_ROOT) not in pythonpath.split(os.pathsep):
        pythonpath = os.pathsep.join(p for p in (str(PROJECT_ROOT), pythonpath) if p)
    return {
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
        "PYTHONPATH": pythonpath,
    }


def _same_master(running: str, wanted: str) -> bool:
    return running == wanted or (running.startswith("local") and wanted.startswith("local"))


def session_running() -> bool:
    """This process has a SparkContext running now (a caller's, which a step then leaves alone)."""
    import sys as _sys

    if "pyspark" not in _sys.modules:
        return False
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


def stop_spark(jvm: bool = False) -> None:
    """Stop this process's SparkSession (and its JVM-side context), if one runs; ``jvm``: also end
    the driver's JVM (py4j's gateway process), so nothing of it stays beside what runs next (a
    timed cell): the next session starts a new one."""
    import sys as _sys

    if "pyspark" not in _sys.modules:
        return
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        try:
            SparkSession.builder.getOrCreate().stop()
        except Exception:  # the JVM is already gone (killed with the cell): drop the Python side only
            SparkContext._active_spark_context = None
            SparkSession._instantiatedSession = None
    if jvm and SparkContext._gateway is not None:
        _end_gateway(SparkContext)


def _end_gateway(context_class) -> None:
    """Close py4j's gateway: its JVM exits when its stdin closes (PySpark's own design)."""
    from pipelines.cluster.processes import stop_tree

    gateway, context_class._gateway, context_class._jvm = context_class._gateway, None, None
    try:
        gateway.shutdown()
    except Exception:  # already gone
        pass
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        if proc.stdin:
            proc.stdin.close()
        stop_tree([proc], grace_s=10.0)


def get_spark(master: str = "local[*]", app_name: str = "pipelines", conf: dict[str, str] | None = None,
              fresh: bool = False):
    """Build (or reuse) the SparkSession. pyspark is imported here, never at module top.

    ``fresh=True`` stops a running session first: a timed training cell pays the same session
    start-up under every runner (CLI, ``airflow dags test``, executors, bench).
    """
    os.environ.update(spark_env())
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    running = SparkContext._active_spark_context
    if running is not None and (fresh or not _same_master(running.master, master)):
        SparkSession.builder.getOrCreate().stop()  # the session of the running context

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
        .config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    secret = _embedded_secret(master)
    if secret:
        _start_gateway(builder)  # with the settings so far: the secret must not be on its command line
        builder = builder.config("spark.authenticate", "true").config("spark.authenticate.secret", secret)
    return builder.getOrCreate()


def _embedded_secret(master: str) -> str | None:
    if not master.startswith("spark://"):
        return None
    from pipelines.engines.spark.daemons import secret_for

    return secret_for(master)


def _start_gateway(builder) -> None:
    """Launch pyspark's gateway JVM now (if none runs) with ``builder``'s settings as its
    ``--conf`` options, as ``getOrCreate`` would: JVM-level ones (driver memory, extra Java
    options) still apply, and settings added afterwards reach the JVM through py4j only."""
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is not None:
        return
    conf = SparkConf()
    for key, value in builder._options.items():
        conf.set(key, value)
    SparkContext._ensure_initialized(conf=conf)
