"""The network as a benchmark dimension, through the pipeline's own cell step.

A run on a 2-host emulated cluster with ``networks=["unshaped", "100mbit"]`` and the strategies
default / fp16 / powersgd-r2 on ddp (``stages.train_cell``: the hosts come from the run's
cluster, the links are shaped to each cell's network under the host lock): at 100 Mbit/s the
communication phase is at least 3x the unshaped one; fp16 moves at most half and PowerSGD at most
a tenth of the default's bytes per training step (fp16: exactly half of the gradient payload handed to
gloo; on the wire, measured by the ranks' own interface counters around each epoch's steps, TCP/IP
framing and acknowledgements add ~10 % to both, plus a few fixed bytes a step, so fp16's link bytes
are allowed 2 % over half), and both communicate for less time. 36 steps, so PowerSGD's two
uncompressed warm-up steps (``start_powerSGD_iter``) do not dominate its average.
"""

from __future__ import annotations

import json

import pytest

from pipelines.cluster import why_unavailable
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

_NO_NETNS = why_unavailable()


@pytest.mark.slow
@pytest.mark.heavy  # ~4 min: the bandwidth measurement behind bench/RESULTS.md
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_bandwidth_shapes_communication_and_the_strategies_save_it(tmp_path, make_config, imdb_dir, bert_tiny_dir):
    from pipelines.run import stages
    from pipelines.cluster import lifecycle
    from pipelines.config import save_config
    from pipelines.runfolder.results import CellResult

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "net"), imdb_dir, bert_tiny_dir, train_per_class=48,
                               test_per_class=16, seq_len=32, seed=4)
    config = make_config(**{"cluster.kind": "emulated", "networks": ["unshaped", "100mbit"], "backends": ["ddp"],
                            "strategies": ["default", "fp16", "powersgd-r2"], "worker_counts": [2], "epochs": 3,
                            "max_seq_len": 32, "batch_size": 8, "cell_retries": 0})
    save_config(config, paths.config)
    with lifecycle.run_cluster(paths, config):
        failed = stages.train_cells(str(paths.root))
    assert failed == []
    cells = {(s, n): CellResult.read(paths.cell("ddp", 2, 0, s, n).result)
             for _, s, n, _, _ in config.cells()}
    summary = {f"{s}@{n}": {"comm_s": round(r.phases["communication"], 2), "link_bytes_per_step": r.link_bytes_per_step, "per_train_step": r.link_bytes_per_train_step,
                            "placements": r.placements} for (s, n), r in cells.items()}
    print("\n" + json.dumps(summary, indent=1))
    for (strategy, network), r in cells.items():
        assert r.status == "ok" and r.network == network and r.cluster == "emulated", (strategy, network, r.error)
        assert [p.split()[0] for p in r.placements] == ["h0", "h1"]
    slow, fast = cells["default", "100mbit"], cells["default", "unshaped"]
    assert slow.phases["communication"] >= 3 * fast.phases["communication"], summary
    per_step = slow.link_bytes_per_train_step
    assert per_step > 2 * 16e6, summary  # ~17.6 MB of fp32 gradients each way per step
    assert cells["fp16", "100mbit"].comm_bytes_per_step <= 0.5 * slow.comm_bytes_per_step, summary
    assert cells["fp16", "100mbit"].link_bytes_per_train_step <= 0.51 * per_step, summary
    assert cells["powersgd-r2", "100mbit"].link_bytes_per_train_step <= 0.1 * per_step, summary
    for strategy in ("fp16", "powersgd-r2"):
        assert cells[strategy, "100mbit"].phases["communication"] < slow.phases["communication"], summary
