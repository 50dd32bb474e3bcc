"""Why a DAG run failed, in one line: its first failed task and that task's exception.

    python plugins/dag_failure.py imdb_benchmark                  # the latest run of the DAG
    python plugins/dag_failure.py imdb_benchmark RUN_ID
    python plugins/dag_failure.py imdb_benchmark --output dags_test.log   # + the captured output

It reads Airflow's metadata DB, so it lives beside the DAG (``plugins/``, on Airflow's path), not in
``pipelines/``, which imports no Airflow.

prints e.g. ``task ingest: DataSourceError: dataset_source='/nonexistent': path does not exist ...``
or, when the trigger's conf was refused before any run existed,
``refused before any task ran: ParamValidationError: Invalid input for param epochs: ...``.
Exits 0 when it found a failure, 1 when it found none (and says so).

The failed task instances come from Airflow's metadata DB (the environment of
``scripts/airflow_env.sh``), ordered by end date. The error of the first one comes from, in turn:
its training cell's ``result.json`` (``error``; train tasks only), its task log file
(``$AIRFLOW_HOME/logs/dag_id=.../attempt=N.log``, JSON lines) and the captured output of
``airflow dags test``, which runs the tasks in-process and writes no log files. Parsing needs
no Airflow; only reading the DB imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_TASK_FAILED = "Task failed with exception"
_MAP_INDEX = re.compile(r"^(\S+) (\S+) (\S+) x(\d+) r(\d+)$")  # the train tasks' map_index_template
MAX_CHARS = 1000


@dataclass(frozen=True)
class FailedTask:
    task_id: str
    map_index: int = -1
    try_number: int = 1
    rendered_map_index: str | None = None

    @property
    def label(self) -> str:
        if self.map_index < 0:
            return self.task_id
        return f"{self.task_id}[{self.rendered_map_index or self.map_index}]"


# --- text: tracebacks in captured output or plain-text logs -----------------------------------------


def _clean(text: str) -> list[str]:
    return [_ANSI.sub("", line).rstrip("\r") for line in text.splitlines()]


def _short_type(line: str) -> str:
    """``pipelines.data.ingest.DataSourceError: ...`` -> ``DataSourceError: ...``."""
    return re.sub(r"^(?:[A-Za-z_][\w]*\.)+(?=[A-Za-z_]\w*(?::|$))", "", line, count=1)


def one_line(message: str) -> str:
    """A message's first paragraph on one line, at most MAX_CHARS characters."""
    paragraph = []
    for line in message.strip().splitlines():
        if not line.strip():
            break
        paragraph.append(line.strip())
    text = " ".join(paragraph)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 3] + "..."


def _exception_after(lines: list[str], start: int) -> tuple[str | None, int]:
    """The exception of the traceback starting at lines[start] (its last link when chained)."""
    found, i = None, start
    while i < len(lines) and lines[i].strip() == _TRACEBACK:
        i += 1
        while i < len(lines) and (lines[i][:1] in (" ", "\t") or not lines[i].strip()):
            i += 1  # frames, source lines, carets
        message = []
        while i < len(lines) and lines[i].strip() and not _TIMESTAMP.match(lines[i]) \
                and lines[i].strip() != _TRACEBACK:
            message.append(lines[i])
            i += 1
        if message:
            found = _short_type(one_line("\n".join(message)))
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j < len(lines) and lines[j].startswith(_CHAINED):
            i = j + 1
            while i < len(lines) and not lines[i].strip():
                i += 1
            continue
        break
    return found, i


def last_exception(text: str) -> str | None:
    """The exception line of the last traceback in text (a chained one's last link), None without one."""
    lines = _clean(text)
    found, i = None, 0
    while i < len(lines):
        if lines[i].strip() == _TRACEBACK:
            exc, i = _exception_after(lines, i)
            found = exc or found
        else:
            i += 1
    return found


def task_error_from_output(text: str, task: FailedTask | None = None) -> str | None:
    """The exception a task failed with, from ``airflow dags test``'s output (task=None: the first)."""
    lines = _clean(text)
    lo, hi = 0, len(lines)
    if task is not None:
        begin = f"[DAG TEST] starting task_id={task.task_id} map_index={task.map_index} "
        end = f"[DAG TEST] end task task_id={task.task_id} map_index={task.map_index} "
        starts = [i for i, line in enumerate(lines) if begin in line]
        if not starts:
            return None
        lo = starts[-1]  # dags test runs a task once; the last start is its last try
        hi = next((i for i in range(lo, len(lines)) if end in lines[i]), len(lines))
    for i in range(lo, hi):
        if _TASK_FAILED in lines[i]:
            tb = next((k for k in range(i, hi) if lines[k].strip() == _TRACEBACK), None)
            if tb is not None:
                return _exception_after(lines, tb)[0]
            return _short_type(one_line(lines[i].split(_TASK_FAILED, 1)[1].strip(" :"))) or None
    return None


def first_failed_task_in_output(text: str) -> FailedTask | None:
    """The task of the first ``Task failed with exception`` in dags test's output (no DB)."""
    current = None
    for line in _clean(text):
        if m := re.search(r"\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)", line):
            current = FailedTask(m.group(1), int(m.group(2)))
        elif _TASK_FAILED in line and current is not None:
            return current
    return None


def run_id_from_output(text: str) -> str | None:
    """The DAG run that ``airflow dags test`` created (or tried to create) in this output."""
    found = None
    for line in _clean(text):
        m = re.search(r"\brun_id=([^\s,]+)", line)
        if m and ("DagRun Finished" in line or "creating dag run" in line):
            found = m.group(1)
    return found


def run_failed_in_output(text: str) -> bool:
    return any("DagRun Finished" in line and "state=failed" in line for line in _clean(text))


