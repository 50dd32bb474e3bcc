"""Drive a running Airflow: trigger a tiny imdb_benchmark run over REST, then check the UI in Chromium.

Run by scripts/e2e_browser.sh inside the private network namespace where Airflow runs (it
talks to http://127.0.0.1:$AIRFLOW__API__PORT only). Steps:

1. wait for /api/v2/monitor/health, log in with the admin password Airflow generated
   ($AIRFLOW_HOME/simple_auth_manager_passwords.json.generated) -> JWT;
2. wait until the DAG is parsed (import errors are reported), unpause it, POST a dag run with
   a smoke conf (one backend, one worker, two epochs, a few hundred reviews); with
   --kill-training, SIGKILL the training processes after the epoch-1 checkpoint: the train
   task fails, Airflow retries it and the retry resumes at epoch 2; wait for the run;
3. check /benchmarks/ refuses a request without login (401) and serves it with the JWT;
4. headless Chromium (Debian's, through Playwright): sign in through the login form, open the
   DAG's trigger form, the Benchmarks page inside the UI and on its own; screenshots.

Writes into ARTIFACTS: results.json (states, page texts, timings), *.png screenshots, and on a
failed run failed_task_logs.txt. Exit status 0 when every step worked, 1 otherwise (the
message says which step). The pytest wrapper (tests/e2e/test_airflow_ui.py) asserts on
results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx

DAG_ID = "imdb_benchmark"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class Step(RuntimeError):
    """A step of the end-to-end check failed; the message names it."""


def wait_for(what: str, check, timeout: float, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (httpx.HTTPError, OSError) as err:  # server still starting
            last = err
        time.sleep(interval)
    raise Step(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


def admin_password(airflow_home: Path) -> tuple[str, str]:
    path = airflow_home / "simple_auth_manager_passwords.json.generated"
    users = json.loads(wait_for(f"{path}", lambda: path.exists() and path.read_text(), 60, 1))
    return next(iter(users.items()))


def failed_task_logs(api: httpx.Client, run_id: str) -> str:
    tis = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 100}).json()
    out = []
    for ti in tis.get("task_instances", []):
        out.append(f"{ti['task_id']}[{ti.get('map_index', -1)}]: {ti['state']}")
        if ti["state"] in ("failed", "upstream_failed", "up_for_retry"):
            url = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{max(ti['try_number'], 1)}"
            log = api.get(url, params={"map_index": ti.get("map_index", -1), "full_content": True},
                          headers={"Accept": "text/plain"})
            out.append(log.text[-6000:])
    return "\n".join(out)


def output_root(run_id: str) -> Path:
    from pipelines.runfolder.paths import safe_run_id

    return Path(os.environ["BENCHMARK_OUTPUT_ROOT"]) / safe_run_id(run_id)


def kill_training_after_epoch_1(run_id: str, timeout: float) -> dict:
    """SIGKILL the training processes once the epoch-1 checkpoint exists (the cell is retried).

    The e2e arms tests.fault_injection (hold after epoch 1), so rank 0 stalls right after that checkpoint
    and the kill lands at a known point; the retry resumes at epoch 2 and does not stall.
    """
    import psutil

    root = output_root(run_id)
    held = root / "cells" / "ddp-w1-r0" / "checkpoints" / "epoch-0001.pt.sha256"  # complete (FAULT_HOLD_CELL)
    wait_for("the epoch-1 checkpoint", held.exists, timeout, 1)
    victims = [p for p in psutil.process_iter(["cmdline"])
               if any("torch.distributed.run" in part or "pipelines.training.worker" in part
                      for part in (p.info["cmdline"] or []))]
    for proc in victims:
        proc.kill()
    return {"killed_pids": [p.pid for p in victims], "checkpoint": str(held)}


def train_tries(api: httpx.Client, run_id: str) -> list[dict]:
    tis = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 100}).json()
    return [{"task_id": ti["task_id"], "map_index": ti.get("map_index"), "state": ti["state"],
             "try_number": ti["try_number"]}
            for ti in tis.get("task_instances", []) if ti["task_id"].startswith("train.w")]


def run_dag(api: httpx.Client, conf: dict, timeout: float, artifacts: Path, kill_training: bool = False) -> dict:
    def parsed():
        errors = api.get("/api/v2/importErrors").json().get("import_errors", [])
        if errors:
            raise Step("DAG import errors: " + "; ".join(f"{e['filename']}: {e['stack_trace'][-800:]}" for e in errors))
        return api.get(f"/api/v2/dags/{DAG_ID}").status_code == 200

    wait_for(f"the dag-processor to parse {DAG_ID}", parsed, 120)
    api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).raise_for_status()
    resp = api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
    if resp.status_code != 200:
        raise Step(f"trigger refused ({resp.status_code}): {resp.text}")
    run_id = resp.json()["dag_run_id"]
    started = time.monotonic()

    killed = kill_training_after_epoch_1(run_id, timeout) if kill_training else None

    def finished():
        state = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return state if state in ("success", "failed") else None

    state = wait_for(f"dag run {run_id} to finish", finished, timeout, 3)
    result = {"run_id": run_id, "state": state, "seconds": round(time.monotonic() - started, 1),
              "killed_training": killed}
    if kill_training:
        result["train_tries"] = train_tries(api, run_id)
        cells = sorted(output_root(run_id).glob("cells/*/result.json"))
        result["cell_results"] = {p.parent.name: json.loads(p.read_text()) for p in cells}
        result["cell_result"] = result["cell_results"].get("ddp-w1-r0")
    tis = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 100}).json()
    result["task_seconds"] = {  # where the run's time goes (skipped train.wN tasks have none)
        f"{ti['task_id']}[{ti['map_index']}]" if ti.get("map_index", -1) >= 0 else ti["task_id"]:
        round(ti["duration"], 1) for ti in tis.get("task_instances", []) if ti.get("duration") is not None}
    if state != "success":
        (artifacts / "failed_task_logs.txt").write_text(failed_task_logs(api, run_id))
        raise Step(f"dag run {run_id} ended {state}; task logs in {artifacts / 'failed_task_logs.txt'}")
    return result


def browse(base: str, user: str, password: str, artifacts: Path) -> dict:
    from playwright.sync_api import expect, sync_playwright

    out: dict = {"screenshots": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                     args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(30_000)

        def shot(name: str) -> None:
            page.screenshot(path=artifacts / f"{name}.png", full_page=True)
            out["screenshots"].append(f"{name}.png")

        # Login through the simple auth manager's form; the UI keeps the JWT in the _token cookie.
        page.goto(f"{base}/", wait_until="networkidle")
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", password)
        shot("01_login")
        page.click("button[type=submit]")
        page.wait_for_url(lambda url: "/auth/login" not in url)
        out["cookies"] = sorted(c["name"] for c in page.context.cookies())

        # The DAG's trigger form, built from its Params.
        page.goto(f"{base}/dags/{DAG_ID}", wait_until="networkidle")
        page.get_by_role("button", name="Trigger").first.click()
        dialog = page.get_by_role("dialog")
        expect(dialog).to_be_visible()
        # Params sections are accordions with one open at a time: open the training matrix.
        section = dialog.get_by_role("button", name="Training matrix", exact=True)
        if section.get_attribute("aria-expanded") != "true":
            section.click()
        expect(dialog.get_by_text("Backends", exact=True).first).to_be_visible()
        page.wait_for_timeout(500)
        shot("02_trigger_form")
        out["trigger_form_text"] = dialog.inner_text()
        page.keyboard.press("Escape")

        # The plugin page inside the Airflow UI (nav entry -> iframe: the trends view), then the
        # run view on its own.
        page.goto(f"{base}/plugin/benchmarks", wait_until="networkidle")
        frame = page.frame_locator("iframe").first
        expect(frame.locator("h1")).to_contain_text("benchmarks", ignore_case=True)
        page.wait_for_timeout(500)
        shot("03_benchmarks_in_airflow_ui")
        out["nav_has_benchmarks"] = page.get_by_text("Benchmarks").count() > 0

        response = page.goto(f"{base}/benchmarks/runs", wait_until="networkidle")  # the newest run
        out["benchmarks_status"] = response.status
        shot("04_benchmarks_page")
        out["benchmarks_text"] = page.inner_text("body")
        out["dag_run_link"] = page.eval_on_selector("a.dag-run", "a => a.href")
        out["plots_loaded"] = page.evaluate(
            "() => [...document.images].filter(i => i.complete && i.naturalWidth > 0).length")
        out["plots_total"] = page.evaluate("() => document.images.length")
        browser.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--conf", required=True, help="JSON conf of the dag run")
    parser.add_argument("--run-timeout", type=float, default=420)
    parser.add_argument("--kill-training", action="store_true",
                        help="SIGKILL training after epoch 1 and expect the cell retry to resume")
    args = parser.parse_args()
    args.artifacts.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{os.environ.get('AIRFLOW__API__PORT', '8080')}"
    results: dict = {"timings": {}}
    t0 = time.monotonic()
    try:
        with httpx.Client(base_url=base, timeout=30) as anon:
            wait_for("the API server's health endpoint", lambda: anon.get("/api/v2/monitor/health").is_success, 180)
            results["timings"]["healthy_s"] = round(time.monotonic() - t0, 1)
            user, password = admin_password(Path(os.environ["AIRFLOW_HOME"]))
            resp = anon.post("/auth/token", json={"username": user, "password": password})
            if resp.status_code not in (200, 201):
                raise Step(f"login as {user} refused ({resp.status_code}): {resp.text}")
            token = resp.json()["access_token"]
            results["unauthenticated_status"] = anon.get("/benchmarks/").status_code
            results["metadata_db"] = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite").split(":")[0]
            results["executor"] = os.environ.get("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
        with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}) as api:
            results["dag_run"] = run_dag(api, json.loads(args.conf), args.run_timeout, args.artifacts,
                                         kill_training=args.kill_training)
            page = api.get("/benchmarks/")
            results["authenticated_status"], results["benchmarks_html"] = page.status_code, page.text
        t1 = time.monotonic()
        results.update(browse(base, user, password, args.artifacts))
        results["timings"]["browser_s"] = round(time.monotonic() - t1, 1)
        ok = True
    except Exception as err:  # noqa: BLE001 - every failure ends up in results.json for the test
        results["error"] = f"{type(err).__name__}: {err}"
        ok = False
    results["timings"]["driver_s"] = round(time.monotonic() - t0, 1)
    (args.artifacts / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if not k.endswith(("_text", "_html"))}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
