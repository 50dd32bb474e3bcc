"""The imdb_benchmark DAG: import, graph, params, parse cost, and real `airflow dags test` runs.

    .venv/bin/python -m pytest tests/airflow -q            # all (~3 min on 2 cores)
    .venv/bin/python -m pytest tests/airflow -q -m "not slow"  # in-process checks only (~10 s)

The end-to-end tests run the real Airflow CLI on an isolated SQLite home prepared by
scripts/airflow_setup.sh, on the real IMDB copy and BERT-tiny from ../shared/data.
"""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipelines import platforms
from pipelines.runfolder.paths import RunPaths, safe_run_id
from tests import fault_injection

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DAGS_DIR = PROJECT_ROOT / "dags"
DAG_FILE = DAGS_DIR / "imdb_benchmark.py"
TRAIN_IDS = [f"train.w{n}" for n in range(1, 5)]
PLAN_IDS = [f"train.plan_w{n}" for n in range(1, 5)]


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_DIR))


@pytest.fixture(scope="module")
def dag(dagbag):
    return dagbag.dags["imdb_benchmark"]


@pytest.fixture(scope="module")
def scheduler_params(dag):
    """The params as the scheduler/API server holds them (what validates a trigger's conf)."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).params


def test_dags_folder_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == {"imdb_benchmark"}


# A DAG with the Airflow imports of dags/imdb_benchmark.py and nothing of the project's: parsed
# first, it loads the DAG machinery any DAG file needs, so the real file's parse after it is the
# project's own cost.
REFERENCE_DAG = """
from airflow.providers.smtp.notifications.smtp import SmtpNotifier  # noqa: F401
from airflow.sdk import Param, TaskGroup, dag, task


@dag(dag_id="reference", schedule=None, params={"n": Param(1, type="integer")})
def reference():
    @task
    def one():
        return 1

    with TaskGroup("group"):
        task(lambda x: x, task_id="echo")(one())


reference()
"""
PARSE = """
import json, sys, time
c = time.process_time()
from airflow.dag_processing.dagbag import DagBag
airflow_s = time.process_time() - c
assert DagBag(dag_folder=sys.argv[1]).import_errors == {}
c = time.process_time()
bag = DagBag(dag_folder=sys.argv[2])
parse_s = time.process_time() - c
heavy = sorted(m for m in ('torch', 'pyspark', 'transformers', 'great_expectations', 'mlflow', 'determined',
                           'ray', 'pandas', 'pipelines.run.stages') if m in sys.modules)
