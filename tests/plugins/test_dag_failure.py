"""A failed DAG run says why: plugins/dag_failure.py and the last line of scripts/smoke.sh.

    .venv/bin/python -m pytest tests/plugins/test_dag_failure.py -q                 # ~5 min on 2 cores
    .venv/bin/python -m pytest tests/plugins/test_dag_failure.py -q -m "not slow"   # the parsing only (~1 s)

The slow tests run scripts/smoke.sh (SMOKE_SKIP_SETUP=1: the machine is set up already) on an
isolated SQLite Airflow home: a nonexistent data source, a trigger value the params refuse and an
unknown config field; then plugins/dag_failure.py on the metadata DB of the failed run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from plugins import dag_failure
from plugins.dag_failure import FailedTask
from tests.airflow.conftest import airflow_env

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TS = "2026-12-01T13:46:49.522350Z"


def _traceback_text() -> str:
    """A real chained traceback, as Python prints it."""
    try:
        try:
            {}["x"]
        except KeyError as err:
            raise ValueError("bad value\n  detail: more\n\nignored paragraph") from err
    except ValueError:
        return traceback.format_exc()


def _dags_test_output() -> str:
    tb = _traceback_text()
    noise = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nConnectionResetError: [Errno 104]\n"
    return "\n".join([
        f"{TS} [info     ] creating dag run  [dag] run_id=manual__2026-12-01T13:46:18+00:00",
        f"{TS} [info     ] [DAG TEST] starting task_id=prepare_run map_index=-1 [dag] loc=dag.py:1501",
        f"{TS} [info     ] [DAG TEST] end task task_id=prepare_run map_index=-1 [dag] loc=dag.py:1563",
        noise.rstrip(),
        f"{TS} [info     ] [DAG TEST] starting task_id=train.w1 map_index=2 [dag] loc=dag.py:1501",
        f"{TS} [error    ] Task failed with exception     [task] loc=task_runner.py:1676",
        tb.rstrip(),
        f"{TS} [error    ] Exception rendering Jinja template for SmtpNotifier",
        "Traceback (most recent call last):\n  File \"t.py\", line 2, in g\nairflow.X: notifier's own error",
        f"{TS} [info     ] [DAG TEST] end task task_id=train.w1 map_index=2 [dag] loc=dag.py:1563",
        (f"{TS} [info     ] DagRun Finished: dag_id=imdb_benchmark, run_id=manual__2026-12-01T13:46:18+00:00, "
         "state=failed, run_type=manual"),
        "DagRun failed",
    ])


# --- parsing (no Airflow) -------------------------------------------------------------------------


def test_one_line_is_the_first_paragraph_and_short():
    assert dag_failure.one_line("a\n  b: c\n\nd") == "a b: c"
    assert len(dag_failure.one_line("x" * 5000)) == dag_failure.MAX_CHARS


def test_last_exception_of_a_chained_traceback_is_its_last_link():
    text = f"{TS} [info] before\n{_traceback_text()}{TS} [info] after\n"
    assert dag_failure.last_exception(text) == "ValueError: bad value detail: more"
    assert dag_failure.last_exception("no traceback here") is None


def test_the_failed_task_section_of_dags_test_output_gives_its_error():
    out = _dags_test_output()
    task = FailedTask("train.w1", 2)
    assert dag_failure.task_error_from_output(out, task) == "ValueError: bad value detail: more"
    assert dag_failure.task_error_from_output(out, FailedTask("prepare_run")) is None
    assert dag_failure.first_failed_task_in_output(out) == task
    assert dag_failure.run_id_from_output(out) == "manual__2026-12-01T13:46:18+00:00"
    assert dag_failure.run_failed_in_output(out)
    assert not dag_failure.run_failed_in_output(out.replace("state=failed", "state=success"))


def test_a_json_task_log_gives_the_exception_of_its_failure_record(tmp_path):
    from structlog.tracebacks import ExceptionDictTransformer

    try:
        raise RuntimeError("cell ddp-w1-r0 failed\nsecond line")
    except RuntimeError:
        chain = ExceptionDictTransformer(show_locals=False)(sys.exc_info())
    log = tmp_path / "attempt=1.log"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"timestamp": TS, "level": "info", "event": "starting"},
        {"timestamp": TS, "level": "error", "event": "Task failed with exception", "exception": chain},
        {"timestamp": TS, "level": "info", "event": "done"},
    ]) + "\n")
    assert dag_failure.error_from_log_file(log) == "RuntimeError: cell ddp-w1-r0 failed second line"
    text_log = tmp_path / "attempt=2.log"
    text_log.write_text(_traceback_text())
    assert dag_failure.error_from_log_file(text_log) == "ValueError: bad value detail: more"


def test_task_log_files_follow_airflows_layout(tmp_path):
    folder = tmp_path / "dag_id=d" / "run_id=r" / "task_id=train.w1" / "map_index=3"
    folder.mkdir(parents=True)
    for n in (10, 2):
        (folder / f"attempt={n}.log").write_text("")
    found = dag_failure.task_log_files(tmp_path, "d", "r", FailedTask("train.w1", 3))
    assert [p.name for p in found] == ["attempt=2.log", "attempt=10.log"]
    assert dag_failure.task_log_files(tmp_path, "d", "r", FailedTask("ingest")) == []


def test_a_train_task_error_comes_from_its_cell_result(tmp_path):
    from pipelines.runfolder.paths import RunPaths, safe_run_id

    run_id = "manual__2026-12-01T13:46:18+00:00"
    cell = RunPaths(tmp_path / safe_run_id(run_id)).cell("ddp", 2, 0, "default", "local")
    Path(cell.result).parent.mkdir(parents=True)
    Path(cell.result).write_text(json.dumps({"status": "failed", "error": "ChildFailedError: rank 1 died"}))
    task = FailedTask("train.w2", 0, 1, "ddp default local x2 r0")
    assert dag_failure.error_from_cell(tmp_path, run_id, task) == "ChildFailedError: rank 1 died"
    assert task.label == "train.w2[ddp default local x2 r0]"
    assert dag_failure.error_from_cell(tmp_path, run_id, FailedTask("train.w2", 1, 1, "spark default local x2 r0")) is None


# --- end to end: scripts/smoke.sh and the metadata DB ---------------------------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """An isolated Airflow home (SQLite) with the environment of scripts/airflow_env.sh."""
    path = tmp_path_factory.mktemp("airflow-home")
    return path, airflow_env(path)


def _smoke(env: dict, out: Path, timeout: int = 600, **extra: str) -> subprocess.CompletedProcess:
    env = {**env, "SMOKE_SKIP_SETUP": "1", "BENCHMARK_OUTPUT_ROOT": str(out), **extra}
    done = subprocess.run(["bash", "scripts/smoke.sh"], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    (out.parent / "smoke.out").write_text(done.stdout + done.stderr)
    return done


def _last_lines(done: subprocess.CompletedProcess, n: int = 1) -> list[str]:
    return (done.stdout + done.stderr).rstrip("\n").splitlines()[-n:]


@pytest.fixture(scope="module")
def missing_source(home, tmp_path_factory):
    out = tmp_path_factory.mktemp("missing-source") / "runs"
    return _smoke(home[1], out, BENCHMARK_DATASET_SOURCE="/nonexistent"), out


@pytest.mark.slow
def test_smoke_with_a_missing_data_source_ends_with_its_error(missing_source):
    done, _ = missing_source
    assert done.returncode != 0
    before, last = _last_lines(done, 2)
    assert last.startswith(("smoke run failed: task ingest: DataSourceError: ",
                            "smoke run failed: task prepare_run: ")), last
    assert "/nonexistent" in last and "does not exist" in last
    log = Path(before.rsplit("full output: ", 1)[1])
    assert "[DAG TEST] starting task_id=prepare_run" in log.read_text()


@pytest.mark.slow
def test_dag_failure_reads_the_failed_run_from_the_db(home, missing_source):
    path, env = home
    done, out = missing_source
    log = Path(_last_lines(done, 2)[0].rsplit("full output: ", 1)[1])
    run_id = dag_failure.run_id_from_output(log.read_text())
    env = {**env, "BENCHMARK_OUTPUT_ROOT": str(out)}

    def explain(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "plugins/dag_failure.py", "imdb_benchmark", *args],
                              cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)

    with_output = explain(run_id, "--output", str(log))
    assert with_output.returncode == 0, with_output.stderr
    assert "smoke run failed: " + with_output.stdout.strip() == _last_lines(done)[0]
    task = with_output.stdout.split(":", 1)[0].removeprefix("task ")
    # dags test writes no task log files; a scheduler's run does (JSON lines): the DB names the task,
    # its log file gives the error, with no captured output
    log_file = path / "logs" / "dag_id=imdb_benchmark" / f"run_id={run_id}" / f"task_id={task}" / "attempt=1.log"
    log_file.parent.mkdir(parents=True)
    chain = [{"exc_type": "DataSourceError", "exc_value": "from the task log", "frames": []}]
    log_file.write_text(json.dumps({"event": "Task failed with exception", "exception": chain}) + "\n")
    latest = explain()
    assert (latest.returncode, latest.stdout.strip()) == (0, f"task {task}: DataSourceError: from the task log")


@pytest.mark.slow
def test_smoke_with_a_refused_trigger_value_ends_with_the_refusal(home, tmp_path):
    done = _smoke(home[1], tmp_path / "runs", timeout=300, BENCHMARK_CONF_EXTRA='"epochs": 0')
    assert done.returncode != 0
    assert _last_lines(done) == [("smoke run failed: refused before any task ran: ParamValidationError: "
                                  "Invalid input for param epochs: 0 is less than the minimum of 1")]
