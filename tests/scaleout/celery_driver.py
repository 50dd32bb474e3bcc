"""Trigger a tiny imdb_benchmark run on a CeleryExecutor Airflow and collect the evidence.

Run by scripts/e2e_celery.sh inside its private namespace, where the api-server, scheduler,
dag-processor and a Celery worker are starting. Triggers through the `airflow` CLI, then reads
the outcome from the metadata DB and the Celery result backend (both PostgreSQL):
result.json holds the run state, every task instance's state and host, and the Celery task
results. Exit 0 when the run succeeded, 1 otherwise (the message says why).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg2

DAG_ID = "imdb_benchmark"
RUN_ID = "celery_e2e"


def airflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["airflow", *args], capture_output=True, text=True, timeout=120)


def wait(what: str, check, timeout: float, interval: float = 3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
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
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    started = time.monotonic()

    # The DAG exists once the dag-processor has serialized it; unpause fails until then.
    wait("the dag-processor to parse the DAG", lambda: airflow("dags", "unpause", DAG_ID).returncode == 0, 180, 5)
    trig = airflow("dags", "trigger", DAG_ID, "--conf", args.conf, "--run-id", RUN_ID)
    if trig.returncode != 0:
        raise SystemExit(f"trigger failed: {trig.stderr[-2000:]}")

    db = psycopg2.connect(args.dsn)
    db.autocommit = True

    def query(sql: str, *params):
        with db.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    def finished():
        rows = query("SELECT state FROM dag_run WHERE dag_id=%s AND run_id=%s", DAG_ID, RUN_ID)
        return rows and rows[0][0] in ("success", "failed") and rows[0][0]

    state = wait(f"dag run {RUN_ID}", finished, args.timeout)
    tasks = query("SELECT task_id, map_index, state, hostname, try_number FROM task_instance "
                  "WHERE dag_id=%s AND run_id=%s ORDER BY start_date NULLS LAST", DAG_ID, RUN_ID)
    celery = query("SELECT status, count(*) FROM celery_taskmeta GROUP BY status")
    result = {
        "state": state,
        "seconds": round(time.monotonic() - started, 1),
        "executor": airflow("config", "get-value", "core", "executor").stdout.strip(),
        "tasks": [dict(zip(("task_id", "map_index", "state", "hostname", "try_number"), t)) for t in tasks],
        "celery_results": {status: n for status, n in celery},
    }
    (args.artifacts / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    return 0 if state == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
