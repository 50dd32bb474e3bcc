"""The report's opening verdict (pipelines.report.verdict) on synthetic runs: the fastest platform
per worker count, the others' overhead and the phase that carries it, accuracy parity, failed cells
and regressions, in plain sentences; and the page around it: the verdict is report.html's first
section, intervals only with repeats, lists as lists (the browser check: tests/e2e/test_report_browser.py)."""

from __future__ import annotations

import json
import re
import statistics
from html.parser import HTMLParser

import pytest

from pipelines.evaluation import evaluate_run
from pipelines.report import PARITY_POINTS, build_report, build_verdict, platform_view
from pipelines.runfolder.results import CellResult
from tests.synthetic_results import write_synthetic_run


def _verdict(config, paths, regression=None):
    summary = platform_view(evaluate_run(config, paths), config)
    return summary, build_verdict(summary, regression)


def _texts(verdict) -> list[str]:
    return [f.plain() for f in verdict.findings]


def _median(results, field: str, key: str) -> float:
    return statistics.median(getattr(r, field) for n, r in results.items() if n.startswith(key + "-r"))


class _Outline(HTMLParser):
    """The order of the page's h2 titles and the tags right around lists."""

    def __init__(self) -> None:
        super().__init__()
        self.h2: list[str] = []
        self.tags: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in_h2 = tag == "h2"

    def handle_endtag(self, tag):
        self._in_h2 = False if tag == "h2" else self._in_h2

    def handle_data(self, data):
        if self._in_h2:
            self.h2.append(data.strip())


def test_a_normal_run_names_the_fastest_the_overheads_with_their_phase_and_parity(make_config):
    config = make_config(backends=["ddp", "spark", "determined"], worker_counts=[1, 2], repeats=1)
    paths, results = write_synthetic_run(config)
    summary, verdict = _verdict(config, paths)
    texts = _texts(verdict)
    assert 3 <= len(texts) <= 8
    assert [f.kind for f in verdict.findings][:4] == ["fastest", "fastest", "projection", "parity"]

    for workers, text in ((1, texts[0]), (2, texts[1])):
        ddp = results[f"ddp-w{workers}-r0"]
        label = "1 worker" if workers == 1 else f"{workers} workers"
        assert text.startswith(f"At {label}, ddp is fastest: {ddp.total_seconds:.2f} s total")
        for backend in ("spark", "determined"):
            cell = results[f"{backend}-w{workers}-r0"]
            gap = cell.total_seconds - ddp.total_seconds
            launch = cell.phases["launch"] - ddp.phases["launch"]  # the phase that carries it
            assert (f"{backend} is {gap / ddp.total_seconds * 100:.1f} % slower (+{gap:.2f} s), most of it in "
                    f"launch (+{launch:.2f} s)") in text
    assert "(scaling efficiency " in texts[1] and "(scaling efficiency" not in texts[0]
    # the totals projected to the study's job, fastest first, and where each fixed cost stops mattering
    projected = {a.key: a.projection for a in summary.aggregates}
    assert texts[2].startswith("Projected to the study's job (25,000 reviews x 20 epochs, tested on 25,000) from "
                               "each cell's fixed and per-epoch seconds: at 1 worker ddp ")
    ddp2, spark2 = projected["ddp-w2"].total_seconds, projected["spark-w2"].total_seconds
    assert (f"at 2 workers ddp {ddp2:,.0f} s, spark {(spark2 / ddp2 - 1) * 100:+.1f} %, determined "
            in texts[2])
    unders = {k: p.fixed_under_5pct_sample_epochs for k, p in projected.items()}
    low, high = min(unders, key=unders.get), max(unders, key=unders.get)
    assert (f"The fixed cost (provision, launch, teardown) stays under 5 % of the total from {unders[low]:,.0f} "
            f"reviews x epochs ({low.split('-')[0]}, ") in texts[2]
    assert f" to {unders[high]:,.0f} reviews x epochs ({high.split('-')[0]}, " in texts[2]
    assert texts[3].startswith(f"Accuracy is at parity: at each setting the platforms' median test accuracies "
                               f"are within {PARITY_POINTS:g} points of each other")
    assert "random weights" in texts[3]  # the synthetic cells say model_source random_init
    assert "spark (local) and determined (local) ran in modes that do not measure" in texts[4]
    assert not [f for f in verdict.findings if f.kind in ("failed", "regressed", "regression")]
    lead = verdict.as_json()["lead"]
    assert lead == ("What this run found (each cell's total wall time, one repeat: no intervals, so gaps of a "
                    "few percent can be run-to-run noise):")


