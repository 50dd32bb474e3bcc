"""pipelines.measure.resources against processes whose use is known; the cost; the report's section.

Each measured figure is checked against a child process (or an emulated host's cgroup) that
allocates and touches a known amount of memory or burns a known amount of CPU time (CPU time, not
wall time: the figures hold on a busy 2-core box). The cost formula, the report's "What each
platform costs" section and a timeline PNG come from synthetic results (tests/synthetic_results.py);
one real ddp cell shows what a local cell records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.measure import process_kinds, resources
from pipelines.cluster import EmulatedCluster, why_unavailable
from pipelines.evaluation import evaluate_run, resource_cost
from pipelines.report.costs import cell_results, costs_markdown, phase_marks, timeline_plots
from pipelines.runfolder.results import ResourceUsage
from tests.synthetic_results import make_result, write_synthetic_run

MB = 1024 * 1024
ALLOC_MB, CPU_S = 200, 2.0

# A child that marks itself as rank 0 (when told to), then holds ALLOC_MB of touched memory and
# burns CPU_S of CPU time; it imports nothing of the project, so its own baseline is a bare Python's.
CHILD = """
import os, sys, time
cell, rank = sys.argv[1], sys.argv[2]
alloc_mb, cpu_s, hold_s = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
if rank != "-":
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    os.makedirs(os.path.join(cell, "ranks"), exist_ok=True)
    open(os.path.join(cell, "ranks", f"rank-{rank}.pid"), "w").write(f"{os.getpid()} {boot}")
block = b"\\x01" * (alloc_mb * 1024 * 1024)  # written, so resident
start = time.process_time()  # its CPU so far: Python's start and the memset
open(os.path.join(cell, f"baseline-{os.getpid()}"), "w").write(f"{base} {start}")
while time.process_time() - start < cpu_s:
    pass
