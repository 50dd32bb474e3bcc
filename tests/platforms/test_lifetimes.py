"""Standing versus per-job clusters on this host (``pipelines.run.services``): a standing Ray cell
joins the run's Ray cluster, started once outside its window and kept for the next standing
cell; a per-job cell brings its own up inside the window (its ``provision`` phase); a cell of
another platform never runs beside a standing cluster. Across hosts: tests/platforms/ray/ and
tests/platforms/spark/ (test_*_across_hosts.py)."""

from __future__ import annotations

import json
import os

import pytest

from pipelines.cluster import netns
from pipelines.config import load_config, save_config
from pipelines.measure.listeners import LOOPBACK_ONLY_NAMESPACE
from pipelines.platforms.driver import RECORD
from pipelines.run import services
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

pytestmark = [pytest.mark.slow, pytest.mark.skipif(netns.run_problem() is not None,
                                                    reason="no run network namespace here (nsenter refused)")]


@pytest.fixture
def run(tmp_path, imdb_dir, bert_tiny_dir):
    config = load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
        output_root=str(tmp_path / "runs"), max_seq_len=32, epochs=1, batch_size=16, batch_policy="per_worker",
        backends=["ray", "ray_per_job", "ddp"], worker_counts=[2]))
    paths = write_token_shards(RunPaths(tmp_path / "runs" / "lifetimes"), imdb_dir, bert_tiny_dir,
                               train_per_class=32, test_per_class=16, seq_len=32, seed=3)
    save_config(config, paths.config)
    yield config, paths
    services.stop(paths)


def _cell(config, paths, backend, repeat=0):
    from pipelines.run.cells import run_cell

    return run_cell(config, paths, backend, 2, repeat,
                    before_window=lambda: services.before_cell(config, paths, backend))


def test_a_standing_cluster_is_started_once_outside_the_window_and_kept(run):
    from pipelines.platforms.ray.standing import STANDING_SERVICE as ray_standing

    config, paths = run
    first = _cell(config, paths, "ray", 0)
    assert first.status == "ok", first.error
    assert first.platform_mode == "local-standing" and "provision" not in first.phases
    assert ray_standing.running(paths)  # kept for the next standing cell
    second = _cell(config, paths, "ray", 1)
    assert second.status == "ok", second.error
    starts = services.read_record(paths)[ray_standing.name]
    assert len(starts) == 1 and starts[0]["provision_seconds"] > 0  # once, before the first window
    assert starts[0]["started"] + starts[0]["provision_seconds"] <= first.timed_window.start

    # the standing head, its workers and the cells' drivers in the run's loopback-only namespace
    run_namespace = netns.run_state(paths)
    assert run_namespace and json.loads(paths.cell("ray", 2, 0).root.joinpath(RECORD).read_text())["netns"] == (
        run_namespace["netns"])
    _all_in_loopback_only_namespaces(first, standing=("gcs_server", "raylet"))

    other = _cell(config, paths, "ddp")  # another platform: the standing cluster is stopped first
    assert other.status == "ok" and not ray_standing.running(paths)
    assert other.resources.run_processes_outside == {}, other.resources  # the namespace's idle holder is not one

    per_job = _cell(config, paths, "ray_per_job")
    assert per_job.status == "ok", per_job.error
    assert per_job.platform_mode == "local-cluster" and per_job.phases["provision"] > 0
    assert not ray_standing.running(paths) and len(services.read_record(paths)[ray_standing.name]) == 1
    from pipelines.training import phases

    assert abs(phases.unattributed(per_job.phases, per_job.total_seconds)) <= 0.02 * per_job.total_seconds
    assert json.loads(paths.cell("ray_per_job", 2, 0).provision.read_text())["seconds"] == pytest.approx(
        per_job.phases["provision"], abs=0.01)
    # the per-job cluster in the driver's namespace of its own, gone with the cell
    _all_in_loopback_only_namespaces(per_job, started=("gcs_server", "raylet"))
    own = json.loads(paths.cell("ray_per_job", 2, 0).root.joinpath(RECORD).read_text())["netns"]
    assert own not in (run_namespace["netns"], netns.of_process(os.getpid())) and not netns.members(own)
    services.stop(paths)
    assert not netns.running(paths) and not netns.members(run_namespace["netns"])


def _all_in_loopback_only_namespaces(result, standing=(), started=()) -> None:
    """Every port the cell's processes (and the standing cluster's) listened on was in a loopback-only
    network namespace; ``standing`` / ``started``: kinds that must have been seen (the check is not blind)."""
    usage = result.resources
    assert {"rank", "driver", *started} <= set(usage.listening) and set(standing) <= set(usage.standing_listening)
    seen = [a for found in (usage.listening, usage.standing_listening) for addresses in found.values() for a in addresses]
    assert all(a.endswith(LOOPBACK_ONLY_NAMESPACE) for a in seen), (usage.listening, usage.standing_listening)
