"""The IMDB distributed-training benchmark DAG: wiring only. Its UI page (``doc_md``), trigger form,
conf -> config step, cell plan and alert text are ``pipelines.run.dag_plan``; the step order is
``pipelines.run.runner``'s; every task calls one ``pipelines.run`` function with the run folder."""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow.providers.smtp.notifications.smtp import SmtpNotifier  # ~10 ms (smtplib)
from airflow.sdk import (Asset, CronTriggerTimetable, Param, TaskGroup, TriggerRule, chain, dag, get_current_context,
                         setup, task, teardown)

# light (pydantic, which Airflow has loaded): everything heavy is imported inside the tasks
from pipelines.run import dag_plan
from pipelines.run.runner import DATA_STEPS, FINISH_STEPS

log = logging.getLogger("imdb_benchmark")  # the module name Airflow gives the file is unreadable

# Published by `track` for every finished benchmark; consumers schedule on it by name.
BENCHMARK_SUMMARY = Asset(name="imdb_benchmark_summary", uri="x-benchmark://imdb_benchmark/summary",
                          group="benchmark")
ALERT_CONN_ID = "benchmark_alerts"  # SMTP connection; extra {"from_email": ..., "to": "a@x, b@y"}


def alert_notifier() -> SmtpNotifier:
    """A fresh notifier per task (rendering mutates it): the message comes from the run folder."""
    return SmtpNotifier(smtp_conn_id=ALERT_CONN_ID,
                        to=f"{{{{ conn.{ALERT_CONN_ID}.extra_dejson.get('to', '') }}}}",
                        subject="{{ benchmark_alert(ti, exception).subject }}",
                        html_content="{{ benchmark_alert(ti, exception).html }}")


def _logged(name: str, result):  # the task log shows what each step did
    log.info("%s: %s", name, result)
    return result


@task
def prepare_run() -> str:
    """Resolve the config (profile + params) and create the run folder; returns its path."""
    ctx = get_current_context()
    return dag_plan.start_run(dict(ctx["params"]), ctx["dag"].dag_id, ctx["run_id"])


@setup
def start_services(run_dir: str) -> dict:
    """The services the run's platforms declare (``Platform.services``: a standing cluster); name -> address."""
    from pipelines.run import stages

    return stages.start_services(run_dir)


@teardown
def stop_services(run_dir: str) -> list[int]:
    """Stop the run's services (if any), whatever the tasks before it did."""
    from pipelines.run import stages

    return stages.stop_services(run_dir)


@setup
def start_cluster(run_dir: str) -> dict | None:
    """cluster.kind=emulated: start the run's hosts (pipelines.cluster.lifecycle); its state."""
    from pipelines.run import stages

    return stages.start_cluster(run_dir)


@teardown
def stop_cluster(run_dir: str) -> list[str]:
    """Stop the run's emulated hosts (if any), whatever the tasks before it did."""
    from pipelines.run import stages

    return stages.stop_cluster(run_dir)


@task
def plan(run_dir: str, workers: int) -> list[dict]:
    """This run's cells with ``workers`` workers: the kwargs of the train.w<workers> instances."""
    return dag_plan.cells_with(run_dir, workers)


# retries=0: a failed cell is retried by stages.train_cell (matrix.cell_retries, resuming from its
# last checkpoint), the same policy as the CLI's; an Airflow retry would add more on top
@task(pool=dag_plan.POOL, retries=0, map_index_template=dag_plan.CELL_LABEL)
def train(run_dir: str, backend: str, strategy: str, network: str, workers: int, repeat: int) -> dict:
    """One (backend, strategy, network, workers, repeat) cell; retries resume from its last checkpoint."""
    from pipelines.run import stages

    result = stages.train_cell(run_dir, backend, workers, repeat, strategy=strategy, network=network)
    return _logged(f"train {backend} {strategy} {network} x{workers} r{repeat}", result)


@task
def run_step(run_dir: str, step: str) -> dict:
    """One step of pipelines.run.runner.DATA_STEPS or FINISH_STEPS (ingest, ..., check_regression)."""
    from pipelines.run import runner

    result = _logged(step, runner.run_step(step, run_dir))
    if step == "track":  # MLflow has the run: publish its summary as an event of the asset
        from pipelines.web.trends import asset_extra

        ctx = get_current_context()
        ctx["outlet_events"][BENCHMARK_SUMMARY].extra = asset_extra(run_dir, ctx["run_id"])
    return result


@dag(
    dag_id="imdb_benchmark",
    dag_display_name="IMDB distributed-training benchmark",
    description=dag_plan.description(),  # the platforms named from the registry
    doc_md=dag_plan.doc_md(),
    # Unpausing waits for the next 02:00: run_immediately=0 s, as Airflow 3.3 reads False as "run the
    # last 02:00 at once if under a tenth of a day old" (bench/RESULTS.md, the timetable finding).
    schedule=CronTriggerTimetable("0 2 * * *", timezone="UTC", run_immediately=timedelta(0)),
    catchup=False,
    max_active_runs=1,
    params={name: Param(**spec) for name, spec in dag_plan.param_specs().items()},  # the trigger form
    tags=["benchmark", "training", "mlflow"],
    default_args={"retries": 0},
    user_defined_macros={"benchmark_alert": dag_plan.benchmark_alert},  # the alert mails' text
)
def imdb_benchmark():
    run_dir = prepare_run()
    services_up, hosts_up = start_services(run_dir), start_cluster(run_dir)
    data_steps = [run_step.override(task_id=step)(run_dir, step) for step in DATA_STEPS]
    chain([services_up, hosts_up], *data_steps)
    with TaskGroup("train", tooltip="per worker count: plan_wN lists the cells, wN trains them "
                                    "(mapped, N pool slots each)") as train_group:
        for n in range(1, dag_plan.MAX_WORKERS + 1):
            cells = plan.override(task_id=f"plan_w{n}")(run_dir, n)
            data_steps[-1] >> cells
            train.override(task_id=f"w{n}", pool_slots=n).partial(run_dir=run_dir).expand_kwargs(cells)
    train_group >> stop_services(run_dir).as_teardown(setups=services_up)
    train_group >> stop_cluster(run_dir).as_teardown(setups=hosts_up)
    # evaluate runs once every cell is done, failed ones too (the report shows them); each later step after
    # the one before succeeded (the CLI's policy). evaluate and check_regression alert; track publishes.
    step_options = {"evaluate": {"trigger_rule": TriggerRule.ALL_DONE,
                                 "on_failure_callback": [alert_notifier()]},
                    "track": {"outlets": [BENCHMARK_SUMMARY]},
                    "check_regression": {"on_failure_callback": [alert_notifier()]}}
    chain(train_group, *[run_step.override(task_id=step, **step_options.get(step, {}))(run_dir, step)
                         for step in FINISH_STEPS])


imdb_benchmark()
