"""build_report: the markdown table equals the result files; plots are valid PNGs."""

from __future__ import annotations

import re
import statistics
from operator import attrgetter
from pathlib import Path

import matplotlib.image
import pytest
from PIL import Image

from pipelines.evaluation import evaluate_run, resource_cost, summary_metrics
from pipelines.report import QUALITY_COLUMNS, RESOURCE_COLUMNS, TIME_COLUMNS, build_report
from pipelines.report.tables import MEMORY_COLUMNS
from pipelines.runfolder.summary import SummaryMissing
from tests.synthetic_results import write_synthetic_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def parse_tables(markdown: str, section: str = "## Comparison") -> list[tuple[list[str], list[dict[str, str]]]]:
    """Every Markdown table of a section -> (header, one dict per row keyed by column title)."""
    text = markdown.split(section + "\n", 1)[1].split("\n## ", 1)[0]
    tables, lines = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            header = [c.strip() for c in lines[0].strip("|").split("|")]
            rows = [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]
            tables.append((header, rows))
            lines = []
    return tables


def parse_table(markdown: str) -> list[dict[str, str]]:
    """The '## Comparison' tables (time, quality, throughput and cost) -> one dict per row (backend,
    network, workers), the three tables' columns merged."""
    merged: dict[tuple, dict[str, str]] = {}
    for _, rows in parse_tables(markdown):
        for row in rows:
            merged.setdefault((row["backend"], row.get("network"), row["workers"]), {}).update(row)
    return list(merged.values())


def test_report_table_and_plots_match_results(make_config):
    config = make_config(backends=["ddp", "spark", "determined"], worker_counts=[1, 2], repeats=2,
                         price_per_worker_hour=1.0, target_accuracy=0.595)
    paths, results = write_synthetic_run(config, failed=("determined-w2-r1",), resources=True)
    with pytest.raises(SummaryMissing, match="evaluate the run first"):
        build_report(config, paths)  # reading a missing summary is an error, never a recompute
    evaluate_run(config, paths)
    out = build_report(config, paths)

    md = Path(out["markdown"]).read_text()
    headers = [h for h, _ in parse_tables(md)]
    assert headers == [TIME_COLUMNS, QUALITY_COLUMNS, RESOURCE_COLUMNS]  # 2 repeats: intervals shown
    comparison = md.split("## Comparison", 1)[1].split("\n## ", 1)[0]  # the costs section has its own
    assert comparison.count("### ") == 3 and "### Time" in comparison and "### Quality" in comparison
    rows = parse_table(md)
    assert len(rows) == 6
    for row in rows:
        key = f"{row['backend']}-w{row['workers']}"
        ok = [r for n, r in results.items() if n.startswith(key + "-") and r.status == "ok"]
        assert row["repeats ok"] == f"{len(ok)}/2"
        def median(field: str, digits: int) -> float:
            return round(statistics.median(map(attrgetter(field), ok)), digits)

        assert float(row["total s (median)"]) == median("total_seconds", 2)
        assert float(row["training s (median)"]) == median("training_seconds", 2)
        assert float(row["samples/s (median)"]) == median("samples_per_second", 2)
        assert float(row["test accuracy (median)"]) == median("test.accuracy", 4)
        assert float(row["test F1 (median)"]) == median("test.f1", 4)
        # the priced cost (price sheet), one memory figure per scope: the ranks, the platform, the whole cell
        assert float(row["cost USD (median)"]) == pytest.approx(
            statistics.median(resource_cost(r, config.tracking) for r in ok), abs=1e-6)
        for column, scope in zip(MEMORY_COLUMNS, ("ranks_peak_rss_mb", "platform_peak_rss_mb", "peak_rss_mb")):
            assert float(row[column]) == round(max(getattr(r.resources, scope) for r in ok))
        if row["backend"] == "ddp":
            assert row["overhead vs reference (total)"] == "+0.0 %"
    by_key = {f"{r['backend']}-w{r['workers']}": r for r in rows}
    t1 = statistics.median(results[f"spark-w1-r{i}"].training_seconds for i in range(2))
    t2 = statistics.median(results[f"spark-w2-r{i}"].training_seconds for i in range(2))
    assert float(by_key["spark-w2"]["scaling efficiency"]) == round(t1 / (2 * t2), 2)
    tta = float(re.match(r"([\d.]+) \(2/2\)", by_key["ddp-w2"]["time to target s"]).group(1))
    assert tta == round(statistics.median(results[f"ddp-w2-r{i}"].epochs[0].elapsed_seconds
                                          for i in range(2)), 2)

    # no worker-hour estimate beside the priced cost, no memory figure without its scope
    assert "est. cost" not in md and "worker-hour" not in md and "peak memory MB (max)" not in md

    # what was run on what, and what failed, in plain words
    assert "determined-w2-r1" in md and "exited with code 1" in md
    assert "randomly initialised" in md and "NOT comparable" in md
    assert config.data.dataset_source in md
    assert '- train: 400 rows (of 25000 in the source), per label {"0": 200, "1": 200}' in md
    assert "bench-host" in md and "torch 2.13.0+cpu" in md

    assert len(out["plots"]) == 6 and Path(out["plots"][0]).name == "verdict.png"
    for plot in map(Path, out["plots"]):
        assert plot.read_bytes()[:8] == PNG_SIGNATURE
        with Image.open(plot) as img:
            img.verify()
        pixels = matplotlib.image.imread(plot)
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels.std() > 0.01  # something was drawn
        assert md.count(f"({plot.name})") == 1  # the verdict's chart under the verdict, the others under Plots

    html = Path(out["html"]).read_text()
    timelines = sum(1 for r in results.values() if r.status == "ok")  # one per measured cell (costs section)
    assert html.count("data:image/png;base64,") == 6 + timelines
    assert "<table>" in html and "determined-w2-r1" in html


