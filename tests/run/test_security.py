"""Hostile input: markup in errors and sources, shell metacharacters in run ids, run ids that
try to leave the output root or collide. Real report, real FastAPI app, real config builders."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest

from pipelines.platforms.determined.adapter import experiment_config, validate_experiment_config
from pipelines.evaluation import evaluate_run
from pipelines.runfolder.paths import safe_run_id
from pipelines.report import build_report
from pipelines.runfolder.results import CellResult
from pipelines.run.stages import prepare_run
from tests.synthetic_results import write_synthetic_run

SCRIPT = "<script>alert(document.cookie)</script>"
IMG = '"><img src=x onerror=alert(1)>'


def test_report_escapes_errors_and_sources(make_config):
    config = make_config(backends=["ddp"], worker_counts=[1, 2], model_source=f"/models/{IMG}")
    paths, _ = write_synthetic_run(config, failed=("ddp-w2-r0",))
    cell = paths.cell("ddp", 2, 0)
    failed = CellResult.read(cell.result).model_copy(update={"error": f"RuntimeError: {SCRIPT} {IMG}"})
    failed.write(cell.result)
    evaluate_run(config, paths)
    build_report(config, paths)
    html = paths.report_html.read_text()
    assert "<script>" not in html and "<img src=x" not in html and "onerror=alert(1)>" not in html
    assert "&lt;script&gt;" in html  # shown, inert


def test_report_is_served_sandboxed(make_config, tmp_path):
    from fastapi.testclient import TestClient

    from pipelines.web.view import create_app

    config = make_config(backends=["ddp"], worker_counts=[1], output_root=str(tmp_path / "runs"))
    paths, _ = write_synthetic_run(config, name="hostile")
    evaluate_run(config, paths)
    build_report(config, paths)
    client = TestClient(create_app(auth=lambda: None, root=tmp_path / "runs"))
    resp = client.get("/runs/hostile/report/report.html")
    assert resp.status_code == 200
    assert "sandbox" in resp.headers["content-security-policy"]
    assert "script-src" not in resp.headers["content-security-policy"]  # default-src 'none' covers it
    assert resp.headers["x-content-type-options"] == "nosniff"


def test_run_ids_map_to_safe_unique_folders(make_config, tmp_path):
    for raw in (".", "..", "../../etc", "./.hidden", "a/../../b"):
        name = safe_run_id(raw)
        assert name not in (".", "..") and not name.startswith(".") and "/" not in name, name
    assert safe_run_id("nightly-1") == "nightly-1"  # clean ids stay as they are
    assert safe_run_id("run:1") != safe_run_id("run+1")  # cleaned alike, kept apart
    config = make_config(output_root=str(tmp_path / "out"))
    run_dir = prepare_run("smoke", {"output_root": str(tmp_path / "out"), "dataset_source": config.data.dataset_source,
                                    "tokenizer_source": config.data.tokenizer_source,
                                    "model_source": config.training.model_source}, "../../escape")
    assert Path(run_dir).parent == (tmp_path / "out").resolve() and "escape" in Path(run_dir).name


def test_determined_entrypoint_is_an_argument_list(make_config, tmp_path):
    cell = tmp_path / "runs" / "it's a \"run\"; rm -rf ~" / "cells" / "determined-w2-r0"
    conf = experiment_config(make_config(), 2, cell, 1.5, train_records=100)
    validate_experiment_config(conf)
    entry = conf["entrypoint"]
    assert isinstance(entry, list) and entry[entry.index("--cell-dir") + 1] == str(cell)
    assert not any(";" in part for part in entry if part != str(cell))


@pytest.mark.parametrize("raw", ["a b", "quote'd", 'dq"x', "semi;colon"])
def test_odd_run_ids_are_one_folder_each(raw):
    name = safe_run_id(raw)
    assert all(c.isalnum() or c in "._-" for c in name)


# --- the profile: only known names, wherever it enters ---------------------------------------------

def test_unknown_profiles_are_refused_with_the_allowed_names(tmp_path):
    from pipelines.config import PROFILES, BenchmarkConfig, ConfigError, load_config, read_config

    allowed = ", ".join(PROFILES)
    with pytest.raises(ConfigError, match=rf"^profile: unknown profile .*\(allowed: {allowed}\)"):
        load_config(IMG)
    with pytest.raises(ConfigError, match=rf"^overrides\.profile: unknown profile .*\(allowed: {allowed}\)"):
        load_config("smoke", {"profile": "<img src=x onerror=alert(1)>"})
    with pytest.raises(ConfigError, match="overrides.profile"):
        load_config("smoke", {"profile": ["smoke"]})
    assert load_config("smoke", {"profile": "nightly"}).profile == "nightly"  # a known name is fine
    # config.json: the field itself; "custom" (a config built without a profile) still loads
    assert BenchmarkConfig().profile == "custom"
    good = tmp_path / "good.json"
    good.write_text(BenchmarkConfig(profile="custom").to_json())
    assert read_config(good).profile == "custom"
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text().replace('"profile": "custom"', f'"profile": {json.dumps(SCRIPT)}'))
    assert SCRIPT in bad.read_text()
    with pytest.raises(ConfigError, match=rf"profile: .*unknown profile \(allowed: {allowed}, custom\)"):
        read_config(bad)


def test_trigger_overrides_with_an_unknown_profile_are_refused():
    from pipelines.config import ConfigError
    from pipelines.run.dag_plan import overrides_from_params  # the DAG's trigger conf -> config overrides

    params = {"profile": "smoke", "overrides": {}}
    assert overrides_from_params(params, {}) == {}
    for hostile, field in [({"overrides": {"profile": "<img src=x onerror=alert(1)>"}}, "overrides.profile"),
                           ({"profile": "smoke\r\nBcc: x@example.org"}, "profile")]:
        with pytest.raises(ConfigError, match=rf"^{re.escape(field)}: unknown profile .*\(allowed: smoke, "):
            overrides_from_params({**params, **hostile}, {})


# --- alert mails ---------------------------------------------------------------------------------

def test_alert_subjects_have_no_control_characters(make_config):
    from pipelines.tracking.alerts import MAX_SUBJECT, build_alert

    config = make_config(backends=["ddp"], worker_counts=[1, 2])
    paths, _ = write_synthetic_run(config, failed=("ddp-w2-r0",))
    evaluate_run(config, paths)
    for alert in (build_alert(paths.root, "run\r\nBcc: victim@example.org", "train",
                              RuntimeError("boom\r\nBcc: x@example.org")),
                  build_alert(None, "run\nX-Injected: 1", "prepare_run", RuntimeError("a\u2028b\x00c\u202ed\te")),
                  build_alert(None, None, None, RuntimeError(""))):
        assert not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in alert.subject), alert.subject
        assert len(alert.subject) <= MAX_SUBJECT and alert.subject.startswith("[benchmark] ")
    assert "run Bcc: victim@example.org" in build_alert(paths.root, "run\r\nBcc: victim@example.org").subject
