"""The regression alarm mails through Airflow, and a finished benchmark publishes its asset.

One real `airflow dags test imdb_benchmark` on a tiny smoke run (ddp, 1 worker, 1 epoch) whose
MLflow store already holds a baseline that the run cannot match (accuracy 0.99, written by
the real tracking code from a synthetic run folder), so the real ``check_regression`` raises.
Its ``on_failure_callback`` (SmtpNotifier on the connection ``benchmark_alerts``, given as an
AIRFLOW_CONN_* variable) mails a real SMTP server (aiosmtpd) on 127.0.0.1; the test reads
the mail it received. The same run's ``track`` task emitted the ``imdb_benchmark_summary``
asset event, read back from the metadata DB. About 1.5 min on 2 cores.
"""

from __future__ import annotations

import email
import html
import email.policy
import json
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

from pipelines.runfolder.paths import safe_run_id

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_dag_wires_the_alert_notifier_and_the_asset():
    """In-process: which tasks notify and which one publishes the asset (no run)."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    dag = DagBag(dag_folder=str(PROJECT_ROOT / "dags")).dags["imdb_benchmark"]
    for task_id, task in dag.task_dict.items():
        callbacks = task.on_failure_callback or []
        if task_id in ("evaluate", "check_regression"):
            [notifier] = callbacks
            assert isinstance(notifier, SmtpNotifier) and notifier.smtp_conn_id == "benchmark_alerts"
            assert "benchmark_alert(ti, exception)" in notifier.subject
        else:
            assert not callbacks, task_id
        outlets = [(a.name, a.uri) for a in task.outlets]
        assert outlets == ([("imdb_benchmark_summary", "x-benchmark://imdb_benchmark/summary")]
                           if task_id == "track" else []), task_id
    assert "benchmark_alert" in dag.user_defined_macros


class Inbox:
    """aiosmtpd handler: keeps every message it is sent."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], email.message.EmailMessage]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append((list(envelope.rcpt_tos), message))
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp_server():
    from aiosmtpd.controller import Controller

    with socket.socket() as s:  # a free port on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield inbox, port
    controller.stop()


def _baseline_in_mlflow(output_root: Path, profile_overrides: dict) -> str:
    """A successful earlier run of the same config (fingerprint) on this host, logged by the real
    tracking code: the regression check compares only like with like."""
    from pipelines.config import load_config
    from pipelines.evaluation import evaluate_run
    from pipelines.tracking.regression import check_regression
    from pipelines.tracking.runs import log_benchmark
    from tests.synthetic_results import write_synthetic_run

    config = load_config("smoke", {"output_root": str(output_root), **profile_overrides})
    paths, _ = write_synthetic_run(config, name="night-baseline", accuracy_shift=0.5)  # accuracy 0.99
    evaluate_run(config, paths)
    log_benchmark(config, paths)
    assert check_regression(config, paths)["status"] == "baseline"
    return paths.root.name


def _body(message) -> str:
    part = message.get_body(preferencelist=("html", "plain"))
    return part.get_content() if part is not None else message.get_content()


