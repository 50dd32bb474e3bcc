"""The Airflow plugin: registered parts, Airflow's login and the DAG's read permission in front
of every route.

Uses Airflow's real auth dependency (``requires_access_dag``), its real auth manager (the simple
one, Airflow's default) and real JWTs it signs. Two lookups of the metadata database are stubbed
here (a token's revocation, the DAG's team): there is no database in these tests; tests/e2e runs
the same path against a real API server and database.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from fastapi.testclient import TestClient


pytest.importorskip("airflow")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plugin_module():
    spec = importlib.util.spec_from_file_location(
        "benchmarks_plugin", PROJECT_ROOT / "plugins" / "benchmarks_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plugin_declares_app_and_nav_entry(plugin_module):
    plugin = plugin_module.BenchmarksPlugin
    assert plugin.name == "benchmarks"
    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == "/benchmarks" and app["app"] is plugin_module.app
    [view] = plugin.external_views
    assert view["name"] == "Benchmarks" and view["destination"] == "nav"
    assert view["href"] == "/benchmarks/"


def test_routes_refuse_requests_without_airflow_login(plugin_module, tmp_path, monkeypatch):
    from airflow.api_fastapi.app import create_auth_manager

    create_auth_manager()  # the singleton the real dependency asks for a bad token
    monkeypatch.setenv("BENCHMARK_OUTPUT_ROOT", str(tmp_path))
    client = TestClient(plugin_module.app)
    for url in ["/", "/api/runs", "/runs/x/report/a.png"]:
        assert client.get(url).status_code == 401, url  # no credential at all
        bad_bearer = client.get(url, headers={"Authorization": "Bearer not-a-jwt"})
        assert bad_bearer.status_code == 403, url
        client.cookies.set("_token", "forged")
        assert client.get(url).status_code == 403, url  # forged UI cookie
        client.cookies.clear()


@pytest.fixture
def signed_in(plugin_module, tmp_path, monkeypatch):
    """``token(user)`` -> headers with a JWT of Airflow's auth manager for that user; the page
    reads an empty output root. Returns (token, calls): the auth manager's is_authorized_dag calls."""
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.models.dag import DagModel
    from airflow.models.revoked_token import RevokedToken

    manager = create_auth_manager()
    monkeypatch.setattr(RevokedToken, "is_revoked", classmethod(lambda cls, jti, session=None: False))
    monkeypatch.setattr(DagModel, "get_team_name", staticmethod(lambda dag_id, session=None: "benchmarks"))
    calls = []
    real = manager.is_authorized_dag

    def spy(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(manager, "is_authorized_dag", spy)
    monkeypatch.setenv("BENCHMARK_OUTPUT_ROOT", str(tmp_path))

    def token(user) -> dict[str, str]:
        return {"Authorization": f"Bearer {manager.generate_jwt(user)}"}

    return token, calls


def test_routes_need_read_permission_on_the_benchmark_dag(plugin_module, signed_in):
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser as User

    token, calls = signed_in
    client = TestClient(plugin_module.app)
    allowed = [User(username="viewer", role="viewer", teams=["benchmarks"]),  # read access to DAGs
               User(username="admin", role="admin")]
    refused = [User(username="no-role", role=None),  # the simple auth manager: no role, no permission
               User(username="other-team", role="op", teams=["marketing"])]  # the DAG is team benchmarks'
    for url in ["/", "/runs", "/compare", "/api/runs", "/static/benchmarks.js"]:
        for user in allowed:
            assert client.get(url, headers=token(user)).status_code == 200, (url, user.username)
        for user in refused:
            resp = client.get(url, headers=token(user))
            assert (resp.status_code, resp.json()) == (403, {"detail": "Forbidden"}), (url, user.username)
    assert calls and all(c["method"] == "GET" and c["details"].id == plugin_module.DAG_ID == "imdb_benchmark"
                         and c["details"].team_name == "benchmarks" for c in calls)


def test_page_is_sent_with_its_content_security_policy(plugin_module, signed_in):
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser as User

    token, _ = signed_in
    viewer = User(username="viewer", role="viewer", teams=["benchmarks"])
    resp = TestClient(plugin_module.app).get("/", headers=token(viewer))
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    csp = {d.split()[0]: d.split()[1:] for d in resp.headers["content-security-policy"].split("; ")}
    assert csp["script-src"] == ["'self'"] and csp["object-src"] == ["'none'"]
    assert csp["base-uri"] == ["'none'"] and csp["frame-ancestors"] == ["'self'"]
    assert "<script>" not in resp.text  # no inline script: it would not run under script-src 'self'
