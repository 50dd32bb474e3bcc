"""The embedded Spark cluster stops only what it started (``pipelines.engines.spark.cluster``): each
daemon is recorded with its pid, start time and uid, and a pid that names another process later,
even one whose command line says org.apache.spark.deploy, is left alone. Its temp folders are in a
private scratch folder, gone with it. TorchDistributor's log server listens on the driver's address
only (``pipelines.platforms.spark.distributor``). A real standalone cluster, real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipelines.cluster.leftovers import process_start
from pipelines.engines.spark import cluster as spark_cluster
from pipelines.measure.listeners import listening
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.scratch import PREFIX

# looks like a Spark worker to anything that reads command lines
LOOKALIKE = [sys.executable, "-c", "import time; time.sleep(300)", "org.apache.spark.deploy.worker.Worker",
             "spark://127.0.0.1:7077"]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(item.split("=", 1) for item in raw if "=" in item)


@pytest.mark.slow  # a master and one worker JVM (~15-30 s on 2 busy cores)
def test_stop_leaves_a_process_that_took_a_recorded_pid_and_removes_the_scratch(tmp_path):
    paths = RunPaths(tmp_path / "run")
    spark_cluster.start(paths, workers=1, tied_to_caller=True)
    lookalike = None
    try:
        info = json.loads(paths.engine_cluster_info("spark").read_text())
        master, worker = info["daemons"]
        assert [d["pid"] for d in info["daemons"]] == info["pids"]
        assert all(d["start"] == process_start(d["pid"]) and d["uid"] == os.getuid() for d in info["daemons"])
        # Spark's temp folders: a fresh 0700 scratch folder of this user's, not a fixed name in /tmp
        scratch = Path(info["scratch"])
        mode = scratch.lstat().st_mode
        assert scratch.name.startswith(f"{PREFIX}spark-") and stat.S_ISDIR(mode) and mode & 0o777 == 0o700
        env = _environ(worker["pid"])
        assert env["SPARK_LOCAL_DIRS"] == env["TMPDIR"] == str(scratch)
        assert f"-Djava.io.tmpdir={scratch}" in env["JAVA_TOOL_OPTIONS"]  # every JVM it starts, executors too
        # the worker dies; a process that looks like one takes its place in the record (a reused pid)
        os.killpg(worker["pid"], signal.SIGKILL)
        psutil.Process(worker["pid"]).wait(30)
        lookalike = subprocess.Popen(LOOKALIKE, start_new_session=True)
        info["daemons"][1]["pid"] = info["pids"][1] = lookalike.pid  # the start recorded is the worker's
        paths.engine_cluster_info("spark").write_text(json.dumps(info))
        assert not spark_cluster.is_running(paths)  # not ours: the cluster has lost its worker
        assert spark_cluster.stop(paths) == [master["pid"]]
        assert lookalike.poll() is None, "the cluster's stop signalled a process it did not start"
        assert not psutil.pid_exists(master["pid"]) or psutil.Process(master["pid"]).status() == psutil.STATUS_ZOMBIE
        assert not scratch.exists() and not paths.engine_cluster_info("spark").exists()
    finally:
        if lookalike is not None:
            lookalike.kill()
            lookalike.wait()
        spark_cluster.stop(paths)


def test_torchdistributors_log_server_listens_on_the_drivers_address_only(capfd):
    from pyspark.ml.torch import distributor as torch_distributor
    from pyspark.ml.torch.log_communication import LogStreamingClient

    from pipelines.platforms.spark.distributor import bind_log_server_to_driver

    bind_log_server_to_driver()
    server = torch_distributor.LogStreamingServer()  # what TorchDistributor starts in barrier mode
    server.start(spark_host_address="127.0.0.1")  # spark.driver.host
    try:
        assert listening([os.getpid()])[os.getpid()] == {f"127.0.0.1:{server.port}"}
        others = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                  if a.family == socket.AF_INET and a.address != "127.0.0.1"}
        for address in others:  # this host's other interfaces: refused
            with pytest.raises(OSError):
                socket.create_connection((address, server.port), timeout=5).close()
        client = LogStreamingClient("127.0.0.1", server.port)  # a rank's task, streaming its output
        client.send("a line from rank 0")
        client.close()
        deadline = time.monotonic() + 10
        seen = ""
        while "a line from rank 0" not in seen and time.monotonic() < deadline:
            time.sleep(0.1)
            seen += capfd.readouterr().err  # the driver writes what it receives to its stderr
        assert "a line from rank 0" in seen
    finally:
        server.shutdown()
    assert not listening([os.getpid()]).get(os.getpid())
