"""docker-compose.yaml parses and passes the Compose specification's JSON schema.

No Docker engine runs here, so the check is the schema (tests/fixtures/compose_spec.json, the
Compose spec schema shipped in docker-compose 1.29.2) plus the structure the stack promises.
"""

import json
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def test_compose_matches_the_compose_spec_schema():
    schema = json.loads((ROOT / "tests" / "fixtures" / "compose_spec.json").read_text())
    errors = list(jsonschema.Draft201909Validator(schema).iter_errors(_compose()))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_compose_has_the_production_stack():
    services = _compose()["services"]
    for name in ("postgres", "redis", "mlflow", "spark-master", "spark-worker", "airflow-apiserver",
                 "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "airflow-worker"):
        assert name in services, f"service {name} missing"
    worker = services["airflow-worker"]
    assert worker["environment"]["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert worker["environment"]["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://")
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "postgresql" in services["mlflow"]["command"] and "--artifacts-destination" in services["mlflow"]["command"]
    assert any(v.startswith("./:") for v in worker["volumes"]), "project code must be mounted"
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
