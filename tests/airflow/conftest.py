"""Airflow fixtures: an isolated Airflow home (SQLite) set up by the project's own scripts.

In-process tests (DagBag, params) only need Airflow importable; the end-to-end tests run the
real CLI in subprocesses with the environment of ``scripts/airflow_env.sh``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DAGS_DIR = PROJECT_ROOT / "dags"

# Airflow reads its config when first imported: never let a test touch ~/airflow.
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="airflow-home-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(DAGS_DIR))


def airflow_env(home: Path) -> dict[str, str]:
    """The environment of ``source scripts/airflow_env.sh`` with AIRFLOW_HOME=home and SQLite there."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "BENCHMARK_"))}
    base.update(AIRFLOW_HOME=str(home),
                AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}")
    out = subprocess.run(["bash", "-c", "source scripts/airflow_env.sh && env -0"], cwd=PROJECT_ROOT,
                         env=base, capture_output=True, check=True)
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A migrated Airflow home with the training pool, made by scripts/airflow_setup.sh."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = airflow_env(home)
    done = subprocess.run(["bash", "scripts/airflow_setup.sh"], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pool training_workers=" in done.stdout
    return home, env
