"""What it takes to run each platform: the measures behind the report's section (real processes,
this environment's installed distributions) and the evidence each platform names for a feature."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import time

import pytest

from pipelines import platforms
from pipelines.measure import footprint
from pipelines.measure.listeners import LOOPBACK_ONLY_NAMESPACE, is_loopback, listening
from pipelines.measure.resources import sample
from pipelines.report.what_it_takes import what_it_takes_markdown
from pipelines.runfolder.paths import PROJECT_ROOT
from pipelines.runfolder.summary import PlatformNeeds, RunSummary

LISTENER = ("import socket, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(30)\n")


def _listen():
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def test_every_feature_names_a_test_that_exists():
    """No feature without a test behind it: each evidence is tests/<file>.py::<function> that exists."""
    named = 0
    for platform in platforms.all_platforms():
        for feature, (what, test) in platform.features.items():
            path, _, name = test.partition("::")
            file = PROJECT_ROOT / path
            assert what and file.is_file(), (platform.name, feature, test)
            functions = {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)}
            assert name in functions, f"{platform.name} / {feature}: {test} names no test"
            named += 1
    assert named >= 5


def test_an_unknown_feature_is_refused():
    with pytest.raises(ValueError, match="unknown feature"):
        platforms.Platform(name="x", adapter="m:C", features={"telepathy": ("", "")})


def test_the_ports_a_process_listens_on_are_read_from_proc():
    proc, port = _listen()
    try:
        found = listening([proc.pid])
        assert found == {proc.pid: {f"127.0.0.1:{port}"}} and is_loopback(f"127.0.0.1:{port}")
        assert listening([proc.pid + 10_000_000]) == {}  # no such process: nothing, no error
    finally:
        proc.kill()
        proc.wait()
    assert not is_loopback("0.0.0.0:80") and is_loopback("::1:80")


def test_a_jvms_ipv4_bind_on_its_ipv6_socket_reads_as_that_address():
    """Spark's JVMs bind 127.0.0.1 on IPv6 sockets: the kernel lists ::ffff:127.0.0.1, which is loopback
    (it was counted as beyond loopback when shown as 0000:...:ffff:7f00:0001)."""
    code = ("import socket, time; s = socket.socket(socket.AF_INET6); s.bind(('::ffff:127.0.0.1', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        assert listening([proc.pid]) == {proc.pid: {f"::ffff:127.0.0.1:{port}"}} and is_loopback(f"::ffff:127.0.0.1:{port}")
    finally:
        proc.kill()
        proc.wait()
    assert not is_loopback("::ffff:10.0.2.2:80") and not is_loopback(":::80")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare --net")
def test_a_listener_in_a_loopback_only_namespace_is_counted_as_loopback():
    """A cell's private namespace (torchrun.isolated) has only lo: its wildcard listener is reachable
    from nowhere else, and says so; the same bind beside us is beyond loopback."""
    code = "import socket,time; s=socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); time.sleep(30)"
    inside = subprocess.Popen(["unshare", "--net", "--", "/bin/sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                               sys.executable, "-c", code])
    beside = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while len(found := listening([inside.pid, beside.pid])) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        (private,), (shared,) = found[inside.pid], found[beside.pid]
        assert private.startswith("0.0.0.0:") and private.endswith(LOOPBACK_ONLY_NAMESPACE) and is_loopback(private)
        assert shared.startswith("0.0.0.0:") and not is_loopback(shared)
    finally:
        for proc in (inside, beside):
            proc.kill()
            proc.wait()


def test_the_sampler_counts_the_processes_started_in_the_window_and_their_ports(tmp_path):
    """A process alive before the window (a standing cluster's, given as a daemon) is counted apart
    from one the cell starts; each with the port it listens on."""
    standing, standing_port = _listen()
    try:
        with sample(tmp_path, daemons=[standing.pid], interval_s=0.1) as sampler:
            started, port = _listen()
            time.sleep(1.0)  # several samples: listeners are read every fourth
            started.kill()
            started.wait()
        usage = sampler.usage()
    finally:
        standing.kill()
        standing.wait()
    assert usage.processes_started.get("python") == 1 and usage.processes_standing.get("python") == 1, usage
    assert usage.listening == {"python": [f"127.0.0.1:{port}"]}
    assert usage.standing_listening == {"python": [f"127.0.0.1:{standing_port}"]}


def test_the_install_footprint_is_the_closure_beyond_torch_and_transformers():
    spark, ddp = platforms.get("spark"), platforms.get("ddp")
    assert footprint.install_added(ddp) == (0, [])  # the base every platform trains with
    mb, sizes = footprint.install_added(spark)
    names = [n for n, _ in sizes]
    assert "pyspark" in names and "py4j" in names and "torch" not in names
    assert mb == pytest.approx(sum(m for _, m in sizes), abs=0.1) and sizes[0][0] == "pyspark" and mb > 100
    # the JDK beside it, found through the java on PATH
    home, jdk_mb = footprint.program_install("java")
    assert (PROJECT_ROOT / home).is_absolute() and jdk_mb > 50
    assert footprint.cluster_settings(platforms.get("spark_dataframe")) == ["engines.spark.master"]


def test_code_lines_leave_out_blanks_and_comments(tmp_path):
    (tmp_path / "a.py").write_text('"""doc"""\n\n# a comment\nx = 1  # counted\n    \ny = 2\n')
    assert footprint.code_lines(tmp_path) == 3


def test_the_section_says_what_each_figure_is(tmp_path):
    needs = [PlatformNeeds(platform="ray", label="Ray Train", lifetime="standing", install_mb=234.3,
                           install_distributions=3, install_largest="ray 225 MB", measured_cell="ray-w2-r0",
                           processes_per_cell="rank 2, ray_worker 3", processes_per_run="raylet 1, gcs_server 1",
                           ports_per_cell=4, ports_per_cell_beyond_loopback=0, ports_per_run=9,
                           ports_per_run_beyond_loopback=0, cluster_config="engines.ray.address", package_lines=808,
                           features="scheduler, fault tolerance")]
    summary = RunSummary(run="r", profile="p", status="success", target_accuracy=0.8, price_per_worker_hour=0.0,
                         what_it_takes=needs)
    text = what_it_takes_markdown(summary)
    assert text.startswith("## What it takes to run each platform")
    assert "| Ray Train | standing | 234 (ray 225 MB) |" in text and "| 4 (0) | 9 (0) | engines.ray.address | 808 |" in text
    assert "test_ray_cell_killed_after_epoch_1_resumes_from_rays_checkpoint" in text  # the evidence
    assert "From the cell with the most workers: Ray Train: ray-w2-r0." in text
    assert what_it_takes_markdown(summary.model_copy(update={"what_it_takes": []})) == ""
