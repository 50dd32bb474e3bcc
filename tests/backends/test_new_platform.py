"""A platform defined in this file only, and nowhere else, goes through everything a platform
does: its settings in the config (by dotted path and flat name), preflight, a trained cell,
the report and the Benchmarks page's data. If this needs an edit outside this file, the
platform contract (``pipelines.platforms``) has a hole."""

from __future__ import annotations

import os

import pytest
from pydantic import BaseModel, ConfigDict

from pipelines import platforms
from pipelines.platforms import torchrun as launch
from pipelines.run import preflight
from pipelines.platforms.contract import TrainingBackend
from pipelines.training.cell import CellSpec
from pipelines.config import ConfigError, save_config
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards

CAVEAT = "Torchrun started by the test platform itself: it measures the shared loop alone."


class RelaySettings(BaseModel):
    """``engines.relay``: one setting its preflight reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_workers: int = 4


class RelayBackend(TrainingBackend):
    """The shared worker under torchrun, through the launch helpers every torchrun-based platform uses."""

    name = "relay"
    label = "Relay (a test platform)"
    colour = "#0f766e"
    settings = RelaySettings
    mode_caveats = {"relay-local": CAVEAT}
    study_overhead = 0.5

    def preflight(self, config, cells):
        limit = config.engine(self.name).max_workers
        too_many = [f"relay: {n} workers is over engines.relay.max_workers={limit}" for _, n in cells if n > limit]
        return [*too_many, *super().preflight(config, cells)]

    def launch(self, spec: CellSpec, launch_time: float) -> None:
        cmd = launch.worker_command(spec.config, spec.world_size, spec.cell_dir, launch_time)
        launch.execute(cmd, launch.launch_env(spec.config, os.environ, spec.world_size), spec.cell.log)

    def platform_fields(self, spec: CellSpec) -> dict:
        return {"platform_mode": "relay-local"}


def test_the_platform_is_registered_with_its_settings(bench_config):
    assert "relay" in platforms.names() and "relay" not in platforms.default_names()  # named runs only
    assert platforms.styles()["relay"] == {"label": "Relay (a test platform)", "colour": "#0f766e"}
    config = bench_config.model_copy(update={"backends": ["relay"], "engines.relay.max_workers": 1})
    assert config.engine("relay").max_workers == 1
    assert bench_config.model_copy(update={"relay_max_workers": 3}).engines.relay.max_workers == 3  # flat alias
    with pytest.raises(ConfigError, match="engines"):
        bench_config.model_copy(update={"engines.relay.no_such": 1})


def test_preflight_asks_the_platform(bench_config):
    config = bench_config.model_copy(update={"backends": ["relay"], "worker_counts": [1, 2],
                                             "engines.relay.max_workers": 1})
    assert preflight.problems(config, cells=[("relay", "default", 1)]) == []
    found = preflight.problems(config)
    assert any("over engines.relay.max_workers=1" in p for p in found), found
    with pytest.raises(ConfigError, match="relay: 2 workers"):
        preflight.check(config)


def test_a_cell_the_report_and_the_page_data(tmp_path, bench_config, imdb_dir, bert_tiny_dir):
    from pipelines.run.cells import run_cell
    from pipelines.run.evaluation import evaluate_run
    from pipelines.report import build_report
    from pipelines.web.data import load_run, trends_data

    paths = write_token_shards(RunPaths(tmp_path / "runs" / "relay-run"), imdb_dir, bert_tiny_dir,
                               train_per_class=48, test_per_class=24, seq_len=32, seed=3)
    config = bench_config.model_copy(update={
        "backends": ["ddp", "relay"], "worker_counts": [2], "epochs": 1, "max_seq_len": 32,
        "tracking.output_root": str(tmp_path / "runs")})
    save_config(config, paths.config)

    result = run_cell(config, paths, "relay", 2)  # torchrun: each rank imports this module (CellSpec)
    assert result.status == "ok" and result.backend == "relay" and result.platform_mode == "relay-local"
    assert result.test is not None and result.phases["compute"] > 0
    assert run_cell(config, paths, "ddp", 2).status == "ok"  # the reference the report compares with

    summary = evaluate_run(config, paths)
    assert [a.backend for a in summary.aggregates] == ["ddp", "relay"]
    md = open(build_report(config, paths)["markdown"]).read()
    assert "| relay |" in md.replace("`", "") or "| relay" in md
    assert f"relay (relay-local): {CAVEAT}" in md  # its mode's caveat, beside the study
    assert "+50 %" in md  # its declared study overhead

    page = trends_data(tmp_path / "runs", profile=config.profile)
    assert page["trends"]["platforms"]["relay"]["colour"] == "#0f766e"
    assert {s["backend"] for s in page["trends"]["series"]} == {"ddp", "relay"}
    assert {a["backend"] for a in load_run(paths.root).summary["aggregates"]} == {"ddp", "relay"}  # the run view