# --- task log files (Airflow 3: JSON lines) and the run folder --------------------------------------


def error_from_log_file(path: Path) -> str | None:
    """The error of a task log: the exception of its error record (JSON lines), else a traceback."""
    text = path.read_text(errors="replace")
    found = None
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        chain = record.get("exception") or record.get("error_detail")
        if isinstance(chain, list) and chain and isinstance(chain[0], dict) and chain[0].get("exc_type"):
            exc = chain[0]  # structlog's dict tracebacks: the raised exception first, then its causes
            value = one_line(str(exc.get("exc_value") or ""))
            found = f"{exc['exc_type']}: {value}" if value else str(exc["exc_type"])
            if record.get("event") == _TASK_FAILED:
                return found
    return found or last_exception(text)


def task_log_files(base: Path, dag_id: str, run_id: str, task: FailedTask) -> list[Path]:
    """The task's log files, latest attempt last."""
    folder = base / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task.task_id}"
    if task.map_index >= 0:
        folder = folder / f"map_index={task.map_index}"

    def attempt(p: Path) -> int:
        m = re.search(r"attempt=(\d+)", p.name)
        return int(m.group(1)) if m else 0

    return sorted(folder.glob("attempt=*.log"), key=attempt) if folder.is_dir() else []


def error_from_cell(output_root: Path, run_id: str, task: FailedTask) -> str | None:
    """A train task's cell error from ``<output_root>/<run>/cells/<cell>/result.json``."""
    from pipelines.runfolder.paths import RunPaths, safe_run_id

    m = _MAP_INDEX.match(task.rendered_map_index or "")
    if not m:
        return None
    backend, strategy, network, workers, repeat = m.groups()
    cell = RunPaths(output_root / safe_run_id(run_id)).cell(backend, int(workers), int(repeat), strategy, network)
    try:
        result = json.loads(Path(cell.result).read_text())
    except (OSError, ValueError):
        return None
    error = result.get("error") if isinstance(result, dict) else None
    return one_line(str(error)) if error else None


# --- the metadata DB ------------------------------------------------------------------------------


def latest_run_id(dag_id: str) -> str | None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(select(DagRun.run_id).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).limit(1))


def run_exists(dag_id: str, run_id: str) -> bool:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)) is not None


def failed_tasks(dag_id: str, run_id: str) -> list[FailedTask]:
    """The run's failed task instances, the first to fail first (end date, then start date)."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session
    from sqlalchemy import select

    query = (select(TI.task_id, TI.map_index, TI.try_number, TI.rendered_map_index)
             .where(TI.dag_id == dag_id, TI.run_id == run_id, TI.state == "failed")
             .order_by(TI.end_date, TI.start_date, TI.task_id, TI.map_index))
    with create_session() as session:
        return [FailedTask(t, m, n or 1, r) for t, m, n, r in session.execute(query).all()]


def _log_folder() -> Path:
    from airflow.configuration import conf

    return Path(conf.get("logging", "base_log_folder"))


# --- the line -------------------------------------------------------------------------------------


def task_error(dag_id: str, run_id: str, task: FailedTask, output: str | None = None) -> str:
    """The error of one failed task: its cell's result, its log file, the captured output."""
    root = os.environ.get("BENCHMARK_OUTPUT_ROOT")
    if task.task_id.startswith("train.") and root and (error := error_from_cell(Path(root), run_id, task)):
        return error
    for path in reversed(task_log_files(_log_folder(), dag_id, run_id, task)):
        if error := error_from_log_file(path):
            return error
    if output and (error := task_error_from_output(output, task)):
        return error
    return "failed without an error message (see its log)"


def explain(dag_id: str, run_id: str | None = None, output: str | None = None) -> str | None:
    """``task <id>: <Type>: <message>`` for the run's first failed task; None when nothing failed.

    run_id None: the run named in ``output`` (``airflow dags test``'s), else the DAG's latest run.
    A conf refused before the run existed leaves no run: the output's last exception says why.
    """
    run_id = run_id or (run_id_from_output(output) if output else None)
    try:
        run_id = run_id or latest_run_id(dag_id)
        known = run_id is not None and run_exists(dag_id, run_id)
        failed = failed_tasks(dag_id, run_id) if known else []
    except Exception as err:  # no DB to read: the output alone
        if not output:
            raise
        print(f"dag_failure: metadata DB not readable ({type(err).__name__}: {err}); using the output",
              file=sys.stderr)
        known, failed = "[DAG TEST] starting" in output, []
        if task := first_failed_task_in_output(output):
            return f"task {task.label}: {task_error_from_output(output, task) or 'failed'}"
    if failed:
        return f"task {failed[0].label}: {task_error(dag_id, run_id, failed[0], output)}"
    error = last_exception(output) if output else None
    if not known and output:  # dags test makes the run before any task: it never got that far
        last = next((line for line in reversed(_clean(output)) if line.strip()), "no output")
        return f"refused before any task ran: {error or _short_type(one_line(last))}"
    if output and run_failed_in_output(output):
        return f"run {run_id} failed: {error or 'no task failed (see the log)'}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python plugins/dag_failure.py", description=__doc__.split("\n")[0])
    parser.add_argument("dag_id")
    parser.add_argument("run_id", nargs="?", help="default: the run in --output, else the DAG's latest run")
    parser.add_argument("--output", type=Path, help="captured output of `airflow dags test` (a file)")
    args = parser.parse_args(argv)
    output = args.output.read_text(errors="replace") if args.output else None
    line = explain(args.dag_id, args.run_id, output)
    if line is None:
        print(f"no failed task found for {args.dag_id} {args.run_id or ''}".rstrip())
        return 1
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
