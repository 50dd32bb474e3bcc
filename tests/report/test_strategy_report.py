"""The report's strategies table and the summary's strategy rows, on synthetic cell results
(the training itself: tests/training/test_strategies.py, tests/platforms/test_strategy_cells.py)."""

from __future__ import annotations

from pipelines.evaluation import evaluate_run
from pipelines.report import build_report
from pipelines.runfolder.results import ClassMetrics
from tests.synthetic_results import write_synthetic_run


def test_strategies_get_their_own_cells_aggregates_and_report_table(make_config):
    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2],
                         strategies=["default", "powersgd-r2", "weighted_sampler"])
    assert [s.name for s in config.matrix.strategies] == ["default", "powersgd-r2", "weighted_sampler"]
    paths, results = write_synthetic_run(config)
    # cell names: the default keeps today's, others carry the strategy; no 1-worker powersgd cell
    assert {"ddp-w2-r0", "ddp-powersgd-r2-w2-r0", "ddp-weighted_sampler-w1-r0"} <= set(results)
    assert "ddp-powersgd-r2-w1-r0" not in results
    # measured values the report must show: bytes per step and per-class recall
    powersgd = paths.cell("ddp", 2, 0, "powersgd-r2")
    result = results[powersgd.name].model_copy(update={"comm_bytes_per_step": 3 * 2**20})
    result.write(powersgd.result)
    weighted = paths.cell("ddp", 2, 0, "weighted_sampler")
    r = results[weighted.name]
    test = r.test.model_copy(update={"per_class": [
        ClassMetrics(label=0, precision=0.8, recall=0.7, f1=0.75, support=100),
        ClassMetrics(label=1, precision=0.6, recall=0.61, f1=0.6, support=100)]})
    r.model_copy(update={"test": test}).write(weighted.result)

    summary = evaluate_run(config, paths)
    keys = {a.key for a in summary.aggregates}
    assert {"ddp-w1", "ddp-w2", "ddp-powersgd-r2-w2", "spark-weighted_sampler-w1"} <= keys
    assert "ddp-powersgd-r2-w1" not in keys
    agg = next(a for a in summary.aggregates if a.key == "ddp-powersgd-r2-w2")
    assert agg.strategy == "powersgd-r2" and agg.comm_bytes_per_step == 3 * 2**20
    assert agg.scaling_efficiency is not None  # against the default strategy's 1-worker cell
    spark = next(a for a in summary.aggregates if a.key == "spark-powersgd-r2-w2")
    assert spark.overhead_vs_reference_total is not None  # against ddp with the same strategy
    assert next(r for r in summary.cells if r.cell == weighted.name).recall_per_class == [0.7, 0.61]

    build_report(config, paths)
    md = paths.report_markdown.read_text()
    section = md.split("## Training strategies")[1].split("\n## ")[0]
    assert "| ddp | powersgd-r2 | 2 |" in section and "| 3.000 |" in section  # MB per step
    assert "0.700 / 0.610" in section  # per-class recall of the weighted sampler cell
    assert "powersgd-r2 at 1 worker" in section  # not applicable, said so
    comparison = md.split("## Comparison")[1].split("\n## ")[0]
    assert comparison.count("| ddp |") == 2 * 3 and "powersgd" not in comparison  # platforms on one strategy
    assert section.count("| backend | strategy | workers |") == 3  # time; communication; quality: narrow tables
    verdict = md.split("## Verdict")[1].split("\n## ")[0]
    assert "powersgd" not in verdict and "weighted" not in verdict  # the verdict compares platforms too
    assert "spark" in comparison


def test_default_only_runs_have_no_strategies_section(make_config):
    config = make_config(backends=["ddp"], worker_counts=[1])
    paths, _ = write_synthetic_run(config)
    evaluate_run(config, paths)
    build_report(config, paths)
    assert "## Training strategies" not in paths.report_markdown.read_text()