print(json.dumps({"airflow_s": airflow_s, "parse_s": parse_s, "ok": bag.import_errors == {}, "heavy": heavy}))
"""
PARSE_SHARE = 0.25  # of importing Airflow; measured ~0.04 (bench/RESULTS.md, "Tests and CI")


def test_dag_file_parses_fast_without_heavy_imports(tmp_path):
    """Parse of the file in a fresh interpreter, as the DAG processor parses it, after Airflow
    itself is imported and a reference DAG with the same Airflow imports is parsed: no heavy module
    imported, and the parse's CPU time a small share of importing Airflow, measured in the same
    process (CPU time, not wall time: the suite's other processes share the CPUs). With the
    project's bytecode cached (the first parse writes it; this machine's environment may say
    PYTHONDONTWRITEBYTECODE, which would make every parse compile ~300 files)."""
    reference = tmp_path / "reference_dag.py"
    reference.write_text(REFERENCE_DAG)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    parses = [json.loads(subprocess.run([sys.executable, "-c", PARSE, str(reference), str(DAG_FILE)],
                                        cwd=PROJECT_ROOT, capture_output=True, text=True, env=env, timeout=120,
                                        check=True).stdout.splitlines()[-1])
              for _ in range(3)]  # the first writes the bytecode; then the lower share of two
    for parse in parses:
        assert parse["ok"]
        assert parse["heavy"] == [], f"DAG file imports heavy modules at parse time: {parse['heavy']}"
    shares = [p["parse_s"] / p["airflow_s"] for p in parses[1:]]
    assert min(shares) < PARSE_SHARE, (
        f"parsing the DAG file took {min(shares):.2f} of the CPU time of importing Airflow: {parses[1:]}")


def test_task_graph(dag):
    assert set(dag.task_dict) == {
        "prepare_run", "start_services", "start_cluster", "ingest", "validate_snapshot", "preprocess",
        "validate_tokens", *PLAN_IDS, *TRAIN_IDS, "stop_services", "stop_cluster", "evaluate", "report",
        "track", "check_regression",
    }
    up = {tid: t.upstream_task_ids for tid, t in dag.task_dict.items()}
    assert up["prepare_run"] == set()
    # the embedded Spark cluster (spark_master=embedded): a setup before the data stage, a
    # teardown after every train task that runs whatever happened before it
    assert up["start_services"] == {"prepare_run"} and dag.task_dict["start_services"].is_setup
    assert up["stop_services"] == {"prepare_run", "start_services", *TRAIN_IDS}
    assert dag.task_dict["stop_services"].is_teardown
    # the run's emulated hosts (cluster.kind=emulated): the same setup / teardown pair
    assert up["start_cluster"] == {"prepare_run"} and dag.task_dict["start_cluster"].is_setup
    assert up["stop_cluster"] == {"prepare_run", "start_cluster", *TRAIN_IDS}
    assert dag.task_dict["stop_cluster"].is_teardown
    assert up["ingest"] == {"prepare_run", "start_services", "start_cluster"}
    assert up["validate_snapshot"] == {"prepare_run", "ingest"}
    assert up["preprocess"] == {"prepare_run", "validate_snapshot"}
    assert up["validate_tokens"] == {"prepare_run", "preprocess"}
    for n in range(1, 5):
        assert up[f"train.plan_w{n}"] == {"prepare_run", "validate_tokens"}
        assert up[f"train.w{n}"] == {"prepare_run", f"train.plan_w{n}"}
    assert up["evaluate"] == {"prepare_run", *TRAIN_IDS}
    assert up["report"] == {"prepare_run", "evaluate"}
    assert up["track"] == {"prepare_run", "report"}
    assert up["check_regression"] == {"prepare_run", "track"}
    assert dag.task_dict["evaluate"].trigger_rule == "all_done"
    # the data steps and the steps after training are the CLI's (pipelines.run.runner), in the same order
    from pipelines.run.runner import DATA_STEPS, FINISH_STEPS

    assert DATA_STEPS == ("ingest", "validate_snapshot", "preprocess", "validate_tokens")
    for steps in (DATA_STEPS, FINISH_STEPS):
        for before, after in zip(steps, steps[1:]):
            assert up[after] == {"prepare_run", before} and dag.task_dict[after].trigger_rule == "all_success"


def test_train_tasks_are_mapped_and_hold_one_pool_slot_per_worker(dag):
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    for n in range(1, 5):
        train = dag.task_dict[f"train.w{n}"]
        assert isinstance(train, MappedOperator)
        assert (train.pool, train.pool_slots) == ("training_workers", n)
        # the cell's retries are pipelines.run.stages.train_cell's (matrix.cell_retries), the CLI's too
        assert train.retries == 0
        assert "backend" in train.map_index_template and "workers" in train.map_index_template
    assert dag.task_dict["ingest"].pool == "default_pool"


def test_schedule_and_run_limits(dag):
    from airflow.sdk import CronTriggerTimetable

    assert isinstance(dag.timetable, CronTriggerTimetable)
    tt = dag.timetable
    assert (tt.expression, str(tt.timezone)) == ("0 2 * * *", "UTC")
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    assert dag.params["profile"] == "nightly"  # what the scheduled run uses
    assert "prepare_run" in dag.doc_md and "training_workers" in dag.doc_md


@pytest.mark.parametrize("now", ["01:55", "02:05", "04:00", "23:59"])
def test_unpausing_the_dag_waits_for_the_next_nightly_whenever_it_happens(dag, now):
    """The scheduler's timetable (the DAG's, as the scheduler deserializes it): with no run yet, the
    first run is the next 02:00 UTC, whatever the time of the unpause (Airflow 3.3's run_immediately=False
    ran the last 02:00 at once up to 2.4 h after it: the compose stack test's unpause started a nightly)."""
    from unittest import mock

    import pendulum
    from airflow.serialization.encoders import encode_timetable
    from airflow.serialization.decoders import decode_timetable
    from airflow.timetables import trigger
    from airflow.timetables.base import TimeRestriction

    timetable = decode_timetable(encode_timetable(dag.timetable))
    at = pendulum.parse(f"2026-12-04T{now}:00Z")
    with mock.patch.object(trigger, "utcnow", return_value=at):
        first = timetable.next_dagrun_info(last_automated_data_interval=None,
                                           restriction=TimeRestriction(earliest=None, latest=None, catchup=False))
    assert first.run_after > at and first.run_after.hour == 2 and (first.run_after - at).total_seconds() <= 86400


def test_params_mirror_the_config(dag):
    from pipelines.config import PROFILES, field_paths
    from pipelines.config.sections import DataConfig

    from pipelines.run.dag_plan import param_specs

    schema = {k: dag.params.get_param(k).schema for k in dag.params}
    assert list(schema) == list(param_specs())  # the form is the library's, field by field
    assert schema["profile"]["enum"] == list(PROFILES)
    assert schema["backends"]["items"]["enum"] == platforms.names()
    assert schema["backends"]["examples"] == platforms.names()  # the UI's multi-select
    assert (schema["epochs"]["minimum"], schema["epochs"]["maximum"]) == (1, 1000)
    lr = schema["learning_rate"]
    assert (lr["exclusiveMinimum"], lr["exclusiveMaximum"]) == (0, 1)
    assert schema["max_seq_len"]["minimum"] == DataConfig.model_fields["max_seq_len"].metadata[0].ge
    # every form field but profile/overrides is a config field (its flat name), optional (null = profile's value)
    for key, s in schema.items():
        if key not in ("profile", "overrides"):
            assert key in field_paths() and "null" in s["type"], key
            assert s.get("title") and s.get("section"), key


@pytest.mark.parametrize("conf, field", [
    ({"backends": ["horovod"]}, "backends"),
    ({"backends": []}, "backends"),
    ({"epochs": 0}, "epochs"),
    ({"worker_counts": [0]}, "worker_counts"),
    ({"worker_counts": [5]}, "worker_counts"),
    ({"profile": "huge"}, "profile"),
    ({"learning_rate": 1.5}, "learning_rate"),
    ({"max_seq_len": 4}, "max_seq_len"),
    ({"train_samples": 1}, "train_samples"),
    ({"target_accuracy": 0}, "target_accuracy"),
    ({"epochs": "three"}, "epochs"),
    ({"strategies": ["powersgd-rx"]}, "strategies"),
    ({"strategies": ["fp16+nonsense"]}, "strategies"),
    ({"class_ratio": 1.5}, "class_ratio"),
])
def test_trigger_conf_with_bad_values_is_refused(scheduler_params, conf, field):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"param {field}"):
        scheduler_params.deep_merge(conf).validate()


