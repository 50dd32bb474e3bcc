"""Stragglers (``matrix.fault=slow_host`` / ``slow_link``, ``pipelines.measure.stragglers``).

A real ddp cell on two emulated hosts, by the run's own path (``stages.train_cell``), with h1 slow
for the whole cell: its rank computes slower, the other rank waits for it in the gradient
all-reduce (its communication per step grows), as every rank's step times in the result show
(``CellResult.rank_steps``); after the cell the cluster is healthy again (no CPU quota, every link
at the run's network). Relative assertions only: the machine is 2 shared cores.
"""

from __future__ import annotations

import json
import subprocess
import time
from types import SimpleNamespace

import pytest

from pipelines.cluster import why_unavailable
from pipelines.cluster.emulated import CONTROLLERS, NetworkSpec
from pipelines.measure import stragglers
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

_NO_NETNS = why_unavailable()


def _link_rate(netns: str, dev: str) -> int | None:
    """The tbf rate (bits/s) on ``dev`` in ``netns``, None when unshaped."""
    out = subprocess.run(["tc", "-n", netns, "-j", "qdisc", "show", "dev", dev], capture_output=True, text=True,
                         check=True).stdout
    for qdisc in json.loads(out or "[]"):
        if qdisc.get("kind") == "tbf":
            return int(qdisc["options"]["rate"]) * 8  # tc's JSON gives bytes per second
    return None


def _healthy(state: dict) -> dict:
    """Every host's CPU quota and link rates (both ends) now."""
    from pipelines.cluster import lifecycle

    cluster = lifecycle.attach(state)
    return {h.name: (h.cgroups[CONTROLLERS.index("cpu")].joinpath("cpu.cfs_quota_us").read_text().strip(),
                     _link_rate(h.netns, "eth0"), _link_rate(cluster.switch_netns, f"p{h.index}"))
            for h in cluster.hosts}


def test_the_slow_link_rate_and_its_bounds():
    base, slow = stragglers.slow_rate(NetworkSpec.parse("1gbit"), 0.25)
    assert (base.text, slow.bits_per_second, slow.text) == ("1gbit", 250 * 10**6, "250mbit")
    base, slow = stragglers.slow_rate(NetworkSpec.parse("unshaped"), 0.1)  # the documented base
    assert base is stragglers.UNSHAPED_BASE and slow.bits_per_second == 10**9
    with pytest.raises(ValueError, match=r"matrix.slow_fraction .*0.005 of 100mbit is 0.5 Mbit/s.*at least 0.01"):
        stragglers.slow_rate(NetworkSpec.parse("100mbit"), 0.005)


