"""The message of a benchmark alert: regression alarm and failed training cells of one run.

``build_alert(run_dir, ...)`` reads the run folder (report/regression.json, written by
``pipelines.tracking.regression`` before it raises, and report/summary.json, through
``pipelines.runfolder.index.read_run_files``) and returns the subject, a plain-text body (chat
webhooks) and an HTML body (mail), naming the run, every alarmed cell with its old and new
values, the failed cells with their errors, and links. The DAG sends it through Airflow
notifiers (``SmtpNotifier`` on the SMTP connection ``benchmark_alerts``; see the README).
Nothing here imports Airflow or sends anything.

    python -c "from pipelines.tracking.alerts import build_alert; print(build_alert('runs/<run>').text)"

Reads env ``AIRFLOW_UI_URL`` and ``MLFLOW_UI_URL`` (absolute links in the message; left out
when unset). A run folder without regression.json or summary.json still gives a message:
the task's exception text.
"""

from __future__ import annotations

import html
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.index import RunRecord, dag_run_link, load_record, mlflow_links

SUBJECT_PREFIX = "[benchmark]"
MAX_SUBJECT = 200


@dataclass(frozen=True)
class Alert:
    subject: str
    text: str
    html: str
    cells: tuple[str, ...]  # the alarmed and failed cells named in the message


