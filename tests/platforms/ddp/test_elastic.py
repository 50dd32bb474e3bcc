"""Faults the platform handles itself: elastic torchrun (``engines.ddp.elastic``) across two
emulated hosts, by the run's own path (``stages.train_cell`` on the run's emulated cluster).

- The worker host (h1) is lost in epoch 2 of 3: the agent on h0 restarts its worker at world size 1
  from the checkpoint of epoch 1 and trains to the end; no project retry (CI).
- The coordinator host (h0, which holds torchrun's c10d store) is lost: h1's agent cannot
  re-rendezvous, the attempt fails, the project's retry recovers (heavy).
- ``fault=host_return``: h1 comes back 20 s after the loss and its torchrun is started again; the
  agents re-rendezvous and the cell grows back to world size 2 (heavy).
"""

from __future__ import annotations

import time

import pytest

from pipelines.cluster import why_unavailable
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

_NO_NETNS = why_unavailable()


def _elastic_cell(tmp_path, make_config, imdb_dir, bert_tiny_dir, *, per_class: int, seq: int, epochs: int,
                  **settings):
    """Train one elastic ddp cell of 2 workers on 2 emulated hosts; -> (result, cell, seconds)."""
    from pipelines.cluster import lifecycle
    from pipelines.config import save_config
    from pipelines.run import stages
    from pipelines.runfolder.results import CellResult

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "elastic"), imdb_dir, bert_tiny_dir,
                               train_per_class=per_class, test_per_class=16, seq_len=seq, seed=6)
    config = make_config(**{"cluster.kind": "emulated", "networks": ["unshaped"], "backends": ["ddp"],
                            "worker_counts": [2], "epochs": epochs, "max_seq_len": seq, "batch_size": 16,
                            "fault_epoch": 2, "cell_retries": 1, "platform_retries": 1,
                            "recovery_deadline_s": 90, "engines.ddp.elastic": True, **settings})
    save_config(config, paths.config)
    started = time.monotonic()
    with lifecycle.run_cluster(paths, config) as state:
        stages.train_cell(str(paths.root), "ddp", 2, network="unshaped")
        on_hosts = {h.name: h.pids() for h in lifecycle.attach(state).hosts}
    cell = paths.cell("ddp", 2, 0, network="unshaped")
    assert on_hosts == {"h0": [], "h1": []}, on_hosts  # nothing left, the returned agent included
    return CellResult.read(cell.result), cell, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_elastic_torchrun_goes_on_without_a_lost_worker_host(tmp_path, make_config, imdb_dir, bert_tiny_dir):
    result, cell, took = _elastic_cell(tmp_path, make_config, imdb_dir, bert_tiny_dir, per_class=96, seq=32,
                                       epochs=3, fault="host_loss")
    fault = result.fault
    assert result.status == "ok" and len(result.epochs) == 3, result.error
    assert [a.outcome for a in result.attempts] == ["ok"]  # no project retry
    assert fault["recovered_by"] == "platform" and fault["platform_action"] == "shrank", fault
    assert fault["host"] == "h1" and fault["victim"] == "worker" and fault["epoch"] == 2
    assert (fault["world_size_before"], fault["world_size_after_loss"]) == (2, 1), fault
    # the loss is injected half-way through epoch 2; on a loaded machine the kill can land after that
    # epoch's checkpoint (an epoch here is ~1 s): the survivor then resumes from epoch 2, not 1
    assert fault["resumed_from_epoch"] in (1, 2), fault
    assert fault["world_sizes"] == [[0, 2], [fault["resumed_from_epoch"], 1]], fault
    assert 0 < fault["recovery_seconds"] < fault["deadline_s"]
    assert result.platform_mode == "torchrun-elastic-2-nodes"
    assert result.test is not None and 0.0 <= result.test.accuracy <= 1.0
    print(f"\nelastic ddp lost h1: training again at world size 1 {fault['recovery_seconds']:.1f}s later, "
          f"lost {fault['lost_seconds']:.1f}s, accuracy {result.test.accuracy:.3f}, test took {took:.0f}s")


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_losing_the_rendezvous_host_fails_and_the_projects_retry_recovers(tmp_path, make_config, imdb_dir,
                                                                          bert_tiny_dir):
    result, cell, took = _elastic_cell(tmp_path, make_config, imdb_dir, bert_tiny_dir, per_class=48, seq=32,
                                       epochs=3, fault="host_loss", fault_victim="coordinator")
    fault = result.fault
    assert result.status == "ok" and len(result.epochs) == 3, result.error
    assert [a.outcome for a in result.attempts] == ["failed", "ok"]
    assert fault["host"] == "h0" and fault["victim"] == "coordinator" and fault["recovered_by"] == "project", fault
    # as above: on a loaded machine the kill can land after epoch 2's checkpoint (measured once in the heavy
    # tier of 2026-12-06, beside other tests: resumed from epoch 2)
    assert fault["platform_outcome"] == "failed" and fault["resumed_from_epoch"] in (1, 2), fault
    assert fault["world_size_before"] == 2 and fault["world_size_after_loss"] == 2  # the retry: both hosts
    print(f"\nelastic ddp lost h0 (its rendezvous store): {fault['platform_error'][:200]}; project retry, "
          f"training again {fault['recovery_seconds']:.1f}s later; test took {took:.0f}s")


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_a_returned_host_is_taken_back_in_and_the_cell_grows_back(tmp_path, make_config, imdb_dir, bert_tiny_dir):
    result, cell, took = _elastic_cell(tmp_path, make_config, imdb_dir, bert_tiny_dir, per_class=500, seq=64,
                                       epochs=4, fault="host_return", return_after_s=20)
    fault = result.fault
    assert result.status == "ok" and len(result.epochs) == 4, result.error
    assert [a.outcome for a in result.attempts] == ["ok"]
    assert fault["kind"] == "host_return" and fault["recovered_by"] == "platform", fault
    assert (fault["world_size_before"], fault["world_size_after_loss"], fault["world_size_after_return"]) == (2, 1, 2)
    assert fault["grew_back"] is True and fault["seconds_return_to_full_size"] > 0
    assert fault["restarted"] and fault["not_restarted"] is None
    print(f"\nelastic ddp: 2 -> 1 ({fault['recovery_seconds']:.1f}s after the loss) -> 2 "
          f"({fault['seconds_return_to_full_size']:.1f}s after the return); lost {fault['lost_seconds']:.1f}s; "
          f"accuracy {result.test.accuracy:.3f}; test took {took:.0f}s")
