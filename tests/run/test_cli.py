"""``python -m pipelines``: the whole benchmark without Airflow, one cell, and a re-report
from the run folder alone into a fresh MLflow store (a lost tracking server loses nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipelines.runfolder.paths import RunPaths

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "pipelines", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def data_options(imdb_dir: Path, bert_tiny_dir: Path) -> list[str]:
    return ["--set", f"dataset_source={imdb_dir}", "--set", f"tokenizer_source={bert_tiny_dir}",
            "--set", f"model_source={bert_tiny_dir}", "--set", "train_samples=160",
            "--set", "test_samples=80", "--set", "epochs=1"]


@pytest.mark.slow
def test_run_then_rereport_into_a_fresh_store(tmp_path, imdb_dir, bert_tiny_dir):
    out = tmp_path / "runs"
    proc = cli("run", "--profile", "smoke", "--output", str(out), "--run-id", "cli-run",
               "--set", 'backends=["ddp"]', "--set", "worker_counts=[1]",
               *data_options(imdb_dir, bert_tiny_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = out / "cli-run"
    result = json.loads((RunPaths(run_dir).cell("ddp", 1, 0).result).read_text())
    assert result["status"] == "ok" and len(result["epochs"]) == 1
    # nothing of the run beside the timed cell: the data stage's JVM ended with its step
    assert result["resources"]["run_processes_outside"] == {}, result["resources"]
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["aggregates"][0]["key"] == "ddp-w1"
    # what it takes, measured in this run: torchrun and its rank started in the cell, the rendezvous
    # store's port, nothing to install beyond torch and transformers; in the report
    [needs] = summary["what_it_takes"]
    assert needs["platform"] == "ddp" and needs["measured_cell"] == "ddp-w1-r0" and needs["install_mb"] == 0
    assert "rank 1" in needs["processes_per_cell"] and "torchrun 1" in needs["processes_per_cell"], needs
    assert needs["ports_per_cell"] >= 1 and needs["package_lines"] > 50, needs
    assert needs["cluster_config"] == "engines.ddp.nnodes, engines.ddp.node_rank, engines.ddp.rdzv_endpoint"
    assert "## What it takes to run each platform" in (run_dir / "report" / "report.md").read_text()
    assert (out / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()  # never a cwd store

    # `run --run-dir` on a finished run trains nothing: every cell's result stands
    before = RunPaths(run_dir).cell("ddp", 1, 0).result.read_bytes()
    proc = cli("run", "--run-dir", str(run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ddp-w1-r0 already finished" in proc.stderr and "skipped" in proc.stderr
    assert RunPaths(run_dir).cell("ddp", 1, 0).result.read_bytes() == before

    # The tracking server is "lost": re-report from the folder alone into a new store.
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    proc = cli("report", str(run_dir), "--tracking-uri", fresh, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=fresh)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    names = {r.data.tags.get("mlflow.runName") for r in runs}
    assert "cli-run" in names and any(n and n.startswith("ddp-w1-r0") for n in names), names
    cell = next(r for r in runs if r.data.tags.get("mlflow.parentRunId"))
    assert cell.data.metrics["test_accuracy"] == pytest.approx(result["test"]["accuracy"])
    # The trained model is an artifact in Hugging Face format that loads back.
    artifacts = {a.path for a in client.list_artifacts(cell.info.run_id, "model")}
    assert {"model/config.json", "model/model.safetensors"} <= artifacts, artifacts
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(result["model_path"])
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 128


@pytest.mark.slow
@pytest.mark.heavy  # ~2.5 min; CI: the same policy through the DAG (its ddp cell fails twice, retried twice)
def test_a_failing_cell_is_retried_cell_retries_times(tmp_path, imdb_dir, bert_tiny_dir):
    """The CLI's retries are matrix.cell_retries (2 by default), as the DAG's
    (tests/airflow/test_dag.py::test_dags_test_runs_the_whole_benchmark)."""
    from tests import fault_injection

    common = ("train", "--backend", "ddp", "--workers", "1", "--profile", "smoke", "--output", str(tmp_path / "out"),
              *data_options(imdb_dir, bert_tiny_dir), "--set", "training.epochs=3")
    proc = cli(*common, "--run-id", "two-fail", cwd=tmp_path, **fault_injection.fail_env(2, ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((RunPaths(tmp_path / "out" / "two-fail").cell("ddp", 1, 0).result).read_text())
    assert result["status"] == "ok"
    assert [a["outcome"] for a in result["attempts"]] == ["failed", "failed", "ok"]  # 2 retries
    assert [e["epoch"] for e in result["epochs"]] == [1, 2, 3]  # each retry resumed where the last stopped
    assert "retry 2 of 2 resumes" in proc.stderr


@pytest.mark.slow
@pytest.mark.heavy  # ~100 s: a third data stage and three more launches
def test_a_cell_failing_every_try_fails_the_command(tmp_path, imdb_dir, bert_tiny_dir):
    from tests import fault_injection

    common = ("train", "--backend", "ddp", "--workers", "1", "--profile", "smoke", "--output", str(tmp_path / "out"),
              *data_options(imdb_dir, bert_tiny_dir), "--set", "training.epochs=3")  # try k fails in epoch k
    proc = cli(*common, "--run-id", "three-fail", cwd=tmp_path, **fault_injection.fail_env(3, ROOT))
    assert proc.returncode == 1 and "fault injection: try 3" in proc.stderr
    result = json.loads((RunPaths(tmp_path / "out" / "three-fail").cell("ddp", 1, 0).result).read_text())
    assert result["status"] == "failed" and [a["outcome"] for a in result["attempts"]] == ["failed"] * 3


@pytest.mark.slow
@pytest.mark.heavy  # 37 s in CI; preflight's own checks per cell: tests/config/test_settings_bounds.py (fast)
def test_train_checks_only_the_cell_it_trains(tmp_path, imdb_dir, bert_tiny_dir):
    """The run's determined cells could not take powersgd; training a ddp cell does not care."""
    proc = cli("train", "--backend", "ddp", "--workers", "2", "--strategy", "powersgd-r2", "--profile", "smoke",
               "--output", str(tmp_path / "out"), "--run-id", "one", *data_options(imdb_dir, bert_tiny_dir),
               "--set", 'matrix.strategies=["powersgd-r2"]', "--set", "training.epochs=1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((RunPaths(tmp_path / "out" / "one").cell("ddp", 2, 0, "powersgd-r2").result).read_text())
    assert result["status"] == "ok" and result["strategy"] == "powersgd-r2"
    assert result["backend"] == "ddp" and result["world_size"] == 2 and result["test"]["accuracy"] > 0


def test_bad_input_is_refused_with_the_field_named(tmp_path):
    proc = cli("data", "--profile", "smoke", "--output", str(tmp_path), "--set", "epochs=0", cwd=tmp_path)
    assert proc.returncode == 2 and "epochs" in proc.stderr
    proc = cli("report", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert proc.returncode == 2 and "not a run folder" in proc.stderr


def test_a_doomed_run_fails_in_seconds_before_the_data_stage(tmp_path, imdb_dir, bert_tiny_dir):
    start = time.monotonic()
    proc = cli("train", "--backend", "ddp", "--workers", "0", "--profile", "smoke", "--output",
               str(tmp_path / "out"), "--run-id", "zero", *data_options(imdb_dir, bert_tiny_dir), cwd=tmp_path)
    assert proc.returncode == 2 and "workers: 0 is not a worker count" in proc.stderr
    assert not RunPaths(tmp_path / "out" / "zero").snapshot.exists()  # no data stage ran

    proc = cli("data", "--profile", "smoke", "--output", str(tmp_path / "out"), "--run-id", "bad-model",
               *data_options(imdb_dir, bert_tiny_dir), "--set", f"model_source={tmp_path / 'no-model'}",
               cwd=tmp_path)
    assert proc.returncode == 2 and "model_source=" in proc.stderr and "no-model" in proc.stderr
    assert time.monotonic() - start < 120  # seconds of checks, never a Spark job
