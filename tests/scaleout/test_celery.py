"""Airflow on CeleryExecutor: Redis broker, PostgreSQL metadata DB and result backend, a
Celery worker executing the benchmark DAG's tasks (scripts/e2e_celery.sh does the set-up)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("redis-server"),
                    reason="needs root (unshare --net) and redis-server")
def test_celery_worker_runs_the_benchmark_dag(tmp_path):
    artifacts = ROOT / "tests" / "scaleout" / "artifacts"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "e2e_celery.sh"), str(artifacts)],
                          capture_output=True, text=True, timeout=900)
    result_file = artifacts / "result.json"
    assert result_file.exists(), f"no result.json; stderr:\n{proc.stderr[-4000:]}\nstdout:\n{proc.stdout[-4000:]}"
    result = json.loads(result_file.read_text())
    assert result["executor"] == "CeleryExecutor"
    assert result["state"] == "success", json.dumps(result["tasks"], indent=1)
    task_ids = {t["task_id"] for t in result["tasks"] if t["state"] == "success"}
    for task_id in ("prepare_run", "ingest", "validate_snapshot", "preprocess", "validate_tokens",
                    "evaluate", "report", "track"):
        assert task_id in task_ids, f"{task_id} did not succeed: {result['tasks']}"
    assert any(t.startswith("train") for t in task_ids)
    # Every task ran as a Celery task whose outcome the PostgreSQL result backend recorded.
    ran = sum(1 for t in result["tasks"] if t["state"] in ("success", "failed"))
    assert result["celery_results"].get("SUCCESS", 0) >= ran
    assert proc.returncode == 0