def test_report_with_every_cell_failed(make_config):
    config = make_config(backends=["spark"], worker_counts=[1, 2])
    paths, _ = write_synthetic_run(config, failed=("spark-w1-r0",), skip=("spark-w2-r0",))
    evaluate_run(config, paths)
    out = build_report(config, paths)
    md = Path(out["markdown"]).read_text()
    assert "Status: **failed**" in md
    assert all(r["total s (median)"] == "n/a" for r in parse_table(md))
    assert "spark-w2-r0" in md and "no result" in md
    for plot in map(Path, out["plots"]):
        assert matplotlib.image.imread(plot).ndim == 3


def test_report_sets_each_platform_beside_the_study_with_its_mode(make_config):
    from pipelines.report import study_overhead, study_rows
    from pipelines.evaluation.projection import project, split

    config = make_config(backends=["ddp", "spark", "determined"], worker_counts=[1, 2], repeats=1)
    paths, results = write_synthetic_run(config)
    summary = evaluate_run(config, paths)
    md = Path(build_report(config, paths)["markdown"]).read_text()

    assert "## Beside the published study" in md
    rows = {(r[0], r[2]): r for r in study_rows(summary)}
    assert set(rows) == {(b, w) for b in ("spark", "determined") for w in ("1", "2")}  # ddp is the reference
    for (backend, workers), row in rows.items():
        cell, ddp = results[f"{backend}-w{workers}-r0"], results[f"ddp-w{workers}-r0"]
        assert row[1] == cell.platform_mode == "local"
        overhead = (cell.total_seconds - ddp.total_seconds) / ddp.total_seconds
        assert row[3] == f"{overhead * 100:+.1f} %"
        extra_launch = cell.phases["launch"] - ddp.phases["launch"]  # the phase that explains it
        assert f"mostly launch: launch {extra_launch:+.2f} s" in row[5]
        # the overhead projected to the study's job: each cell's fixed + per-epoch seconds at its length
        mine, base = (project(split(r), summary.job) for r in (cell, ddp))
        assert row[6] == f"{(mine / base - 1) * 100:+.1f} %"
        assert row[7].startswith(f"{study_overhead(backend) * 100:+.0f} %")
    assert f"Hardware here: {summary.hardware.hardware_class}. The study: 3 GPU nodes" in md
    # each local mode is labelled as not being the platform's cluster overhead
    assert "Local modes are not the platform's cluster overhead" in md
    assert "spark (local): TorchDistributor in local mode" in md and "determined (local)" in md
    modes = {f"{r['backend']}-w{r['workers']}": r["mode"] for r in parse_table(md)}  # every row labelled
    assert modes == {"ddp-w1": "torchrun", "ddp-w2": "torchrun", "spark-w1": "local", "spark-w2": "local",
                     "determined-w1": "local", "determined-w2": "local"}


def test_report_shows_where_the_time_goes(make_config):
    from pipelines.report import phase_rows
    from pipelines.training.phases import PHASES

    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2], repeats=2)
    paths, results = write_synthetic_run(config)
    summary = evaluate_run(config, paths)
    out = build_report(config, paths)
    md = Path(out["markdown"]).read_text()

    assert "## Where the time goes" in md and "![phases](phases.png)" in md
    rows = {r[0]: r for r in phase_rows(summary)}
    assert set(rows) == {"spark-w1", "spark-w2", "ddp-w1", "ddp-w2"}
    agg = {a.key: a for a in summary.aggregates}["spark-w2"]
    for phase in PHASES:  # medians over the repeats, per phase
        expected = statistics.median(results[f"spark-w2-r{i}"].phases[phase] for i in range(2))
        assert agg.phases[phase] == pytest.approx(expected)
    assert rows["spark-w2"][2].startswith(f"{agg.phases['launch']:.2f} (")
    assert rows["ddp-w1"][2 + PHASES.index("communication")].startswith("0.00 (0 %)")
    assert summary_metrics(summary)["spark-w2/phase_launch_seconds_median"] == pytest.approx(agg.phases["launch"])
    plot = Path(paths.plot("phases"))
    assert plot.read_bytes()[:8] == PNG_SIGNATURE and matplotlib.image.imread(plot).std() > 0.01


def test_report_shows_each_spark_data_feed_beside_its_mode(make_config):
    from pipelines.runfolder.results import CellResult

    config = make_config(backends=["ddp", "spark", "spark_dataframe"], worker_counts=[2], repeats=1,
                         spark_master="embedded")
    paths, results = write_synthetic_run(config)
    for backend, feed in (("ddp", "files"), ("spark", "files"), ("spark_dataframe", "dataframe")):
        cell = paths.cell(backend, 2, 0)
        mode = "torchrun" if backend == "ddp" else "cluster"
        CellResult.read(cell.result).model_copy(update={"platform_mode": mode, "data_feed": feed}).write(cell.result)
    evaluate_run(config, paths)
    md = Path(build_report(config, paths)["markdown"]).read_text()
    modes = {r["backend"]: r["mode"] for r in parse_table(md)}
    assert modes == {"ddp": "torchrun, files feed", "spark": "cluster, files feed",
                     "spark_dataframe": "cluster, dataframe feed"}
    assert "their difference is what feeding the data through Spark costs" in md
