"""When the emulated cluster's keeper dies, the remaining cells fail at once with its cause, instead
of each burning its retries on "not running" (``lifecycle.ClusterGone``)."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from pipelines.cluster import why_unavailable
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

_NO_NETNS = why_unavailable()


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_a_dead_keeper_fails_the_remaining_cells_at_once_with_its_cause(tmp_path, make_config, imdb_dir,
                                                                       bert_tiny_dir, caplog, monkeypatch):
    from pipelines.cluster import lifecycle
    from pipelines.config import save_config
    from pipelines.run import stages

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "gone"), imdb_dir, bert_tiny_dir, train_per_class=8,
                               test_per_class=4, seq_len=32, seed=6)
    config = make_config(**{"cluster.kind": "emulated", "networks": ["1gbit"], "backends": ["ddp", "determined"],
                            "worker_counts": [1, 2], "epochs": 1, "max_seq_len": 32, "cell_retries": 2})
    save_config(config, paths.config)
    monkeypatch.setattr(stages, "RETRY_DELAY_S", 120.0)  # a retry would show as two minutes' wait
    state = lifecycle.start(paths, config)
    try:
        os.kill(state["keeper_pid"], signal.SIGKILL)
        psutil.Process(state["keeper_pid"]).wait(10)
        started = time.monotonic()
        failed = stages.train_cells(str(paths.root))
        took = time.monotonic() - started
    finally:
        swept = lifecycle.stop(paths)  # what the SIGKILLed keeper left: swept
    assert len(failed) == 4 and took < stages.RETRY_DELAY_S, (failed, took)  # no retry, no try after the first
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "its keeper (pid" in messages and "is not running: the hosts went with it" in messages, messages[-2000:]
    assert "3 cell(s) not tried" in messages
    assert "retry 1 of 2" not in messages
    assert isinstance(swept, list)