def one_line(text: str, limit: int = MAX_SUBJECT) -> str:
    """A mail subject from free text (errors, cell names): control and format characters (CR/LF,
    which would end the header, tabs, zero-width and bidi marks, line separators) become spaces,
    runs of spaces one; at most ``limit`` characters."""
    text = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in str(text))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _num(value: Any, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _alarm_rows(run: RunRecord) -> list[dict[str, Any]]:
    rows = []
    for key, cell in ((run.regression or {}).get("cells") or {}).items():
        if not cell["alarms"]:
            continue
        rows.append({
            "cell": key, "alarms": cell["alarms"],
            "time": f"{_num(cell['old_total_seconds'], '.2f')} s -> {_num(cell['new_total_seconds'], '.2f')} s"
                    + (f" ({cell['slowdown'] * 100:+.1f} %)" if cell["slowdown"] is not None else ""),
            "accuracy": f"{_num(cell['old_test_accuracy'], '.4f')} -> {_num(cell['new_test_accuracy'], '.4f')}"
                        + (f" (drop {cell['accuracy_drop']:.4f})" if cell["accuracy_drop"] is not None else ""),
        })
    return rows


def _links(run: RunRecord, dag_run_id: str | None) -> list[tuple[str, str]]:
    airflow_url = os.environ.get("AIRFLOW_UI_URL", "").rstrip("/")
    links = []
    if airflow_url:
        if dag_run_id and not run.dag_run:
            run.dag_run = {"run_id": dag_run_id}
        found = dag_run_link(run, airflow_url)
        if found:
            links.append(found)
        trends = f"{airflow_url}/benchmarks/?profile={quote(run.profile, safe='')}"
        links.append(("Benchmarks page: trends", trends))
    links += [(label, url) for label, url in mlflow_links(run) if url]
    return links


def build_alert(run_dir: str | Path, dag_run_id: str | None = None, task_id: str | None = None,
                exception: BaseException | str | None = None) -> Alert:
    """Subject and bodies of the alert for the run folder ``run_dir`` (None or missing: a short
    alert from the exception, e.g. when the run failed before its folder existed)."""
    if run_dir is None or not RunPaths.is_run_folder(Path(run_dir)):
        return _bare_alert(run_dir, dag_run_id, task_id, exception)
    run = load_record(Path(run_dir))
    run_name = dag_run_id or run.run_id
    alarms = _alarm_rows(run)
    failed = run.failed
    reg = run.regression or {}

    parts = []
    if alarms:
        first = alarms[0]
        change = ", ".join(f"total time {first['time']}" if a == "time" else f"test accuracy {first['accuracy']}"
                           for a in first["alarms"])
        more = f" (+{len(alarms) - 1} more cells)" if len(alarms) > 1 else ""
        parts.append(f"regression in {first['cell']}: {change}{more}")
    if failed:
        parts.append(f"{len(failed)} training cell(s) failed: {', '.join(f['cell'] for f in failed)}")
    if not parts:
        reason = (str(exception).splitlines() or ["failed"])[0] if exception else "failed"
        parts.append(f"task {task_id or '?'} failed: {reason}")
    subject = one_line(f"{SUBJECT_PREFIX} {run.profile} run {run_name}: " + "; ".join(parts))

    facts = [("Airflow run", run_name), ("run folder", str(run.root)), ("profile", run.profile),
             ("started", run.started.strftime("%Y-%m-%d %H:%M UTC"))]
    if task_id:
        facts.append(("failed task", task_id))
    if reg:
        facts.append(("regression check", f"{reg['status']} against baseline run {reg.get('baseline') or '-'}"
                      f" (allowed: +{_num((reg.get('time_limit') or 0) * 100, '.0f')} % total time, "
                      f"-{_num(reg.get('drop_limit'), '.2f')} test accuracy)"))
    links = _links(run, dag_run_id)

    text = [subject, ""] + [f"{k}: {v}" for k, v in facts]
    if alarms:
        text += ["", "Regression (baseline -> this run, medians over repeats):"]
        text += [f"- {r['cell']}: total time {r['time']}; test accuracy {r['accuracy']}; "
                 f"alarm: {', '.join(r['alarms'])}" for r in alarms]
    if failed:
        text += ["", "Failed training cells:"] + [f"- {f['cell']}: {f['error'][:500]}" for f in failed]
    if exception and not (alarms or failed):
        text += ["", f"Error: {str(exception)[:2000]}"]
    text += [""] + [f"{label}: {url}" for label, url in links]

    e = html.escape
    body = [f"<h2>{e(subject)}</h2>", "<table>"]
    body += [f"<tr><th align='left'>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in facts]
    body.append("</table>")
    if alarms:
        body.append("<h3>Regression (baseline &rarr; this run, medians over repeats)</h3>"
                    "<table border='1' cellpadding='4' style='border-collapse:collapse'>"
                    "<tr><th>cell</th><th>total time</th><th>test accuracy</th><th>alarm</th></tr>")
        body += [f"<tr><td>{e(r['cell'])}</td><td>{e(r['time'])}</td><td>{e(r['accuracy'])}</td>"
                 f"<td>{e(', '.join(r['alarms']))}</td></tr>" for r in alarms]
        body.append("</table>")
    if failed:
        body.append("<h3>Failed training cells</h3><ul>")
        body += [f"<li><b>{e(f['cell'])}</b>: {e(f['error'][:500])}</li>" for f in failed]
        body.append("</ul>")
    if exception and not (alarms or failed):
        body.append(f"<pre>{e(str(exception)[:2000])}</pre>")
    if links:
        body.append("<p>" + " &middot; ".join(f"<a href='{e(url)}'>{e(label)}</a>" for label, url in links)
                    + "</p>")
    cells = tuple(r["cell"] for r in alarms) + tuple(f["cell"] for f in failed)
    return Alert(subject=subject, text="\n".join(text) + "\n", html="\n".join(body), cells=cells)


def _bare_alert(run_dir, dag_run_id, task_id, exception) -> Alert:
    reason = str(exception or "failed")
    subject = one_line(f"{SUBJECT_PREFIX} run {dag_run_id or run_dir or '?'}: task {task_id or '?'} failed: "
                       f"{reason.splitlines()[0] if reason else ''}")
    text = f"{subject}\n\nrun folder: {run_dir or 'not created'}\nError: {reason[:2000]}\n"
    body = (f"<h2>{html.escape(subject)}</h2><p>run folder: {html.escape(str(run_dir or 'not created'))}</p>"
            f"<pre>{html.escape(reason[:2000])}</pre>")
    return Alert(subject=subject, text=text, html=body, cells=())