def test_accuracy_off_parity_names_the_platform(make_config):
    config = make_config(backends=["ddp", "spark"], worker_counts=[2], repeats=1)
    paths, results = write_synthetic_run(
        config, cell_kwargs=lambda b, s, n, w, r: {"accuracy_shift": -0.05} if b == "spark" else {})
    _, verdict = _verdict(config, paths)
    [parity] = [f.plain() for f in verdict.findings if f.kind == "parity"]
    spark, ddp = results["spark-w2-r0"].test.accuracy, results["ddp-w2-r0"].test.accuracy
    assert parity.startswith(f"Accuracy is not at parity (more than {PARITY_POINTS:g} points below the best")
    assert f"spark at 2 workers {spark:.4f} vs ddp's {ddp:.4f} ({(spark - ddp) * 100:.1f} points)" in parity


def test_a_failed_cell_is_named_with_the_first_line_of_its_error(make_config):
    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2], repeats=1)
    paths, _ = write_synthetic_run(config, failed=("spark-w2-r0",))
    cell = paths.cell("spark", 2, 0)
    CellResult.read(cell.result).model_copy(update={
        "error": "RuntimeError: barrier stage hung\nTraceback (most recent call last):\n  ..."}).write(cell.result)
    _, verdict = _verdict(config, paths)
    texts = _texts(verdict)
    assert texts[1].startswith("At 2 workers, only ddp finished: ") and texts[1].endswith(
        "No finished repeat: spark.")
    [failed] = [f for f in verdict.findings if f.kind == "failed"]
    assert failed.plain() == "1 cell failed: spark-w2-r0 \u2014 RuntimeError: barrier stage hung. Details under 'Failed cells'."
    assert failed.markdown().startswith("**1 cell failed:** spark-w2-r0")  # bold in the report only
    assert "Traceback" not in " ".join(texts)


@pytest.mark.parametrize("shape", ["one platform, one worker", "every cell failed"])
def test_small_and_broken_runs_still_read_well(make_config, shape):
    if shape == "one platform, one worker":
        config = make_config(backends=["ddp"], worker_counts=[1], repeats=1)
        paths, results = write_synthetic_run(config)
    else:
        config = make_config(backends=["ddp", "spark"], worker_counts=[1])
        paths, results = write_synthetic_run(config, failed=("ddp-w1-r0", "spark-w1-r0"))
    _, verdict = _verdict(config, paths)
    texts = _texts(verdict)
    if shape == "one platform, one worker":
        total = results["ddp-w1-r0"].total_seconds
        assert texts[0] == f"At 1 worker, ddp (the only platform) took {total:.2f} s total."
        assert texts[1].startswith("Projected to the study's job") and texts[1].endswith("(ddp, 1 worker).")
        assert " to " not in texts[1].split("stays under")[1]  # one platform: no range
        assert texts[2].startswith("Accuracy: one platform per worker count, so no parity to check; median test "
                                   f"accuracy {results['ddp-w1-r0'].test.accuracy:.4f} (ddp at 1 worker).")
        assert len(texts) == 3
    else:
        assert texts[0] == "No cell finished, so there is nothing to compare."
        assert texts[1].startswith("2 cells failed: ddp-w1-r0 \u2014 ddp: worker exited with code 1")
        assert len(texts) == 2
    assert not any(re.search(r"\bnan\b|None|n/a", t) for t in texts)


def test_many_settings_stay_within_eight_bullets(make_config):
    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2, 3, 4, 5], repeats=1)
    paths, results = write_synthetic_run(config)
    _, verdict = _verdict(config, paths, regression={"status": "passed", "message": "no regression against x"})
    texts = _texts(verdict)
    assert len(texts) <= 8
    # told in full: the largest worker count first, then the run's order; the rest in one sentence
    assert [t.split(",")[0] for t in texts[:3]] == ["At 1 worker", "At 2 workers", "At 5 workers"]
    ddp3 = results["ddp-w3-r0"].total_seconds
    assert texts[3].startswith(f"Fastest elsewhere: at 3 workers ddp ({ddp3:.2f} s); at 4 workers ddp (")
    assert texts[-1] == "Regression check passed: no regression against x."