def test_no_straggler_fault_or_no_second_host_injects_nothing(tmp_path):
    cell = RunPaths(tmp_path / "r").cell("ddp", 2, 0)
    cell.root.mkdir(parents=True)
    stragglers.straggler_file(cell).write_text("{}")  # a previous attempt's: never read as this one's
    healthy = SimpleNamespace(matrix=SimpleNamespace(fault="none"))
    with stragglers.inject(healthy, cell, [SimpleNamespace(name="h0"), SimpleNamespace(name="h1")], "ddp") as done:
        assert done is None
    slow = SimpleNamespace(matrix=SimpleNamespace(fault="slow_host", slow_fraction=0.25, fault_victim="worker"))
    with stragglers.inject(slow, cell, [SimpleNamespace(name="h0")], "ddp") as done:
        assert done is None
    assert stragglers.record(cell) is None


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_a_slow_host_makes_its_rank_compute_slower_and_the_other_wait(tmp_path, make_config, imdb_dir,
                                                                       bert_tiny_dir):
    from pipelines.cluster import lifecycle
    from pipelines.config import save_config
    from pipelines.run import stages
    from pipelines.runfolder.results import CellResult

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "slow"), imdb_dir, bert_tiny_dir, train_per_class=48,
                               test_per_class=8, validation_per_class=8, seq_len=64, seed=7)
    config = make_config(**{"cluster.kind": "emulated", "networks": ["unshaped"], "backends": ["ddp"],
                            "worker_counts": [2], "epochs": 1, "max_seq_len": 64, "batch_size": 8,
                            "fault": "slow_host", "slow_fraction": 0.25, "cell_retries": 0})
    save_config(config, paths.config)
    started = time.monotonic()
    with lifecycle.run_cluster(paths, config) as state:
        stages.train_cell(str(paths.root), "ddp", 2, network="unshaped")
        after = _healthy(state)
    result = CellResult.read(paths.cell("ddp", 2, 0, network="unshaped").result)
    assert result.status == "ok", result.error
    assert result.straggler["kind"] == "slow_host" and result.straggler["host"] == "h1"
    assert result.straggler["cpu_quota_us"] == 2500  # 0.25 x the 10 ms period x 1 core
    assert result.straggler["throttled_seconds"] > 5, result.straggler  # the quota held h1 back
    by_host = {r.host: r for r in result.rank_steps}
    assert sorted(by_host) == ["h0", "h1"] and by_host["h0"].steps == by_host["h1"].steps > 0, result.rank_steps
    fast, slow = by_host["h0"], by_host["h1"]
    summary = {h: (round(r.compute_per_step_s, 3), round(r.communication_per_step_s, 3), round(r.step_p50_s, 3))
               for h, r in by_host.items()}
    print(f"\nslow_host: per host (compute/step, communication/step, p50 step) {summary}; "
          f"test took {time.monotonic() - started:.0f}s, cell {result.total_seconds:.0f}s, phases "
          f"{ {k: round(v, 1) for k, v in result.phases.items()} }")
    assert slow.compute_per_step_s > 1.2 * fast.compute_per_step_s, summary  # h1 computes slowly
    assert fast.communication_per_step_s > 1.2 * slow.communication_per_step_s, summary  # h0 waits for it
    # the cluster is healthy again: no quota, every link unshaped as the run asked
    assert after == {h: ("-1", None, None) for h in ("h0", "h1")}, after


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
@pytest.mark.parametrize("fault, strategy, fraction", [("slow_link", "default", 0.1), ("slow_host", "localsgd-4", 0.25),
                                                       ("slow_link", "localsgd-4", 0.1)])
def test_a_slow_link_and_local_sgd(fault, strategy, fraction, tmp_path, make_config, imdb_dir, bert_tiny_dir):
    """slow_link: h1's link at a tenth of 1 Gbit/s for the cell: the gradients (~17 MB a step) cross
    the slow wire, so every rank's communication outweighs its compute, and the link is back at
    1 Gbit/s after; local SGD under a slow host: the ranks still step in lockstep."""
    from pipelines.cluster import lifecycle
    from pipelines.config import save_config
    from pipelines.run import stages
    from pipelines.runfolder.results import CellResult

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "slow"), imdb_dir, bert_tiny_dir, train_per_class=48,
                               test_per_class=8, validation_per_class=8, seq_len=32, seed=7)
    config = make_config(**{"cluster.kind": "emulated", "networks": ["1gbit"], "backends": ["ddp"],
                            "worker_counts": [2], "epochs": 1, "max_seq_len": 32, "batch_size": 4,
                            "strategies": [strategy], "fault": fault, "slow_fraction": fraction, "cell_retries": 0})
    save_config(config, paths.config)
    with lifecycle.run_cluster(paths, config) as state:
        stages.train_cell(str(paths.root), "ddp", 2, network="1gbit", strategy=strategy)
        after = _healthy(state)
    result = CellResult.read(paths.cell("ddp", 2, 0, strategy, network="1gbit").result)
    assert result.status == "ok", result.error
    assert result.straggler["kind"] == fault and result.straggler["host"] == "h1"
    by_host = {r.host: r for r in result.rank_steps}
    assert sorted(by_host) == ["h0", "h1"], result.rank_steps
    if fault == "slow_link":
        assert result.straggler["rate_bits_per_second"] == 10**8 and result.straggler["base_assumed"] is False
        if strategy == "default":  # 17 MB of gradients per step over 100 Mbit/s: the wire is the step
            assert all(r.communication_per_step_s > r.compute_per_step_s for r in by_host.values()), result.rank_steps
    else:  # local SGD still meets the slow rank every step (DDP broadcasts buffers in each forward): the
        # fast rank's wait lands in its forward (compute) more than in the averaging; they march in lockstep
        assert result.straggler["throttled_seconds"] > 1, result.straggler
        fast, slow = by_host["h0"].step_p50_s, by_host["h1"].step_p50_s
        assert abs(fast - slow) < 0.25 * max(fast, slow), result.rank_steps
    assert after == {h: ("-1", 10**9, 10**9) for h in ("h0", "h1")}, after