def test_trigger_conf_with_good_values_is_accepted(scheduler_params):
    conf = {"profile": "smoke", "backends": ["ddp", "spark"], "worker_counts": [1, 2], "epochs": 1,
            "learning_rate": 0.001, "overrides": {"seed": 7},
            "strategies": ["default", "powersgd-r4", "localsgd-8", "fsdp+weighted_loss"], "class_ratio": 0.2}
    resolved = copy.deepcopy(scheduler_params).deep_merge(conf).validate()
    assert resolved["backends"] == ["ddp", "spark"] and resolved["epochs"] == 1
    from pipelines.run.dag_plan import config_from_params

    config = config_from_params(resolved, {})  # the form's names parse in the config
    assert [s.name for s in config.matrix.strategies] == conf["strategies"] and config.data.class_ratio == 0.2
    assert resolved["batch_size"] is None  # left empty: the profile's value


def test_params_become_config_overrides():
    from pipelines.config import PROFILES, load_config
    from pipelines.run.dag_plan import overrides_from_params

    env = {"BENCHMARK_OUTPUT_ROOT": "/srv/runs", "BENCHMARK_DATASET_SOURCE": "/srv/imdb"}
    params = {"profile": "smoke", "backends": [], "worker_counts": [1], "epochs": None,
              "batch_size": 8, "overrides": {"seed": 3}}
    overrides = overrides_from_params(params, env)
    assert overrides == {"tracking.output_root": "/srv/runs", "data.dataset_source": "/srv/imdb",
                         "worker_counts": [1], "batch_size": 8, "seed": 3}
    config = load_config("smoke", overrides)
    assert config.training.epochs == PROFILES["smoke"]["epochs"] and config.training.batch_size == 8 and config.matrix.backends  # profile + params
    # where a run reads, writes and reports is the deployment's: a trigger cannot move it
    for hostile in ({"overrides": {"mlflow_tracking_uri": "http://evil.example"}},
                    {"overrides": {"output_root": "/"}}, {"dataset_source": "/etc"},
                    {"overrides": {"spark_master": "spark://evil:7077", "determined_master": "x"}},
                    {"overrides": {"ray_address": "ray://evil:10001"}},
                    {"overrides": {"engines.spark.master": "spark://evil:7077"}},
                    {"overrides": {"tracking": {"output_root": "/"}}}):
        with pytest.raises(ValueError, match="set by the deployment"):
            overrides_from_params({**params, **hostile}, env)
    with pytest.raises(ValueError, match='bogus_field: not a trigger field .*put other config fields in "overrides"'):
        overrides_from_params({**params, "bogus_field": 3}, env)  # never silently ignored