def test_overlapping_intervals_and_ties_are_said_so(make_config):
    config = make_config(backends=["ddp", "spark"], worker_counts=[2], repeats=3)
    paths, _ = write_synthetic_run(config)
    summary = platform_view(evaluate_run(config, paths), config)
    ddp, spark = summary.aggregates
    near = spark.model_copy(update={
        "total_seconds": spark.total_seconds.model_copy(update={"median": ddp.total_seconds.median * 1.05}),
        "total_seconds_ci": ddp.total_seconds_ci.model_copy(update={"high": ddp.total_seconds_ci.high + 5})})
    text = _texts(build_verdict(summary.model_copy(update={"aggregates": [ddp, near]})))[0]
    assert "spark is 5.0 % slower" in text and "within the repeats' 95 % intervals" in text
    tie = near.model_copy(update={"total_seconds": ddp.total_seconds})
    text = _texts(build_verdict(summary.model_copy(update={"aggregates": [ddp, tie]})))[0]
    assert "spark is about as fast (+0.0 %)" in text and "most of it" not in text


@pytest.fixture(scope="module")
def reports(tmp_path_factory, imdb_dir, bert_tiny_dir):
    """One run with 1 repeat, one with 3 (a failed cell in it), both reported; read-only."""
    from pipelines.config import load_config

    out = {}
    for repeats in (1, 3):
        config = load_config("smoke", dict(
            dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
            output_root=str(tmp_path_factory.mktemp(f"verdict{repeats}")), repeats=repeats,
            backends=["ddp", "spark", "determined"], worker_counts=[1, 2]))
        paths, _ = write_synthetic_run(config, failed=("determined-w2-r1",) if repeats == 3 else ())
        evaluate_run(config, paths)
        build_report(config, paths)
        out[repeats] = paths
    return out


def test_intervals_only_with_repeats(reports):
    one, three = (reports[n].report_markdown.read_text() for n in (1, 3))
    assert "95 % CI" not in one and not re.search(r"(\d+\.\d+) - \1", one)  # no "25.84 - 25.84 (1)"
    assert "one repeat per cell, so no intervals" in one
    comparison = three.split("## Comparison")[1].split("\n## ")[0]
    assert "| total s 95 % CI (n) |" in comparison and "| test accuracy 95 % CI |" in comparison
    ranges = re.findall(r"\| (\d+\.\d+) - (\d+\.\d+) \(3\) \|", comparison)
    assert ranges and all(float(lo) <= float(hi) for lo, hi in ranges)
    assert "| n/a |" not in comparison.split("### Quality")[0].split("| determined | local | 2 |")[0]


def test_verdict_is_the_first_section_and_lists_render_as_lists(reports):
    paths = reports[3]
    md = paths.report_markdown.read_text()
    assert md.index("## Verdict") < md.index("## Comparison") == md.index("\n## ", md.index("## Verdict") + 1) + 1
    html = paths.report_html.read_text()
    outline = _Outline()
    outline.feed(html)
    assert outline.h2[0] == "Verdict" and outline.h2[1] == "Comparison"
    verdict_html = html.split("<h2>Verdict</h2>")[1].split("<h2>")[0]
    assert verdict_html.count("<li>") >= 3 and '<img alt="Total time per platform, by phase" src="data:image/png' \
        in verdict_html
    assert "1 cell failed:</strong> determined-w2-r1 \u2014 determined: worker exited" in verdict_html
    study = html.split("<h2>Beside the published study</h2>")[1].split("<h2>")[0]
    assert "<p>Local modes are not the platform's cluster overhead:</p>\n<ul>\n<li>determined (local): " in study
    assert study.count("<li>") >= 3 and "<p>Notes:</p>\n<ul>" in study
    assert not re.search(r"<p>[^<]*\n- ", html)  # no list item run on inside a paragraph
    saved = json.loads((paths.report / "verdict.json").read_text())
    assert saved["findings"][0]["text"].startswith("At 1 worker, ddp is fastest: ")
