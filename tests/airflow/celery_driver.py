"""Trigger a tiny imdb_benchmark run on a CeleryExecutor Airflow and collect the evidence.

Run by scripts/e2e_celery.sh inside its private namespace, where the api-server, scheduler,
dag-processor and a Celery worker are starting (their pids come with --watch, so a component
that dies ends the wait at once, naming its log). Triggers through the `airflow` CLI, then
reads the outcome from the metadata DB and the Celery result backend (both PostgreSQL) into
<artifacts>/result.json: the run state, every task instance (state, hostname, queue, the
Celery task id Airflow recorded as external_executor_id) and every row of celery_taskmeta.
Exit 0 when the run succeeded, 1 otherwise (the message says why).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg2

DAG_ID = "imdb_benchmark"
RUN_ID = "celery_e2e"
TI_COLUMNS = ("task_id", "map_index", "state", "hostname", "queue", "try_number", "external_executor_id")


def airflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["airflow", *args], capture_output=True, text=True, timeout=120, check=False)


def parse_watch(items: list[str]) -> dict[str, tuple[int, Path]]:
    """``name=pid=log`` -> {name: (pid, log)}."""
    out = {}
    for item in items:
        name, pid, log = item.split("=", 2)
        out[name] = (int(pid), Path(log))
    return out


def check_alive(watched: dict[str, tuple[int, Path]]) -> None:
    for name, (pid, log) in watched.items():
        try:
            os.kill(pid, 0)
            done = Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # exited, not reaped
        except (ProcessLookupError, FileNotFoundError):
            done = True
        if done:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            raise SystemExit(f"{name} (pid {pid}) exited; last lines of {log}:\n{tail}")


def wait(what: str, check, timeout: float, watched: dict, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_alive(watched)
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--conf", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--timeout", type=float, default=240, help="seconds for the DAG run")
    parser.add_argument("--watch", action="append", default=[], metavar="NAME=PID=LOG",
                        help="a component that must stay alive")
    args = parser.parse_args()
    watched = parse_watch(args.watch)
    started = time.monotonic()

    db = psycopg2.connect(args.dsn)
    db.autocommit = True

    def query(sql: str, *params):
        with db.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    # Trigger only once the dag-processor has serialized the DAG: `dags unpause` answers 0 for
    # an unknown DAG too, and a DAG first seen after the trigger would be created paused.
    wait("the dag-processor to serialize the DAG",
         lambda: query("SELECT 1 FROM serialized_dag WHERE dag_id=%s", DAG_ID), 180, watched, 2)
    unpause = airflow("dags", "unpause", DAG_ID)
    if query("SELECT is_paused FROM dag WHERE dag_id=%s", DAG_ID) != [(False,)]:
        raise SystemExit(f"{DAG_ID} is still paused: {unpause.stdout[-1000:]}{unpause.stderr[-1000:]}")
    trig = airflow("dags", "trigger", DAG_ID, "--conf", args.conf, "--run-id", RUN_ID)
    if trig.returncode != 0:
        raise SystemExit(f"trigger failed: {trig.stderr[-2000:]}")

    def finished():
        rows = query("SELECT state FROM dag_run WHERE dag_id=%s AND run_id=%s", DAG_ID, RUN_ID)
        return rows and rows[0][0] in ("success", "failed") and rows[0][0]

    try:
        state = wait(f"dag run {RUN_ID}", finished, args.timeout, watched)
    except SystemExit as err:
        state = f"not finished: {err}"
    tasks = query(f"SELECT {', '.join(TI_COLUMNS)} FROM task_instance WHERE dag_id=%s AND run_id=%s "
                  "ORDER BY start_date NULLS LAST, task_id, map_index", DAG_ID, RUN_ID)

    # Airflow marks a task instance done when its task process reports; the Celery worker stores
    # the Celery task's own outcome when that process has exited, moments later.
    def celery_settled():
        rows = query("SELECT status FROM celery_taskmeta")
        return all(s in ("SUCCESS", "FAILURE", "REVOKED") for (s,) in rows)

    try:
        wait("the Celery results", celery_settled, 60, watched)
    except SystemExit as err:
        print(f"warning: {err}", file=sys.stderr)
    celery = query("SELECT task_id, status, date_done FROM celery_taskmeta")
    result = {
        "state": state,
        "seconds": round(time.monotonic() - started, 1),
        "executor": airflow("config", "get-value", "core", "executor").stdout.strip(),
        "tasks": [dict(zip(TI_COLUMNS, t)) for t in tasks],
        # Celery task id -> outcome, as the worker stored it in the PostgreSQL result backend
        "celery_results": {tid: {"status": s, "date_done": d} for tid, s, d in celery},
    }
    (args.artifacts / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    return 0 if state == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
