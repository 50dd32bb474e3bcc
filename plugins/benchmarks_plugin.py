"""Airflow UI plugin "Benchmarks": trends of the nightly runs, one run's report, two runs compared.

Mounts the FastAPI app of ``pipelines.webview`` on Airflow's API server at ``/benchmarks`` and
adds a "Benchmarks" entry to the UI's navigation that shows the page inside the Airflow UI
(``/plugin/benchmarks``). Every route requires Airflow's login: the JWT of the auth manager,
from the ``_token`` cookie the UI sets at login or an ``Authorization: Bearer`` header
(no credential -> 401, an invalid one -> 403).

Reads env BENCHMARK_OUTPUT_ROOT (default ``<project>/runs``) and MLFLOW_UI_URL; see
pipelines/webview.py. Airflow loads this file from its plugins folder
(``AIRFLOW__CORE__PLUGINS_FOLDER``, set by scripts/airflow_env.sh); check it with
``airflow plugins``.
"""

from __future__ import annotations

from airflow.api_fastapi.core_api.security import requires_authenticated
from airflow.plugins_manager import AirflowPlugin

from pipelines.webview import create_app  # the page logic; `pipelines` is installed with Airflow

URL_PREFIX = "/benchmarks"

app = create_app(auth=requires_authenticated())


class BenchmarksPlugin(AirflowPlugin):
    name = "benchmarks"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Benchmarks"}]
    # url_route set: the UI embeds href in its own frame at /plugin/benchmarks (same origin,
    # so the login cookie goes along); without it the entry would be a plain external link.
    external_views = [
        {
            "name": "Benchmarks",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "benchmarks",
            "nav_top_level": True,
        }
    ]
