"""Browser test of report.html: headless Chromium opens the report of a synthetic run in a
1280-pixel-wide window and checks what a reader sees: the verdict is the first section, no table
is wider than the window and the page needs no horizontal scrolling, the lists render as lists.

Two synthetic runs: four platforms at 1 and 2 workers with 3 repeats (intervals shown) and a
failed cell; and the widest report, with three emulated networks and three training strategies
(Network and Training strategies sections). No server: the report is one self-contained file.
About 30 s on 2 cores.

    .venv/bin/python -m pytest tests/e2e/test_report_browser.py -m e2e

Screenshots (21_report_verdict.png: the first screen; 22_report_full.png, 23_report_networks_full.png:
the whole page) go to $E2E_ARTIFACTS (default tests/e2e/artifacts/), with report_widths.json.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipelines.evaluation import evaluate_run
from pipelines.report import build_report
from tests.synthetic_results import write_synthetic_run

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("E2E_ARTIFACTS", PROJECT_ROOT / "tests" / "e2e" / "artifacts")).resolve()
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTH, HEIGHT = 1280, 900

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MEASURE_JS = """() => {
  const tables = [...document.querySelectorAll('table')];
  const h2 = [...document.querySelectorAll('h2')];
  const verdict = h2.find(h => h.textContent === 'Verdict');
  const after = [];  // what follows the verdict's title up to the next section
  for (let el = verdict && verdict.nextElementSibling; el && el.tagName !== 'H2'; el = el.nextElementSibling)
    after.push(el.tagName.toLowerCase());
  return {
    widest_table: Math.max(0, ...tables.map(t => t.getBoundingClientRect().width)),
    widest_table_scroll: Math.max(0, ...tables.map(t => t.scrollWidth)),
    tables: tables.length,
    page_scroll_width: document.documentElement.scrollWidth,
    h2: h2.map(h => h.textContent),
    verdict_top: verdict ? verdict.getBoundingClientRect().top : null,
    verdict_items: verdict ? [...verdict.nextElementSibling.nextElementSibling.querySelectorAll('li')]
      .map(li => li.innerText) : [],
    verdict_blocks: after,
    verdict_chart_loaded: [...document.querySelectorAll('img')].some(i => i.alt.startsWith('Total time')
      && i.complete && i.naturalWidth > 100),
    study_lists: [...document.querySelectorAll('h2')].filter(h => h.textContent === 'Beside the published study')
      .map(h => { let n = 0; for (let el = h.nextElementSibling; el && el.tagName !== 'H2';
                                  el = el.nextElementSibling) n += el.tagName === 'UL'; return n; })[0],
    run_on_items: [...document.querySelectorAll('p')].filter(p => /\\n- /.test(p.textContent)).length,
  };
}"""


def _configs(make_config):
    four = dict(backends=["ddp", "spark", "determined", "spark_dataframe"], worker_counts=[1, 2], repeats=3)
    wide = dict(four, repeats=2, strategies=["default", "fp16", "weighted_sampler"],
                networks=["unshaped", "1gbit", "100mbit"], **{"cluster.kind": "emulated"})
    return {"local": (make_config(**four), ("determined-w2-r1",)),
            "networks": (make_config(**wide), ("spark-100mbit-w2-r0",))}


def _browse(reports: dict[str, Path]) -> dict:
    from playwright.sync_api import sync_playwright

    out: dict = {"js_errors": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("CHROMIUM", shutil.which("chromium")),
                                     args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            page.on("pageerror", lambda err: out["js_errors"].append(str(err)))
            for name, html in reports.items():
                page.goto(html.as_uri(), wait_until="load")
                out[name] = page.evaluate(MEASURE_JS)
                if name == "local":
                    page.screenshot(path=ARTIFACTS / "21_report_verdict.png")  # the first screen
                    page.screenshot(path=ARTIFACTS / "22_report_full.png", full_page=True)
                else:
                    page.screenshot(path=ARTIFACTS / "23_report_networks_full.png", full_page=True)
        finally:
            browser.close()
    return out


@pytest.fixture(scope="module")
def seen(tmp_path_factory, imdb_dir, bert_tiny_dir) -> dict:
    if not shutil.which("chromium") and not os.environ.get("CHROMIUM"):
        pytest.fail("chromium is not installed: run `bash scripts/system_deps.sh`")
    from pipelines.config import load_config

    root = tmp_path_factory.mktemp("report_browser") / "runs"

    def make_config(**overrides):
        return load_config("smoke", dict(dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir),
                                         model_source=str(bert_tiny_dir), output_root=str(root), **overrides))

    reports = {}
    for name, (config, failed) in _configs(make_config).items():
        paths, _ = write_synthetic_run(config, name=name, failed=failed)
        evaluate_run(config, paths)
        reports[name] = Path(build_report(config, paths)["html"])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = _browse(reports)
    (ARTIFACTS / "report_widths.json").write_text(json.dumps(out, indent=2))
    return out


@pytest.mark.parametrize("run", ["local", "networks"])
def test_verdict_is_the_first_section_on_the_first_screen(seen, run):
    page = seen[run]
    assert page["h2"][:2] == ["Verdict", "Comparison"]
    assert 0 < page["verdict_top"] < HEIGHT / 3  # under the title and the one-line setup
    assert page["verdict_blocks"][:3] == ["p", "ul", "p"] and page["verdict_chart_loaded"]  # lead, bullets, chart
    assert 3 <= len(page["verdict_items"]) <= 8
    assert page["verdict_items"][0].startswith(("At 1 worker, ddp is fastest", "At 2 workers over unshaped, ddp"))
    assert any(item.startswith("1 cell failed:") for item in page["verdict_items"])


@pytest.mark.parametrize("run", ["local", "networks"])
def test_no_table_is_wider_than_a_1280_pixel_window(seen, run):
    page = seen[run]
    assert page["tables"] >= 5  # time, quality, throughput/cost, study, phases (+ strategies, network)
    assert page["widest_table"] <= WIDTH and page["widest_table_scroll"] <= WIDTH, page
    assert page["page_scroll_width"] <= WIDTH  # no horizontal scrolling


def test_lists_render_as_lists(seen):
    assert seen["local"]["study_lists"] == 2  # the local modes' caveats and the notes
    assert seen["local"]["run_on_items"] == 0 and seen["networks"]["run_on_items"] == 0
    assert seen["js_errors"] == []


def test_screenshots_were_saved(seen):
    for name in ("21_report_verdict.png", "22_report_full.png", "23_report_networks_full.png"):
        data = (ARTIFACTS / name).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 20_000, name
