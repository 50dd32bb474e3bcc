"""Markup in results and config renders inert everywhere it is shown: report.md, report.html and
the Benchmarks page (its HTML and the chart data the page's script reads).

One run folder is written through the project's own models with hostile text in a failed cell's
``error``, the config's ``dataset_source`` and an ok cell's platform mode, host and device; the
real evaluation, report and page modules render it. "Inert": no tag, no event handler attribute,
no ``javascript:`` link is produced; the text is still shown (escaped).
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest

from pipelines.evaluation import evaluate_run
from pipelines.report import build_report, render_html
from pipelines.runfolder.results import CellResult
from tests.synthetic_results import write_synthetic_run

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"
LINK = "[x](javascript:alert(3))"
HOSTILE = f"{SCRIPT} {IMG} {LINK} a|b `c` \\[d]"


class _Elements(HTMLParser):
    """Every start tag with its attributes (values unescaped), as a browser builds them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def assert_inert_html(html: str) -> None:
    """No markup came from the hostile text: no script or img element it made, no event handler
    attribute, no javascript:/data: link (the page's own scripts: src or JSON data only)."""
    parser = _Elements()
    parser.feed(html)
    for tag, attrs in parser.tags:
        assert not [k for k in attrs if k.startswith("on")], (tag, attrs)
        if tag == "script":
            assert attrs.get("src") or attrs.get("type") == "application/json", attrs
        assert tag != "img" or attrs.get("src") != "x", attrs
        for key in ("href", "src", "action"):
            scheme = urlsplit(attrs.get(key, "").strip()).scheme.lower()
            assert scheme in ("", "http", "https") or attrs[key].startswith("data:image/png;"), (tag, attrs)


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory, imdb_dir, bert_tiny_dir):
    """Two evaluated runs (the page compares them), the second hostile; read-only."""
    from pipelines.config import load_config

    root = tmp_path_factory.mktemp("escaping") / "runs"

    def config(**more):
        return load_config("smoke", dict(tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
                                         output_root=str(root), backends=["ddp", "spark"], worker_counts=[1, 2],
                                         **more))

    runs = {"older": config(dataset_source=str(imdb_dir)), "hostile": config(dataset_source=f"/data/{HOSTILE}")}
    for name, cfg in runs.items():
        paths, _ = write_synthetic_run(cfg, name=name, failed=("spark-w2-r0",))  # its manifest: the source
        if name == "hostile":
            failed, ok = paths.cell("spark", 2, 0), paths.cell("spark", 1, 0)
            CellResult.read(failed.result).model_copy(update={"error": f"RuntimeError: {HOSTILE}"}).write(failed.result)
            CellResult.read(ok.result).model_copy(update={
                "platform_mode": f"local {HOSTILE}", "host": f"host-{SCRIPT}", "device": f"cpu {LINK}",
            }).write(ok.result)
        evaluate_run(cfg, paths)
        build_report(cfg, paths)
    return root.resolve(), paths


def test_report_markdown_is_inert_and_still_shows_the_text(hostile_run):
    _, paths = hostile_run
    md = paths.report_markdown.read_text()
    for raw in (SCRIPT, IMG, LINK, "](javascript:"):
        assert raw not in md, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md  # shown, escaped
    failed = md.split("## Failed cells")[1].split("\n## ")[0]
    assert "spark-w2-r0: RuntimeError: &lt;script&gt;" in failed and "&#91;x&#93;(javascript:alert(3))" in failed
    assert "a&#124;b &#96;c&#96; &#92;&#91;d&#93;" in failed  # no table break, code span or escape
    comparison = md.split("## Comparison")[1].split("\n## ")[0]
    header, *rows = [ln for ln in comparison.splitlines() if ln.startswith("| ")]
    [row] = [ln for ln in rows if ln.startswith("| spark | local &lt;script&gt;")]  # the platform mode
    assert row.count(" | ") == header.count(" | ")  # its | did not add a column
    assert "host-&lt;script&gt;" in md and "cpu &#91;x&#93;(javascript:alert(3))" in md  # hardware
    verdict = md.split("## Verdict")[1].split("\n## ")[0]  # the error's first line, escaped there too
    assert "spark-w2-r0 — RuntimeError: &lt;script&gt;alert(1)&lt;/script&gt;" in verdict
    assert "&#91;x&#93;(javascript:alert(3))" in verdict and SCRIPT not in verdict


def test_report_html_is_inert(hostile_run):
    _, paths = hostile_run
    html = paths.report_html.read_text()
    assert_inert_html(html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "RuntimeError:" in html
    assert "&#91;x&#93;(javascript:alert(3))" in html  # a browser shows [x](javascript:alert(3)) as text
    assert html.count("data:image/png;base64,") == 6  # the plots (the verdict's chart first) are still embedded


def test_raw_html_in_markdown_is_not_rendered(tmp_path):
    """Whatever Markdown reaches the converter: raw HTML comes out as text, links keep only
    http(s) or relative URLs."""
    md = (f"# {SCRIPT}\n\n<div onclick=alert(4)>block</div>\n\n- {IMG} {LINK} "
          "[y](java&#9;script:alert(5)) [ok](https://example.org/) ![p](plot.png)\n")
    html = render_html(md, tmp_path)
    assert_inert_html(html)
    assert "<div" not in html and "&lt;div onclick=alert(4)&gt;" in html
    assert '<a href="https://example.org/">ok</a>' in html and 'src="plot.png"' in html


def test_page_views_are_inert(hostile_run):
    from fastapi.testclient import TestClient

    from pipelines.web.view import create_app

    root, _ = hostile_run
    client = TestClient(create_app(auth=lambda: None, root=root))
    for url in ["/runs?run=hostile", "/compare?a=older&b=hostile", "/?profile=smoke&window=all"]:
        resp = client.get(url)
        assert resp.status_code == 200, url
        assert_inert_html(resp.text)
        assert "script-src 'self'" in resp.headers["content-security-policy"]
    run = client.get("/runs?run=hostile").text
    assert "RuntimeError: &lt;script&gt;alert(1)&lt;/script&gt;" in run  # the failed cell's title
    verdict = run.split('<section class="verdict"')[1].split("</section>")[0]  # verdict.json's raw text, escaped
    assert "spark-w2-r0 — RuntimeError: &lt;script&gt;alert(1)&lt;/script&gt;" in verdict


def test_page_chart_data_is_inert_json(hostile_run):
    """The trends data (the page's <script id="trend-data"> and /api/trends) carries the error as
    data; in the page, nothing in it can close the script element."""
    from fastapi.testclient import TestClient

    from pipelines.web.view import create_app

    root, _ = hostile_run
    client = TestClient(create_app(auth=lambda: None, root=root))
    api = client.get("/api/trends?profile=smoke&window=all").json()
    errors = [e for s in api["series"] for m in s["metrics"].values() for e in m["failed"].values()]
    assert any(SCRIPT in e for e in errors)  # data, shown by benchmarks.js as canvas text only
    page = client.get("/?profile=smoke&window=all").text
    data = page.split('<script id="trend-data" type="application/json">')[1].split("</script>")[0]
    assert "<" not in data and ">" not in data  # \u003c...: the element cannot be closed early
    assert json.loads(data)["series"] == api["series"]
