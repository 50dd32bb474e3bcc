#!/usr/bin/env python3
"""One-shot ``mlflow-init`` service of docker-compose.yaml: the benchmark's experiment and the
MLflow user the Celery workers log as. Idempotent: safe on every ``docker compose up``.

    MLFLOW_TRACKING_URI=http://mlflow:5000 MLFLOW_TRACKING_USERNAME=admin MLFLOW_TRACKING_PASSWORD=... \\
    MLFLOW_WORKER_USERNAME=benchmark-worker MLFLOW_WORKER_PASSWORD=... \\
    BENCHMARK_MLFLOW_EXPERIMENT=distributed-training-benchmark python docker/mlflow_init.py

As the server's admin (basic-auth app with workspaces on, ``mlflow server --enable-workspaces``:
creating an experiment then takes a workspace-wide grant, which this user never gets):
1. the user MLFLOW_WORKER_USERNAME exists, with MLFLOW_WORKER_PASSWORD (set again on every run, so
   a new password in .env takes effect at the next ``up``);
2. the experiment BENCHMARK_MLFLOW_EXPERIMENT exists (created here, by the admin; restored if it
   was deleted);
3. the user holds EDIT on that experiment alone (create runs, log metrics, params, tags and
   artifacts), and no workspace-wide grant: it can neither create an experiment nor read or
   change anyone else's;
4. checked as that user: creating an experiment is refused (403 PERMISSION_DENIED) -- a server
   that lets it through (workspaces off) fails this step, and the stack does not start.
The workers never see the admin's password. Exit status 0 when all of it holds, 1 otherwise.
"""

from __future__ import annotations

import os
import sys
import time

WAIT_S = float(os.environ.get("MLFLOW_INIT_WAIT_S") or 300)


def _wait_for_server(uri: str) -> None:
    import requests

    deadline, last = time.monotonic() + WAIT_S, None
    while time.monotonic() < deadline:
        try:
            if requests.get(uri.rstrip("/") + "/health", timeout=5).ok:
                return
        except requests.RequestException as err:
            last = err
        time.sleep(2)
    raise SystemExit(f"mlflow-init: {uri} did not answer /health within {WAIT_S:.0f}s ({last})")


class Api:
    """The server's REST API as the admin (plain HTTP: the auth app's Python client would import
    the server side of the auth app, Flask-WTF included)."""

    def __init__(self, uri: str, user: str, password: str):
        import requests

        self.base, self.session = uri.rstrip("/"), requests.Session()
        self.session.auth = (user, password)

    def call(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kwargs) -> tuple[int, dict]:
        resp = self.session.request(method, f"{self.base}/api/{path}", timeout=30, **kwargs)
        if resp.status_code not in ok:
            raise SystemExit(f"mlflow-init: {method} /api/{path} -> {resp.status_code}: {resp.text[:500]}")
        try:
            return resp.status_code, resp.json()
        except ValueError:  # refusals come as plain text ("Permission denied")
            return resp.status_code, {"text": resp.text}


def _ensure_user(api: Api, username: str, password: str) -> str:
    status, _ = api.call("GET", "2.0/mlflow/users/get", ok=(200, 404), params={"username": username})
    if status == 404:
        api.call("POST", "2.0/mlflow/users/create", json={"username": username, "password": password})
        return "created"
    api.call("PATCH", "2.0/mlflow/users/update-password", json={"username": username, "password": password})
    return "existed, password set"


def _ensure_experiment(api: Api, name: str) -> str:
    status, body = api.call("GET", "2.0/mlflow/experiments/get-by-name", ok=(200, 404),
                            params={"experiment_name": name})
    if status == 404:
        return api.call("POST", "2.0/mlflow/experiments/create", json={"name": name})[1]["experiment_id"]
    exp = body["experiment"]
    if exp.get("lifecycle_stage") == "deleted":
        api.call("POST", "2.0/mlflow/experiments/restore", json={"experiment_id": exp["experiment_id"]})
    return exp["experiment_id"]


def _ensure_grant(api: Api, username: str, resource_id: str, permission: str) -> None:
    """``permission`` on ("experiment", resource_id) for the user, whatever it held before."""
    key = {"username": username, "resource_type": "experiment", "resource_id": resource_id}
    api.call("POST", "3.0/mlflow/users/permissions/revoke", ok=(200, 404), json=key)  # none held: 404
    api.call("POST", "3.0/mlflow/users/permissions/grant", json={**key, "permission": permission})


def _check_cannot_create(uri: str, api: Api, user: str, password: str) -> None:
    """As the workers' user: creating an experiment must be refused."""
    probe = f"mlflow-init-probe-{os.getpid()}-{int(time.time())}"
    status, body = Api(uri, user, password).call("POST", "2.0/mlflow/experiments/create", ok=(200, 403),
                                                 json={"name": probe})
    if status == 200:
        api.call("POST", "2.0/mlflow/experiments/delete", json={"experiment_id": body["experiment_id"]})
        raise SystemExit(f"mlflow-init: {user} could create an experiment: the server must run with "
                         "--enable-workspaces (docker-compose.yaml) for resource grants to withhold creation")


def main() -> int:
    uri = os.environ["MLFLOW_TRACKING_URI"]
    admin = os.environ.get("MLFLOW_TRACKING_USERNAME") or "admin"
    user, password = os.environ["MLFLOW_WORKER_USERNAME"], os.environ["MLFLOW_WORKER_PASSWORD"]
    name = os.environ["BENCHMARK_MLFLOW_EXPERIMENT"]
    if user == admin:
        raise SystemExit("mlflow-init: MLFLOW_WORKER_USERNAME must not be the admin")
    _wait_for_server(uri)
    api = Api(uri, admin, os.environ["MLFLOW_TRACKING_PASSWORD"])
    how = _ensure_user(api, user, password)
    exp_id = _ensure_experiment(api, name)
    _ensure_grant(api, user, exp_id, "EDIT")
    _check_cannot_create(uri, api, user, password)
    print(f"mlflow-init: user {user} ({how}): EDIT on experiment {name!r} (id {exp_id}) only; "
          "creating an experiment: 403 (checked)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