@pytest.mark.slow
def test_regression_alarm_mails_through_airflow_and_the_asset_event_is_emitted(
        airflow_home, tmp_path, imdb_dir, bert_tiny_dir, smtp_server):
    home, env = airflow_home
    inbox, port = smtp_server
    out = tmp_path / "runs"
    matrix = {"backends": ["ddp"], "worker_counts": [1]}
    conf = {"profile": "smoke", **matrix, "epochs": 1, "train_samples": 64, "test_samples": 32,
            "max_seq_len": 16}
    sources = {"dataset_source": str(imdb_dir), "tokenizer_source": str(bert_tiny_dir),
               "model_source": str(bert_tiny_dir)}
    baseline = _baseline_in_mlflow(out, {**sources, **{k: v for k, v in conf.items() if k != "profile"}})
    connection = {"conn_type": "smtp", "host": "127.0.0.1", "port": port,
                  "extra": {"disable_ssl": True, "disable_tls": True, "retry_limit": 0, "timeout": 10,
                            "from_email": "benchmarks@localhost", "to": "ml-team@localhost"}}
    env = {**env, "AIRFLOW_CONN_BENCHMARK_ALERTS": json.dumps(connection),  # the deployment's settings:
           "BENCHMARK_OUTPUT_ROOT": str(out), "BENCHMARK_DATASET_SOURCE": str(imdb_dir),
           "BENCHMARK_TOKENIZER_SOURCE": str(bert_tiny_dir), "BENCHMARK_MODEL_SOURCE": str(bert_tiny_dir)}
    done = subprocess.run(["airflow", "dags", "test", "imdb_benchmark", "-c", json.dumps(conf)],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=420)
    (tmp_path / "dags_test.log").write_text(done.stdout + done.stderr)
    assert done.returncode != 0, "the regression must fail the run"

    [run_dir] = [p for p in out.iterdir() if p.name != baseline and (p / "config.json").exists()]
    # nothing of the run beside the timed cell: the data stage's JVM (in this same dags-test process)
    # ended with its step (pipelines.measure.outside)
    usage = json.loads((run_dir / "cells" / "ddp-w1-r0" / "result.json").read_text())["resources"]
    assert usage["run_processes_outside"] == {} and usage["outside_cpu_share"] is not None, usage
    regression = json.loads((run_dir / "report" / "regression.json").read_text())
    assert regression["status"] == "failed" and regression["baseline_run_name"] == baseline
    with sqlite3.connect(home / "airflow.db") as db:
        states = dict(db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'imdb_benchmark' "
                                 "AND map_index = -1").fetchall())
        [(dag_run_id,)] = [r for r in db.execute("SELECT run_id FROM dag_run WHERE dag_id = 'imdb_benchmark'")
                           if safe_run_id(r[0]) == run_dir.name]
        events = db.execute(
            "SELECT e.extra, e.source_task_id, e.source_run_id FROM asset_event e JOIN asset a "
            "ON a.id = e.asset_id WHERE a.name = 'imdb_benchmark_summary'").fetchall()
    assert states["track"] == "success" and states["check_regression"] == "failed", states

    # The mail: one, to the connection's recipients, naming run, cell, old and new values.
    assert len(inbox.messages) == 1, (inbox.messages, done.stdout[-4000:])
    [(recipients, message)] = inbox.messages
    (tmp_path / "alert.eml").write_bytes(message.as_bytes())  # for a look at it
    assert recipients == ["ml-team@localhost"] and message["From"] == "benchmarks@localhost"
    cell = regression["cells"][0]
    old, new = cell["old_test_accuracy"], cell["new_test_accuracy"]
    subject, body = message["Subject"], html.unescape(_body(message))
    assert dag_run_id in subject and "ddp-w1" in subject and "regression" in subject
    assert f"test accuracy {old:.4f} -> {new:.4f}" in subject  # every alarm of the cell
    assert f"{old:.4f} -> {new:.4f}" in body and "ddp-w1" in body
    assert dag_run_id in body and str(run_dir) in body and baseline in body
    if cell["slowdown"] > regression["thresholds"]["time"]:  # slower too: both values are in the mail
        assert f"{cell['old_total_seconds']:.2f} s -> {cell['new_total_seconds']:.2f} s" in body

    # The asset event: emitted by track, its extra names the run and its summary.
    [(extra, task_id, source_run)] = events
    extra = json.loads(extra)
    assert (task_id, source_run) == ("track", dag_run_id)
    assert extra["run_id"] == dag_run_id and extra["summary"] == str(run_dir / "report" / "summary.json")
    assert extra["profile"] == "smoke" and extra["status"] == "success"
    assert Path(extra["summary"]).is_file()
    # ...and the run folder links back to its DAG run (airflow.json, for the Benchmarks page).
    assert json.loads((run_dir / "airflow.json").read_text())["run_id"] == dag_run_id