time.sleep(hold_s)  # a few samples after the burn: the CPU figure is complete before it exits
"""


def _child(cell: Path, rank: str, alloc_mb: int, cpu_s: float, hold_s: float = 1.0, run=subprocess.Popen):
    return run([sys.executable, "-c", CHILD, str(cell), rank, str(alloc_mb), str(cpu_s), str(hold_s)])


def _baseline(cell: Path, pid: int) -> tuple[float, float]:
    """(RSS MB before its allocation, CPU seconds before its burn) the child saw of itself."""
    rss, cpu = (cell / f"baseline-{pid}").read_text().split()
    return int(rss) / MB, float(cpu)


def test_known_memory_and_cpu_of_a_rank_and_the_platform(tmp_path):
    with resources.sample(tmp_path, interval_s=0.2) as sampler:
        rank = _child(tmp_path, "0", ALLOC_MB, CPU_S)
        other = _child(tmp_path, "-", 50, 0.0, hold_s=2.0)  # not a rank: the platform's
        assert rank.wait(timeout=120) == 0 and other.wait(timeout=120) == 0
    usage = sampler.usage()
    assert usage is not None and usage.ranks == 1 and usage.samples >= 5
    base_mb, before_s = _baseline(tmp_path, rank.pid)
    assert abs(usage.ranks_peak_rss_mb - (ALLOC_MB + base_mb)) <= 0.1 * ALLOC_MB, usage.ranks_peak_rss_mb
    assert usage.ranks_cpu_seconds == pytest.approx(before_s + CPU_S, abs=0.1)
    # the platform: the other child (50 MB) and this process, the driver; the sampler's CPU is left out
    assert usage.platform_processes["python"] == pytest.approx(50 + _baseline(tmp_path, other.pid)[0], abs=8)
    assert usage.platform_processes["driver"] > 10
    assert usage.platform_peak_rss_mb >= usage.platform_processes["python"]
    assert usage.cpu_seconds == pytest.approx(usage.ranks_cpu_seconds + usage.platform_cpu_seconds)
    assert 0 <= usage.platform_cpu_seconds < 1.0 and usage.sampler_cpu_seconds > 0
    assert usage.peak_rss_mb >= usage.ranks_peak_rss_mb + 50
    assert usage.cpus >= 1 and usage.cpu_utilisation == pytest.approx(
        usage.cpu_seconds / (usage.wall_seconds * usage.cpus))
    assert usage.bytes_sent is None  # the cell shares this machine's network namespace: not its own
    timeline = resources.read_timeline(tmp_path)
    assert len(timeline) == usage.samples
    assert max(r["ranks_rss_mb"] for r in timeline) == pytest.approx(usage.ranks_peak_rss_mb)
    integral = sum(r["ranks_cpu_percent"] / 100 * (r["t"] - p["t"]) for p, r in zip(timeline, timeline[1:]))
    assert integral == pytest.approx(usage.ranks_cpu_seconds, rel=0.02)  # the timeline holds the same CPU
    assert json.loads((tmp_path / "resources.json").read_text())["usage"]["ranks"] == 1


def test_a_process_that_exits_between_samples_keeps_its_last_cpu(tmp_path):
    with resources.sample(tmp_path, interval_s=0.2) as sampler:
        child = _child(tmp_path, "0", 1, 1.0, hold_s=0.0)  # exits right after its burn
        assert child.wait(timeout=120) == 0
    known = _baseline(tmp_path, child.pid)[1] + 1.0
    assert known - 0.25 <= sampler.usage().ranks_cpu_seconds <= known + 0.05  # all but its last interval


def test_what_ran_under_the_driver_before_the_cell_is_not_the_cells(tmp_path):
    earlier = _child(tmp_path, "-", 80, 0.0, hold_s=30.0)  # e.g. a session left from an earlier cell
    try:
        while not (tmp_path / f"baseline-{earlier.pid}").exists():
            time.sleep(0.05)
        with resources.sample(tmp_path, interval_s=0.2) as sampler:
            assert _child(tmp_path, "0", 20, 0.2, hold_s=0.5).wait(timeout=120) == 0
        assert "python" not in sampler.usage().platform_processes
        assert sampler.usage().ranks == 1
    finally:
        earlier.kill()
        earlier.wait()


def test_daemons_and_their_children_are_the_platforms(tmp_path):
    daemon = _child(tmp_path, "-", 60, 0.0, hold_s=30.0)  # started before, not under the sampler's root
    try:
        with resources.sample(tmp_path, daemons=[daemon.pid], interval_s=0.2) as sampler:
            subprocess.run(["sleep", "0.6"], check=True)
        kinds = sampler.usage().platform_processes
        assert kinds["python"] >= 60
    finally:
        daemon.kill()
        daemon.wait()


@pytest.mark.parametrize("name, cmdline, kind", [
    ("java", ["/usr/bin/java", "-cp", "x", "org.apache.spark.deploy.worker.Worker"], "java_worker"),
    ("java", ["java", "org.apache.spark.executor.CoarseGrainedExecutorBackend", "--app-id"], "java_executor"),
    ("java", ["java", "-cp", "x", "org.apache.spark.deploy.master.Master"], "java_master"),
    ("java", ["java", "org.apache.spark.deploy.SparkSubmit", "pyspark-shell"], "java"),
    ("raylet", [".../ray/core/src/ray/raylet/raylet", "--gcs-address=x"], "raylet"),
    ("gcs_server", [".../ray/core/src/ray/gcs/gcs_server", "--raylet_config_list=x"], "gcs_server"),
    ("ray::IDLE", ["ray::IDLE"], "ray_worker"),
    ("python", ["python", ".../site-packages/ray/dashboard/dashboard.py"], "ray_other"),
    ("python", ["python", ".venv/bin/torchrun", "--nproc-per-node=2", "-m", "pipelines.x"], "torchrun"),
    ("python3", ["python3", "-m", "pyspark.daemon"], "pyspark_worker"),
    ("python", ["python", "-c", "pass"], "python"),
    ("sleep", ["sleep", "1"], "sleep"),
])
def test_process_kind(name, cmdline, kind):
    assert process_kinds.process_kind(name, cmdline) == kind


def test_rank_pid_files_are_this_machines_only(tmp_path):
    process_kinds.write_rank_pid(tmp_path, 0)
    (tmp_path / "ranks" / "rank-1.pid").write_text("4242 another-machines-boot-id")
    assert process_kinds.rank_pids(tmp_path) == {os.getpid()}
    process_kinds.write_rank_pid(tmp_path / "missing" / "\0bad", 3)  # never raises


def test_the_sampler_never_fails_the_cell(tmp_path):
    class BrokenHost:
        name, cgroups = "h9", ["/nonexistent/cgroup"]

        def link_bytes(self):
            raise OSError("gone")

    with resources.sample(tmp_path, hosts=[BrokenHost()], interval_s=0.1) as sampler:
        pass
    usage = sampler.usage()
    assert usage.per_host["h9"].source == "none" and usage.per_host["h9"].bytes_sent is None
    assert any("link counters unreadable" in n for n in usage.notes)


_NO_NETNS = why_unavailable()


@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_emulated_hosts_are_measured_by_their_cgroups(tmp_path):
    with EmulatedCluster("rsrc", hosts=2, network="unshaped") as cluster:
        h0, h1 = cluster.hosts
        with resources.sample(tmp_path, hosts=cluster.hosts, interval_s=0.25) as sampler:
            memory = _child(tmp_path, "-", 150, 0.0, hold_s=1.5, run=h0.run)
            burner = _child(tmp_path, "0", 1, 1.5, hold_s=0.5, run=h1.run)
            assert memory.wait(timeout=120) == 0 and burner.wait(timeout=120) == 0
    usage = sampler.usage()
    first, second = usage.per_host["h0"], usage.per_host["h1"]
    assert first.source == second.source == "cgroup" and first.cpus == second.cpus == 1
    assert 150 <= first.peak_memory_mb <= 150 * 1.1 + 10  # memory.max_usage_in_bytes, reset at the start
    assert second.cpu_seconds == pytest.approx(1.5, abs=0.2)  # cpuacct.usage
    assert second.ranks_cpu_seconds == pytest.approx(1.5, abs=0.2) and usage.ranks == 1
    assert first.platform_processes["python"] >= 150 and first.ranks_peak_rss_mb == 0
    assert first.bytes_sent is not None and usage.bytes_sent == first.bytes_sent + second.bytes_sent
    assert usage.cpus == 2 and usage.source == "hosts" and usage.per_host["driver"].source == "proc"
    assert usage.peak_rss_mb == pytest.approx(sum(h.peak_memory_mb for h in usage.per_host.values()), abs=0.1)


def test_the_cost_is_priced_from_the_price_sheet(make_config):
    config = make_config()
    tracking = config.tracking
    usage = ResourceUsage(started=0.0, wall_seconds=3600.0, interval_s=0.5, samples=1, cpus=4,
                          cpu_seconds=100.0, peak_rss_mb=2048.0)
    result = make_result("ddp", 2).model_copy(update={"resources": usage, "total_seconds": 1800.0,
                                                       "devices": ["cuda:0", "cuda:1"]})
    t = tracking
    per_hour = 4 * t.price_per_cpu_hour + 2 * t.price_per_gb_hour + 2 * t.price_per_gpu_hour
    expected = 0.5 * per_hour  # 1800 s wall, 4 CPUs, 2048 MB = 2 GB at the peak, 2 GPUs
    assert resource_cost(result, tracking) == pytest.approx(expected)
    assert (tracking.price_per_cpu_hour, tracking.price_per_gb_hour, tracking.price_per_gpu_hour) == (
        0.031611, 0.004237, 2.933908)  # the documented defaults
    assert resource_cost(make_result("ddp", 2), tracking) is None  # nothing measured: no cost


def test_the_summary_and_the_report_show_what_each_platform_costs(make_config, tmp_path):
    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2], repeats=1)
    paths, results = write_synthetic_run(config, resources=True)
    results["spark-w2-r0"].resources.platform_processes["evil|`[x](javascript:alert(1))`"] = 1.0
    results["spark-w2-r0"].write(paths.cell("spark", 2, 0).result)
    summary = evaluate_run(config, paths)
    row = next(c for c in summary.cells if c.cell == "ddp-w2-r0")
    assert row.cost == pytest.approx(resource_cost(results["ddp-w2-r0"], config.tracking))
    assert row.peak_rss_mb == results["ddp-w2-r0"].resources.peak_rss_mb and row.cpu_seconds > 0
    assert summary.cost_total == pytest.approx(sum(c.cost for c in summary.cells))
    assert next(a for a in summary.aggregates if a.key == "spark-w2").cost == pytest.approx(
        resource_cost(results["spark-w2-r0"], config.tracking))
    assert summary.price_sheet.per_cpu_hour == config.tracking.price_per_cpu_hour

    by_cell = cell_results(config, paths)
    plots = timeline_plots(by_cell, paths.cells, paths.report)
    assert len(plots) == 4 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    text = costs_markdown(summary, by_cell, paths.report)
    assert text.startswith("## What each platform costs")
    assert "Google Cloud Compute Engine" in text and "provisioned CPUs x wall hours" in text
    for name in by_cell:
        assert f"| {name} |" in text and f"![timeline {name}](timeline-{name}.png)" in text
    assert "java 520" in text and "torchrun 95" in text  # the platform's footprint, by process
    assert "javascript:alert" in text and "evil|" not in text and "`[x]" not in text  # escaped
    first_step, work_end = phase_marks(by_cell["ddp-w1-r0"])
    assert first_step == (pytest.approx(results["ddp-w1-r0"].startup_seconds), "first step")
    assert work_end[1] == "teardown"


@pytest.mark.slow
def test_a_real_local_ddp_cell_records_its_resources(make_config, imdb_dir, bert_tiny_dir, tmp_path):
    """A real cell (torchrun, 2 ranks, in its private network namespace) on a small slice."""
    from pipelines.run.cells import run_cell
    from pipelines.runfolder.paths import RunPaths
    from tests.token_shards import write_token_shards

    config = make_config(max_seq_len=32, epochs=1, batch_size=16, batch_policy="per_worker")
    paths = write_token_shards(RunPaths(Path(config.tracking.output_root) / "real"), imdb_dir, bert_tiny_dir,
                               train_per_class=32, test_per_class=16, seq_len=32, seed=7)
    result = run_cell(config, paths, "ddp", 2, 0)
    usage = result.resources
    assert usage is not None and usage.ranks == 2, usage
    assert usage.ranks_cpu_seconds > 1.0 and usage.ranks_peak_rss_mb > 2 * 100  # torch + bert-tiny, each
    assert {"driver", "torchrun"} <= set(usage.platform_processes)
    assert usage.cpu_seconds == pytest.approx(usage.ranks_cpu_seconds + usage.platform_cpu_seconds)
    assert usage.peak_rss_mb >= usage.ranks_peak_rss_mb
    cell = paths.cell("ddp", 2, 0)
    assert len(resources.read_timeline(cell.root)) == usage.samples
    print("real ddp-w2 cell:", usage.model_dump_json(exclude={"per_host"}))


def test_mlflow_and_tensorboard_get_the_figures_and_the_timeline(make_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pipelines.measure.tensorboard import write_events
    from pipelines.tracking.runs import client_for, ensure_cell_run
    from pipelines.tracking.cells import log_cell_result

    config = make_config(backends=["spark"], worker_counts=[2], mlflow_tracking_uri=f"sqlite:///{tmp_path}/m.db")
    paths, results = write_synthetic_run(config, resources=True)
    cell, result = paths.cell("spark", 2, 0), results["spark-w2-r0"]
    timeline = resources.read_timeline(cell.root)
    client = client_for(config)
    run_id = ensure_cell_run(client, config, paths, "spark", 2, 0)
    log_cell_result(client, run_id, cell)
    metrics = client.get_run(run_id).data.metrics
    assert metrics["resources.cpu_seconds"] == pytest.approx(result.resources.cpu_seconds)
    assert metrics["resources.platform_processes.java_peak_rss_mb"] == 520.0
    history = client.get_metric_history(run_id, "resources.ranks_cpu_percent")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(len(timeline)))
    assert "resources.json" in {a.path.split("/")[-1] for a in client.list_artifacts(run_id, "result")}

    write_events(result, cell)
    events = EventAccumulator(str(cell.tensorboard))
    events.Reload()
    series = [(s.step, s.value) for s in events.Scalars("resources/platform_rss_mb")]
    assert series == [(i, pytest.approx(row["platform_rss_mb"])) for i, row in enumerate(timeline)]
    assert events.Scalars("resources/peak_rss_mb")[0].value == pytest.approx(result.resources.peak_rss_mb)


def _kinds_under_this_process() -> dict[str, int]:
    """Kind -> count of the live processes started under this one, as the sampler names them."""
    from pipelines.measure.outside import is_infrastructure
    from pipelines.measure.process_kinds import _kind_of, _proc_table

    table, ours, out = _proc_table(), {os.getpid()}, {}
    for pid in sorted(table, key=lambda p: table[p][3]):  # parents start before their children
        if table[pid][0] in ours:
            ours.add(pid)
            if not is_infrastructure(pid):
                kind = _kind_of(pid, table[pid][1])
                out[kind] = out.get(kind, 0) + 1
                try:
                    print("already under this process:", pid, kind, Path(f"/proc/{pid}/cmdline").read_bytes()[:200])
                except OSError:
                    pass
    return out


@pytest.mark.slow
def test_a_process_of_the_run_left_beside_a_cell_is_named(tmp_path, imdb_dir, bert_tiny_dir, make_config):
    """The check is not blind: a process started under the driver before the cell, alive through
    it (as the data stage's JVM was), is reported by kind; the cell's own processes are not."""
    from pipelines.config import save_config
    from pipelines.run.cells import run_cell
    from pipelines.runfolder.paths import RunPaths
    from tests.token_shards import write_token_shards

    config = make_config(backends=["ddp"], worker_counts=[1], epochs=1, max_seq_len=32)
    paths = write_token_shards(RunPaths(Path(config.tracking.output_root) / "outside"), imdb_dir, bert_tiny_dir,
                               train_per_class=24, test_per_class=12, seq_len=32, seed=5)
    save_config(config, paths.config)
    # what earlier tests left under this pytest process (a multiprocessing resource tracker, ...)
    # is beside the cell too: the planted leftover must come on top of it
    already = _kinds_under_this_process()
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        result = run_cell(config, paths, "ddp", 1, 0)
    finally:
        leftover.kill()
        leftover.wait()
    usage = result.resources
    expected = dict(already, python=already.get("python", 0) + 1)
    assert result.status == "ok" and usage.run_processes_outside == expected, (usage, already)
    assert usage.outside_cpu_seconds is not None and 0 <= usage.outside_cpu_share <= 1


def test_the_report_flags_a_cell_with_the_run_or_the_host_busy_beside_it():
    from pipelines.report.costs import beside_lines

    def usage(**kw):
        return ResourceUsage(started=0.0, wall_seconds=10.0, interval_s=0.5, samples=20, cpu_seconds=15.0,
                             peak_rss_mb=800.0, **kw)

    results = {"ddp-w2-r0": make_result("ddp", 2, 0).model_copy(update={"resources": usage(outside_cpu_share=0.01)}),
               "spark-w2-r0": make_result("spark", 2, 0).model_copy(update={"resources": usage(
                   run_processes_outside={"java": 1}, outside_cpu_share=0.25)})}
    text = "\n".join(beside_lines(results))
    assert "**spark-w2-r0**: the run's processes beside it: java x1; outside CPU 25.0% of the host's cores" in text
    assert "ddp-w2-r0" not in text and "1.0% to 25.0%" in text
    results.pop("spark-w2-r0")
    assert beside_lines(results)[-1] == "No cell flagged."


def test_pythons_multiprocessing_helpers_are_not_counted_beside_a_cell():
    """A pool's resource tracker outlives the pool under the driver, asleep: it is the machine's,
    not a process of the run that competes with the cell (an earlier test's left one in CI)."""
    from multiprocessing import resource_tracker

    from pipelines.measure.outside import is_infrastructure

    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid
    assert tracker is not None and process_kinds._proc_table()[tracker][0] == os.getpid()
    assert is_infrastructure(tracker)
    assert not is_infrastructure(os.getpid())
