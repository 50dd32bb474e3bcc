"""Airflow UI plugin "Benchmarks": trends of the nightly runs, one run's report, two runs compared.

Mounts the FastAPI app of ``pipelines.web.view`` on Airflow's API server at ``/benchmarks`` and
adds a "Benchmarks" entry to the UI's navigation that shows the page inside the Airflow UI
(``/plugin/benchmarks``). Every route requires Airflow's login: the JWT of the auth manager,
from the ``_token`` cookie the UI sets at login or an ``Authorization: Bearer`` header
(no credential -> 401, an invalid one -> 403), and read permission on the benchmark DAG
(``imdb_benchmark``; the page shows its runs): Airflow's own ``requires_access_dag("GET")``
asks the configured auth manager (``is_authorized_dag`` with the DAG's details, its team
included), a user without it gets 403. Airflow does not protect plugin apps itself.

Reads env BENCHMARK_OUTPUT_ROOT (default ``<project>/runs``) and MLFLOW_UI_URL; see
pipelines/web/view.py. Airflow loads this file from its plugins folder
(``AIRFLOW__CORE__PLUGINS_FOLDER``, set by scripts/airflow_env.sh); check it with
``airflow plugins``.
"""

from __future__ import annotations

from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin

from pipelines.web.view import create_app  # the page logic; `pipelines` is installed with Airflow

URL_PREFIX = "/benchmarks"
DAG_ID = "imdb_benchmark"  # dags/imdb_benchmark.py: the DAG whose runs the page shows

# login (401/403 as Airflow's API) + DAG read permission on DAG_ID (403 "Forbidden")
app = create_app(auth=requires_access_dag(method="GET", param_dag_id=DAG_ID))


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
