"""The report on cluster lifetimes (pipelines.report.lifetimes): which lifetime each platform's
figures are, what a per-job cluster adds to a cell, and the standing clusters' own start."""

from __future__ import annotations

import json

from pipelines.report import build_verdict, platform_view
from pipelines.evaluation import evaluate_run
from pipelines.runfolder.results import CellResult
from tests.synthetic_results import write_synthetic_run


def test_the_verdict_says_which_lifetime_each_platform_is_and_what_per_job_adds(make_config):
    config = make_config(backends=["ddp", "spark", "spark_per_job"], worker_counts=[2], repeats=1)
    paths, results = write_synthetic_run(config, "lifetimes")
    for name, result in results.items():  # per job: 12 s of the launch was the cluster's start
        if name.startswith("spark_per_job"):
            phases = {"provision": 12.0, **result.phases, "launch": result.phases["launch"] - 12.0}
            CellResult.model_validate({**result.model_dump(), "phases": phases}).write(paths.cell(
                "spark_per_job", 2, 0).result)
    (paths.root / "services.json").write_text(json.dumps(
        {"embedded Spark cluster": [{"started": 1.0, "provision_seconds": 9.5}]}))
    summary = platform_view(evaluate_run(config, paths), config)
    assert summary.standing_clusters == {"embedded Spark cluster": [9.5]}
    [lifetimes] = [f.plain() for f in build_verdict(summary).findings if f.kind == "lifetimes"]
    assert "spark: standing clusters" in lifetimes and "embedded Spark cluster: 9.5 s to start" in lifetimes
    assert "spark_per_job: per-job clusters" in lifetimes
    assert "At 2 worker(s), spark_per_job takes +" in lifetimes and "provision 12.0 s" in lifetimes
    assert "ddp" not in lifetimes  # no cluster of its own
    from pipelines.report import build_report

    md = open(build_report(config, paths)["markdown"]).read()
    assert "Standing clusters, started outside the cells" in md and "provision" in md