def test_cells_are_grouped_by_worker_count_and_checked_against_the_pool():
    from pipelines.config import load_config
    from pipelines.run.dag_plan import plan_by_workers

    cells = load_config("smoke", {"backends": ["ddp", "spark"], "worker_counts": [1, 2]}).cells()
    plan = plan_by_workers(cells, pool_slots=2)
    assert plan["w1"] == [{"backend": "ddp", "strategy": "default", "network": "local", "workers": 1, "repeat": 0},
                          {"backend": "spark", "strategy": "default", "network": "local", "workers": 1, "repeat": 0}]
    assert [c["backend"] for c in plan["w2"]] == ["ddp", "spark"] and plan["w3"] == plan["w4"] == []
    with pytest.raises(ValueError, match="pool 'training_workers'.*has 1"):
        plan_by_workers(cells, pool_slots=1)
    with pytest.raises(ValueError, match="maximum 4"):
        plan_by_workers([("ddp", "default", "local", 5, 0)], pool_slots=None)


# --- end to end: the real CLI, scheduler loop and tasks -------------------------------------------


def _dags_test(env: dict, conf: dict, timeout: int = 420) -> subprocess.CompletedProcess:
    return subprocess.run(["airflow", "dags", "test", "imdb_benchmark", "-c", json.dumps(conf)],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _deployment(env: dict, out: Path, data: Path, model: Path) -> dict:
    """The deployment's settings (what scripts/airflow_env.sh exports), not trigger params."""
    return {**env, "BENCHMARK_OUTPUT_ROOT": str(out), "BENCHMARK_DATASET_SOURCE": str(data),
            "BENCHMARK_TOKENIZER_SOURCE": str(model), "BENCHMARK_MODEL_SOURCE": str(model)}


def _task_states(home: Path, run_dir: Path) -> dict[str, list[str]]:
    """Task states of the run that wrote run_dir, read from the metadata DB."""
    with sqlite3.connect(home / "airflow.db") as db:
        rows = db.execute("SELECT task_id, run_id, state FROM task_instance "
                          "WHERE dag_id = 'imdb_benchmark'").fetchall()
    states: dict[str, list[str]] = {}
    for task_id, run_id, state in rows:
        if safe_run_id(run_id) == run_dir.name:
            states.setdefault(task_id, []).append(state)
    return states


def _only_run_dir(output_root: Path) -> Path:
    runs = [p for p in output_root.iterdir() if (p / "config.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.slow
def test_dags_test_runs_the_whole_benchmark(airflow_home, tmp_path, imdb_dir, bert_tiny_dir):
    home, env = airflow_home
    out = tmp_path / "runs"
    conf = {"profile": "smoke", "backends": ["ddp", "spark", "determined", "ray"], "worker_counts": [1],
            "epochs": 2, "train_samples": 160, "test_samples": 80, "max_seq_len": 32}
    # the ddp cell fails its first 2 tries (at the end of epoch 1, then of epoch 2): matrix.cell_retries (2) retries it, as the CLI does
    # (tests/run/test_cli.py::test_a_failing_cell_is_retried_cell_retries_times)
    faults = fault_injection.fail_env(2, PROJECT_ROOT, cell="ddp-w1-r0")
    done = _dags_test({**_deployment(env, out, imdb_dir, bert_tiny_dir), **faults}, conf)
    (tmp_path / "dags_test.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]

    run_dir = _only_run_dir(out)
    states = _task_states(home, run_dir)
    for task_id in ("prepare_run", "ingest", "validate_snapshot", "preprocess", "validate_tokens",
                    *PLAN_IDS, "evaluate", "report", "track", "check_regression"):
        assert states[task_id] == ["success"], (task_id, states)
    assert states["train.w1"] == ["success"] * 4  # one mapped instance per backend
    assert all(s == ["skipped"] for t, s in states.items() if t in TRAIN_IDS[1:]), states

    config = json.loads((run_dir / "config.json").read_text())
    assert (config["profile"], config["training"]["epochs"], config["matrix"]["backends"]) == (
        "smoke", 2, conf["backends"])
    snapshot = {p.name for p in (run_dir / "snapshot").iterdir()}
    assert snapshot >= {"train.parquet", "test.parquet", "manifest.json"}
    assert len(pd.read_parquet(run_dir / "snapshot" / "train.parquet")) == 144  # + 16 validation
    assert list((run_dir / "validation").glob("*.json"))
    for split in ("train", "test"):
        assert list((run_dir / "tokens" / split).glob("part-*.parquet"))
    for backend in conf["backends"]:
        result = json.loads((RunPaths(run_dir).cell(backend, 1, 0).result).read_text())
        assert result["status"] == "ok" and result["world_size"] == 1 and result["test"]["accuracy"] > 0
        retried = ["failed", "failed", "ok"] if backend == "ddp" else ["ok"]
        assert [a["outcome"] for a in result["attempts"]] == retried, backend
    assert {"report.html", "report.md", "summary.json"} <= {p.name for p in (run_dir / "report").iterdir()}
    # the what-if model was fitted on the run's cells and saved with it: a smoke run folder answers
    # (ddp's last attempt trained no epoch after its retries: it teaches nothing, and is not asked)
    assert "## Your cluster (predicted)" in (run_dir / "report" / "report.md").read_text()
    asked = subprocess.run([sys.executable, "-m", "pipelines", "whatif", str(run_dir), "--hosts", "4",
                            "--network", "25gbit", "--step-ms", "5", "--json"], capture_output=True, text=True,
                           cwd=PROJECT_ROOT, timeout=120)
    assert asked.returncode == 0, asked.stderr[-3000:]
    answer = json.loads(asked.stdout)
    assert {p["platform"] for p in answer["predictions"]} == {"spark", "determined", "ray"}, answer
    assert all(p["low_seconds"] <= p["total_seconds"] <= p["high_seconds"] for p in answer["predictions"])


@pytest.mark.slow
def test_dags_test_refuses_bad_params_before_any_task(airflow_home, tmp_path):
    _, env = airflow_home
    done = _dags_test({**env, "BENCHMARK_OUTPUT_ROOT": str(tmp_path / "runs")},
                      {"profile": "smoke", "backends": ["horovod"]}, timeout=120)
    assert done.returncode != 0
    assert "backends" in done.stdout + done.stderr and "'horovod' is not one of" in done.stdout + done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_dags_test_stops_at_validation_on_corrupt_data(airflow_home, tmp_path, imdb_dir, bert_tiny_dir):
    home, env = airflow_home
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for split in ("train", "test"):  # readable, but labels outside {0, 1} and empty reviews
        frame = pd.read_parquet(imdb_dir / f"{split}.parquet").iloc[::250].reset_index(drop=True)
        frame.loc[::3, "label"] = 7
        frame.loc[1::3, "text"] = ""
        frame.to_parquet(corrupt / f"{split}.parquet")
    out = tmp_path / "runs"
    conf = {"profile": "smoke", "backends": ["ddp"], "worker_counts": [1], "train_samples": 60,
            "test_samples": 40}
    done = _dags_test(_deployment(env, out, corrupt, bert_tiny_dir), conf, timeout=300)
    (tmp_path / "dags_test.log").write_text(done.stdout + done.stderr)
    assert done.returncode != 0

    run_dir = _only_run_dir(out)
    states = _task_states(home, run_dir)
    assert states["ingest"] == ["success"]
    assert states["validate_snapshot"] == ["failed"]
    assert states["preprocess"] == ["upstream_failed"] and states["train.w1"] == ["upstream_failed"]
    assert states["check_regression"] == ["upstream_failed"]
    assert not (run_dir / "tokens").exists()
    assert list((run_dir / "validation").glob("*.json"))  # the failed validation is kept
