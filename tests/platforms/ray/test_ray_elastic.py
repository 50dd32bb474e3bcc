"""Ray Train recovering a lost host by itself: an elastic worker group (``engines.ray.elastic_min_workers``).

With ``ScalingConfig(num_workers=(min, N))`` and ``FailureConfig(max_failures=matrix.platform_retries)``
(Ray Train V2, Ray 2.60), losing the cell's last host (a worker node, not the head) makes Ray Train
restart the worker group with the workers that still fit, from the last checkpoint reported to
``ray.train.report``; the shared loop resumes at the smaller world size (``pipelines.training.loop``)
and the cell trains to its end in the same attempt: no project retry. Losing hosts[0] (Ray's head:
its GCS, and the driver) is beyond Ray: the attempt fails and the project's retry recovers it. When
the lost host comes back (``fault=host_return``) its node joins again and Ray grows the group back.
These start Ray on two emulated hosts. CI runs the worker's loss (66 s alone on a quiet 2-core box): Ray's
host loss and its elastic recovery at once. The head's loss (the project's retry) and the return are heavy
(2-6 minutes each on two loaded cores); the settings' checks run in CI (seconds).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from pipelines.cluster import why_unavailable
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

_NO_NETNS = why_unavailable()


# --- the settings, without Ray ------------------------------------------------------------------------
def test_an_elastic_cell_asks_ray_for_min_to_n_workers_and_a_fixed_one_for_n(make_config):
    from pipelines.platforms.ray.trainer import FAST_NODE_DEATH, node_env, scaling_options

    def spec(config, workers):  # what scaling_options reads of a CellSpec
        return SimpleNamespace(config=config, world_size=workers)

    fixed = make_config(platform_retries=1)
    elastic = make_config(**{"platform_retries": 1, "engines.ray.elastic_min_workers": 1,
                             "engines.ray.elastic_resize_interval_s": 2.0})
    assert scaling_options(spec(fixed, 2)) == {"num_workers": 2}
    assert scaling_options(spec(elastic, 2)) == {"num_workers": (1, 2), "elastic_resize_monitor_interval_s": 2.0}
    assert node_env(fixed) == {} and node_env(elastic) == FAST_NODE_DEATH


def test_an_elastic_setting_that_cannot_work_is_refused_naming_the_fields(make_config):
    from pipelines.config import ConfigError
    from pipelines.run import preflight

    no_retries = make_config(**{"backends": ["ray"], "worker_counts": [2], "engines.ray.elastic_min_workers": 1})
    assert any("engines.ray.elastic_min_workers=1 needs matrix.platform_retries" in p
               for p in preflight.problems(no_retries)), preflight.problems(no_retries)
    too_big = make_config(**{"backends": ["ray"], "worker_counts": [1, 2], "platform_retries": 1,
                             "engines.ray.elastic_min_workers": 2})
    assert any("elastic_min_workers=2 is more than the [1] worker(s)" in p for p in preflight.problems(too_big))
    fine = make_config(**{"backends": ["ray"], "worker_counts": [2], "platform_retries": 1,
                          "engines.ray.elastic_min_workers": 1})
    assert not any("elastic" in p for p in preflight.problems(fine))
    with pytest.raises(ConfigError, match="elastic_min_workers"):
        make_config(**{"engines.ray.elastic_min_workers": 0})


def test_a_returning_host_gets_its_standing_node_back_but_never_a_second_head(make_config):
    from pipelines.platforms.ray.standing import node_command

    found = {"kind": "hosts", "token": "/tmp/x/auth", "argvs": {"h0": ["ray", "start", "--head"],
                                                               "h1": ["ray", "start", "--address=10.0.0.1:1"]}}
    config = make_config(**{"platform_retries": 1, "engines.ray.elastic_min_workers": 1})
    argv, env = node_command(found, config, "h1")
    assert argv == ["ray", "start", "--address=10.0.0.1:1"]
    assert env["RAY_AUTH_TOKEN_PATH"] == "/tmp/x/auth" and env["RAY_health_check_period_ms"] == "1000"
    assert node_command(found, config, "h0") is None  # the head: the cluster went with it
    assert node_command({"kind": "local", "argvs": {}}, config, "h1") is None


# --- real Ray on two emulated hosts (root) ------------------------------------------------------------
def _lose_a_host(tmp_path, make_config, imdb_dir, bert_tiny_dir, victim: str, **overrides):
    """The run's path (``stages.train_cell``, the run's standing Ray cluster on h0 and h1) of a 2-worker
    elastic cell that loses ``victim`` in the middle of epoch 2 of 3 of its first attempt."""
    from pipelines.cluster import lifecycle
    from pipelines.config import save_config
    from pipelines.run import stages
    from pipelines.runfolder.results import CellResult

    per_class = overrides.pop("train_per_class", 64)
    paths = write_token_shards(RunPaths(tmp_path / "runs" / "elastic"), imdb_dir, bert_tiny_dir,
                               train_per_class=per_class, test_per_class=16, seq_len=32, seed=6)
    config = make_config(**{"cluster.kind": "emulated", "networks": ["1gbit"], "backends": ["ray"],
                            "worker_counts": [2], "epochs": 3, "max_seq_len": 32, "batch_size": 16,
                            "fault": "host_loss", "fault_epoch": 2, "fault_victim": victim, "cell_retries": 1,
                            "platform_retries": 2, "recovery_deadline_s": 180,
                            "engines.ray.elastic_min_workers": 1, **overrides})
    save_config(config, paths.config)
    started = time.monotonic()
    with lifecycle.run_cluster(paths, config):
        stages.train_cell(str(paths.root), "ray", 2, network="1gbit")
    cell = paths.cell("ray", 2, 0, network="1gbit")
    return CellResult.read(cell.result), cell, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_ray_loses_a_worker_node_and_goes_on_with_one_worker_by_itself(tmp_path, make_config, imdb_dir,
                                                                        bert_tiny_dir, record_property):
    from pipelines.training import checkpoint as ckpt

    result, cell, took = _lose_a_host(tmp_path, make_config, imdb_dir, bert_tiny_dir, "worker")
    # Ray's own recovery of a lost host (its host-loss case in CI), after its standing cluster's cell trained across hosts
    record_property("also_checks", "host loss, across hosts")
    assert result.status == "ok" and len(result.epochs) == 3 and result.test is not None, result.error
    assert [a.outcome for a in result.attempts] == ["ok"], result.attempts  # no project retry
    fault = result.fault
    assert fault["host"] == "h1" and fault["recovered_by"] == "platform", fault
    assert fault["platform_outcome"] == "recovered" and fault["recovery_seconds"] > 0, fault
    # the worker group went from 2 workers to 1 and resumed from the checkpoint of epoch 1
    starts = [(e["epoch"], e["world_size"]) for e in ckpt.world_sizes(cell.root)]
    assert starts == [(0, 2), (1, 1)], starts
    assert cell.name.endswith("-w2-r0") and len(result.placements) == 1, result.placements  # the final group: h0's
    if "world_size_after_loss" in fault:  # the fault record's own account (pipelines.measure.faults)
        assert (fault["world_size_before"], fault["world_size_after_loss"]) == (2, 1), fault
    # the first group (2 workers) trained across both hosts: its gradients crossed h1's link both ways, each
    # way more than two all-reduces' worth of the model's fp32 parameters (measured: ~230 MB each way against
    # ~17.6 MB of parameters)
    from pipelines.training.model import build_model

    model_bytes = sum(p.numel() * 4 for p in build_model(str(bert_tiny_dir), seed=0, num_labels=2)[0].parameters())
    assert set(result.link_bytes) == {"h0", "h1"}, result.link_bytes
    assert min(result.link_bytes["h1"].values()) > 2 * model_bytes, (result.link_bytes, model_bytes)
    print(f"\nray elastic lost h1: trained again {fault['recovery_seconds']:.1f}s later at world size 1, "
          f"test accuracy {result.test.accuracy:.3f}, test took {took:.0f}s")


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_losing_rays_head_is_beyond_ray_and_the_projects_retry_recovers_it(tmp_path, make_config, imdb_dir,
                                                                           bert_tiny_dir):
    result, cell, took = _lose_a_host(tmp_path, make_config, imdb_dir, bert_tiny_dir, "coordinator")
    assert result.status == "ok" and len(result.epochs) == 3 and result.test is not None, result.error
    assert [a.outcome for a in result.attempts] == ["failed", "ok"], result.attempts
    fault = result.fault
    assert fault["host"] == "h0" and fault["recovered_by"] == "project", fault
    assert fault["resumed_from_epoch"] == 1, fault
    lost = result.attempts[0]
    assert "lost host h0" in lost.error and "did not recover by its own means" in lost.error, lost.error
    assert len(result.placements) == 2  # the retry: both hosts again
    print(f"\nray lost its head h0: the attempt failed, the project's retry recovered it in "
          f"{fault['recovery_seconds']:.1f}s; test took {took:.0f}s; error: {lost.error[:300]}")


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_ray_grows_back_to_two_workers_when_the_lost_node_returns(tmp_path, make_config, imdb_dir, bert_tiny_dir):
    """host_return: h1's ``ray start`` runs again 20 s after the loss (``hosts.offer_return``) and the
    cell ends on both hosts, in its first attempt. Timing seen here: the group of one trains again
    26-38 s after the loss, and Ray resizes 15-20 s after the node is up (its resources reach the
    elastic policy through Ray's autoscaling coordinator); at one worker an epoch of this data takes
    ~3 s, hence 16 epochs, so the cell is still training then. A group that has not reached its first
    step when the resize comes is replaced at once (world sizes [2, 2], else [2, 1, 2])."""
    from pipelines.training import checkpoint as ckpt

    result, cell, took = _lose_a_host(tmp_path, make_config, imdb_dir, bert_tiny_dir, "worker", train_per_class=256,
                                      fault="host_return", return_after_s=20, epochs=16, platform_retries=3,
                                      **{"engines.ray.elastic_resize_interval_s": 2.0})
    assert result.status == "ok" and len(result.epochs) == 16 and result.test is not None, result.error
    assert [a.outcome for a in result.attempts] == ["ok"], result.attempts  # no project retry
    sizes = [e["world_size"] for e in ckpt.world_sizes(cell.root)]  # each start of the workers
    assert sizes[0] == 2 and sizes[-1] == 2 and set(sizes) <= {1, 2}, sizes  # back to full size at the end
    fault = result.fault
    assert fault["recovered_by"] == "platform" and fault["restarted"], fault
    assert len(result.placements) == 2, result.placements  # the final group: both hosts again
    assert fault.get("grew_back", True) is True, fault
    print(f"\nray elastic, h1 back after 20 s: world sizes {sizes}, full size again "
          f"{fault.get('seconds_return_to_full_size')}s after the return; test took {took:.0f}s")
