"""The Airflow plugin: registered parts, and Airflow's login in front of every route.

Uses Airflow's real auth dependency (``requires_authenticated``) and its real auth manager; a
valid login is exercised by tests/e2e (it needs the metadata database for revoked tokens).
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
