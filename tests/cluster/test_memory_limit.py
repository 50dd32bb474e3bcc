"""A rank killed by its emulated host's memory limit (``cluster.memory_mb_per_host``) is reported as
such, with the setting to change, not as a generic failure (``pipelines.measure.counters``)."""

from __future__ import annotations

import pytest

from pipelines.cluster import why_unavailable
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

_NO_NETNS = why_unavailable()


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_a_rank_killed_by_its_hosts_memory_limit_is_reported_as_such(tmp_path, make_config, imdb_dir,
                                                                    bert_tiny_dir):
    """256 MB per host: torchrun's agent and a rank importing torch and transformers do not fit, the
    kernel's OOM killer ends one in the host's memory cgroup; the attempt's error says so."""
    from pipelines.cluster import lifecycle
    from pipelines.config import save_config
    from pipelines.run import stages
    from pipelines.runfolder.results import CellResult

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "oom"), imdb_dir, bert_tiny_dir, train_per_class=16,
                               test_per_class=8, seq_len=32, seed=6)
    config = make_config(**{"cluster.kind": "emulated", "cluster.memory_mb_per_host": 256, "networks": ["1gbit"],
                            "backends": ["ddp"], "worker_counts": [2], "epochs": 1, "max_seq_len": 32,
                            "cell_retries": 0})
    save_config(config, paths.config)
    with lifecycle.run_cluster(paths, config):
        with pytest.raises(Exception):
            stages.train_cell(str(paths.root), "ddp", 2, network="1gbit")
    cell = paths.cell("ddp", 2, 0, network="1gbit")
    error = CellResult.read(cell.result).error if cell.result.exists() else cell.attempts.read_text()
    assert "MemoryLimitKill" in error and "cluster.memory_mb_per_host=256 MB" in error, error[-1500:]
    assert "raise cluster.memory_mb_per_host" in error
