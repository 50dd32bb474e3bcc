"""A platform defined in one folder, ``tests/platforms/relay/`` (declaration, adapter, training
process), and nowhere else, goes through everything a platform does: its settings in the config
(by dotted path and flat name), preflight, a trained cell on this host and across two emulated
hosts, the report (with the cost table), the Benchmarks page's data and the DAG's trigger form.
If this needs an edit outside that folder, the platform contract (``pipelines.platforms``) has a hole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import tests.platforms.relay as relay
from pipelines import platforms
from pipelines.cluster import why_unavailable
from pipelines.config import ConfigError, save_config
from pipelines.run import preflight
from pipelines.runfolder.paths import PROJECT_ROOT, RunPaths
from tests.token_shards import write_token_shards


def test_the_platform_is_registered_with_its_settings(one_epoch_config):
    assert "relay" in platforms.names() and "relay" not in platforms.default_names()  # named runs only
    assert platforms.styles()["relay"] == {"label": "Relay (a test platform)", "colour": "#0f766e"}
    assert platforms.get("relay").package == "tests.platforms.relay"
    config = one_epoch_config.model_copy(update={"backends": ["relay"], "engines.relay.max_workers": 1})
    assert config.engine("relay").max_workers == 1
    assert one_epoch_config.model_copy(update={"relay_max_workers": 3}).engines.relay.max_workers == 3  # flat alias
    with pytest.raises(ConfigError, match="engines"):
        one_epoch_config.model_copy(update={"engines.relay.no_such": 1})


def test_preflight_asks_the_platform(one_epoch_config):
    config = one_epoch_config.model_copy(update={"backends": ["relay"], "worker_counts": [1, 2],
                                             "engines.relay.max_workers": 1})
    assert preflight.problems(config, cells=[("relay", "default", 1)]) == []
    found = preflight.problems(config)
    assert any("over engines.relay.max_workers=1" in p for p in found), found
    with pytest.raises(ConfigError, match="relay: 2 workers"):
        preflight.check(config)


@pytest.mark.slow
def test_the_trigger_form_offers_it_when_the_deployment_names_it(tmp_path):
    """The DAG file, parsed in a process of its own with BENCHMARK_PLATFORMS naming the folder."""
    code = ("import json; from airflow.dag_processing.dagbag import DagBag; "
            "dag = DagBag(dag_folder='dags').dags['imdb_benchmark']; "
            "print(json.dumps(dag.params.get_param('backends').schema['items']['enum']))")
    env = {**os.environ, platforms.PLUGINS_ENV: "tests.platforms.relay", "PYTHONPATH": str(PROJECT_ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "relay" in json.loads(out.stdout.strip().splitlines()[-1])


def _relay_run(tmp_path, one_epoch_config, imdb_dir, bert_tiny_dir, name: str, **update):
    paths = write_token_shards(RunPaths(tmp_path / "runs" / name), imdb_dir, bert_tiny_dir,
                               train_per_class=48, test_per_class=24, seq_len=32, seed=3)
    config = one_epoch_config.model_copy(update={
        "backends": ["ddp", "relay"], "worker_counts": [2], "epochs": 1, "max_seq_len": 32,
        "tracking.output_root": str(tmp_path / "runs"), **update})
    save_config(config, paths.config)
    return config, paths


@pytest.mark.slow
def test_a_cell_the_report_the_costs_and_the_page_data(tmp_path, one_epoch_config, imdb_dir, bert_tiny_dir):
    from pipelines.report import build_report
    from pipelines.run.cells import run_cell
    from pipelines.evaluation import evaluate_run
    from pipelines.web.data import load_run, trends_data

    config, paths = _relay_run(tmp_path, one_epoch_config, imdb_dir, bert_tiny_dir, "relay-run")
    result = run_cell(config, paths, "relay", 2)  # torchrun: each rank imports the folder (CellSpec)
    assert result.status == "ok" and result.backend == "relay" and result.platform_mode == "relay-local"
    assert result.test is not None and result.phases["compute"] > 0
    assert result.resources is not None
    assert run_cell(config, paths, "ddp", 2).status == "ok"  # the reference the report compares with

    summary = evaluate_run(config, paths)
    assert [a.backend for a in summary.aggregates] == ["ddp", "relay"]
    md = open(build_report(config, paths)["markdown"]).read()
    assert "| relay" in md.replace("`", "")
    assert f"relay (relay-local): {relay.CAVEAT}" in md  # its mode's caveat, beside the study
    assert "+50 %" in md  # its declared study overhead
    costs = md[md.index("## What each platform costs"):]
    assert "| relay" in costs.replace("`", "")  # a row of the cost table

    page = trends_data(tmp_path / "runs", profile=config.profile)
    assert page["trends"]["platforms"]["relay"]["colour"] == "#0f766e"
    assert {s["backend"] for s in page["trends"]["series"]} == {"ddp", "relay"}
    assert {a["backend"] for a in load_run(paths.root).summary["aggregates"]} == {"ddp", "relay"}  # the run view


_NO_NETNS = why_unavailable()


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_a_cell_across_two_emulated_hosts(tmp_path, one_epoch_config, imdb_dir, bert_tiny_dir):
    from pipelines.cluster import EmulatedCluster
    from pipelines.run.cells import run_cell

    config, paths = _relay_run(tmp_path, one_epoch_config, imdb_dir, bert_tiny_dir, "relay-hosts")
    with EmulatedCluster("relayx", hosts=2, network="unshaped") as cluster:
        result = run_cell(config, paths, "relay", 2, hosts=cluster.hosts)
    assert result.status == "ok", result.error
    assert result.platform_mode == "relay-2-hosts" and len(result.placements) == 2
    assert set(result.link_bytes) == {"h0", "h1"}
