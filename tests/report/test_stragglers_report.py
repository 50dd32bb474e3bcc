"""The report's stragglers section (``pipelines.report.stragglers``) on synthetic results: the
slowdown against the healthy cell of a run beside it, who waited for whom, one line per fault."""

from __future__ import annotations

from pipelines.report.stragglers import healthy_references, stragglers_markdown
from pipelines.runfolder.results import CellResult, RankSteps

SLOW_HOST = {"kind": "slow_host", "host": "h1", "fraction": 0.25, "cpu_quota_us": 2500, "throttled_seconds": 31.0}
SLOW_LINK = {"kind": "slow_link", "host": "h1", "fraction": 0.25, "network": "1gbit", "base": "1gbit",
             "base_assumed": False, "rate_bits_per_second": 250_000_000}


def _ranks(compute: tuple[float, float], communication: tuple[float, float], steps: int = 10) -> list[RankSteps]:
    return [RankSteps(rank=k, host=f"h{k}", steps=steps, step_p50_s=0.3, step_p95_s=0.4,
                      compute_s=compute[k] * steps, communication_s=communication[k] * steps) for k in (0, 1)]


def _cell(strategy: str, training: float, ranks: list[RankSteps], straggler: dict | None = None,
          status: str = "ok") -> CellResult:
    return CellResult(backend="ddp", world_size=2, strategy=strategy, network="1gbit", training_seconds=training,
                      total_seconds=training + 20, rank_steps=ranks, straggler=straggler, status=status)


def test_the_section_shows_slowdowns_who_waited_and_one_line_per_fault():
    slow = {
        "ddp-1gbit-w2-r0": _cell("default", 30.0, _ranks((0.10, 0.20), (0.25, 0.05)), SLOW_HOST),
        "ddp-localsgd-4-1gbit-w2-r0": _cell("localsgd-4", 12.0, _ranks((0.09, 0.21), (0.12, 0.01)), SLOW_LINK),
        "ddp-fp16-1gbit-w2-r0": _cell("fp16", 1.0, [], SLOW_LINK, status="failed"),
        "spark-1gbit-w2-r0": _cell("default", 5.0, _ranks((0.1, 0.1), (0.1, 0.1))),  # healthy: not listed
    }
    healthy = {"ddp-1gbit-w2-r0": _cell("default", 10.0, _ranks((0.05, 0.05), (0.04, 0.04)))}
    md = stragglers_markdown(slow, healthy)
    assert md.startswith("## Stragglers: a slow host, a slow link")
    row = next(line for line in md.splitlines() if line.startswith("| ddp-1gbit-w2-r0 | ddp | default"))
    assert "| h1 CPU at 25 % (throttled 31 s) | 10.0 | 30.0 | x3.00 | 30.0 | 50.0 | ok |" in row
    local = next(line for line in md.splitlines() if line.startswith("| ddp-localsgd-4-1gbit-w2-r0 | ddp"))
    assert "| h1 link at 25 % of 1gbit | - | 12.0 | n/a |" in local  # no healthy run of that cell
    ranks = [line for line in md.splitlines() if line.startswith("| ddp-1gbit-w2-r0 | ")][1:]
    assert ranks[0].startswith("| ddp-1gbit-w2-r0 | 0 | h0 | 10 | 300 | 400 | 100 | 250 | 50 / 40 |"), ranks
    assert ranks[1].startswith("| ddp-1gbit-w2-r0 | 1 | h1 (slow) | 10 | 300 | 400 | 200 | 50 | 50 / 40 |"), ranks
    assert "- ddp-1gbit-w2-r0: rank 0 (h0) waited 250 ms/step in communication for rank 1 (h1), which computed " \
           "200 ms/step" in md
    assert "- ddp-localsgd-4-1gbit-w2-r0: every rank waited on h1's link: communication 120 / 10 ms/step, compute " \
           "90 / 210 ms/step (ranks 0 / 1)" in md
    host_line = next(line for line in md.splitlines() if line.startswith("- `slow_host`"))
    assert "1 of 1 cell(s) kept training to the end; training time against the healthy cell: ddp default x3.00" \
        in host_line
    link_line = next(line for line in md.splitlines() if line.startswith("- `slow_link`"))
    assert "1 of 2 cell(s) kept training to the end (ddp-fp16-1gbit-w2-r0 failed)" in link_line
    assert "spark-1gbit-w2-r0" not in md
    assert stragglers_markdown({"spark-w2-r0": _cell("default", 1.0, [])}) is None


def test_the_healthy_reference_is_the_newest_same_fingerprint_fault_free_run_beside_it(tmp_path, make_config):
    from pipelines.config import save_config

    runs = tmp_path / "runs"
    base = {"cluster.kind": "emulated", "networks": ["1gbit"], "worker_counts": [2]}
    name = "ddp-1gbit-w2-r0"
    for run_id, overrides, training in (("healthy", {}, 10.0), ("other-data", {"train_samples": 123}, 1.0),
                                        ("also-slow", {"fault": "slow_link"}, 2.0), ("slow", {"fault": "slow_host"}, 30.0)):
        (runs / run_id / "cells" / name).mkdir(parents=True)
        save_config(make_config(**base, **overrides), runs / run_id / "config.json")
        _cell("default", training, []).write(runs / run_id / "cells" / name / "result.json")
    (runs / "not-a-run").mkdir()
    (runs / "not-a-run" / "config.json").write_text("{oops")
    fingerprint = make_config(**base, fault="slow_host").fingerprint()
    found = healthy_references(runs / "slow", fingerprint, [name, "ddp-w2-r0"])
    assert list(found) == [name] and found[name].training_seconds == 10.0
