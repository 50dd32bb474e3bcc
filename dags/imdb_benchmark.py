"""
### IMDB distributed-training benchmark

Trains BERT-tiny on IMDB sentiment through **PyTorch DDP** (torchrun), **Spark
TorchDistributor**, **Determined AI** and **Ray Train** (TorchTrainer; a local Ray cluster per
cell, or the cluster at `BENCHMARK_RAY_ADDRESS`) at several worker counts, then compares time,
accuracy, scaling and platform overhead, and logs everything to MLflow.

```
prepare_run -> start_spark_cluster, start_cluster (setup) -> ingest -> validate_snapshot
  -> preprocess -> validate_tokens -> train.plan_wN -> train.wN   for N = 1..4 (mapped: one
  instance per backend x strategy x network x repeat) -> stop_spark_cluster, stop_cluster
  (teardown: run whatever happened before)
  -> evaluate (runs when every cell is done, failed ones included) -> report -> track
  -> check_regression
```

With `spark_master=embedded` (the nightly and paper profiles) the run starts its own Spark
standalone cluster (`pipelines.engines.spark_cluster`: master + one 1-core worker per CPU core on
127.0.0.1) for preprocessing and the spark cells, and the teardown task stops it, also when a
task failed; with any other master both tasks do nothing. With `cluster.kind=emulated` (the
`cluster` profile) `start_cluster` builds the run's emulated hosts (`pipelines.cluster.lifecycle`:
network namespaces with shaped links, one core each, on this machine: the train tasks must run
on it, as with LocalExecutor) and `stop_cluster` removes them.

The steps after training are `pipelines.run.runner.FINISH_STEPS`, the same order and failure
policy as `python -m pipelines run` (a step runs only when the one before succeeded; failed
cells fail the run at `check_regression`, after their report). Every task calls one function
of `pipelines.run.stages` (or `pipelines.run.runner.run_step`) with the run folder
`<output_root>/<run_id>/`; XCom carries only that path and the small dicts the stages
return. Each step reads the resolved config from `<run folder>/config.json`, so a task can be
cleared and re-run on its own.

**Params** (trigger form): `profile` picks the defaults (smoke = minutes on a laptop,
nightly = the scheduled run, paper = the published study); every other field left empty
keeps the profile's value. `overrides` sets any other `BenchmarkConfig` field.
Fields left empty that the machine must supply (data, tokenizer, model, output folder) come
from the environment: `BENCHMARK_OUTPUT_ROOT`, `BENCHMARK_DATASET_SOURCE`,
`BENCHMARK_TOKENIZER_SOURCE`, `BENCHMARK_MODEL_SOURCE` (set by `scripts/airflow_env.sh`); so do
the engines' addresses (`BENCHMARK_SPARK_MASTER`, `BENCHMARK_DETERMINED_MASTER`,
`BENCHMARK_RAY_ADDRESS`), which a trigger cannot set.

**Training slots.** The timed part of every cell holds a host-wide lock (pipelines.measure.attempts), so
two cells are never timed on one host at once, whoever started them. Each `train.wN` task takes
N slots of the pool `training_workers`
(`scripts/airflow_setup.sh` sizes it to the GPU count, or the CPU count without GPUs), so the
cells running at once never ask for more workers than the machine has. Airflow cannot give
each mapped instance its own `pool_slots` (apache/airflow#35803), hence one mapped task per
worker count, fed by a small `plan_wN` task; those without cells are skipped. Worker counts
above 4 or above the pool's size are refused by `prepare_run` (a task asking more slots than
its pool holds would never be scheduled). A failed cell is retried `matrix.cell_retries` times (default 2) by
`pipelines.run.stages.train_cell`, resuming from its last checkpoint: the CLI's policy too.

**Schedule**: every night at 02:00 UTC with the nightly profile; unpausing does not start a
run for the past night. One run at a time.

**Alerts**: when `check_regression` fails (regression alarm, or failed training cells) or
`evaluate` fails, an `SmtpNotifier` mails the run, the cells and their old/new values through
the Airflow connection `benchmark_alerts` (SMTP; recipients in its extra `to`). Without that
connection the callback only logs that it is missing.

**Asset**: `track` publishes the asset `imdb_benchmark_summary` on every finished benchmark
(event extra: run id, run folder, summary.json path, profile, status), so other DAGs can be
scheduled on new results: `schedule=[Asset.ref(name="imdb_benchmark_summary")]`.

Run it without a server:
`airflow dags test imdb_benchmark -c '{"profile": "smoke"}'` (after
`source scripts/airflow_env.sh && bash scripts/airflow_setup.sh`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from airflow.providers.smtp.notifications.smtp import SmtpNotifier  # ~10 ms (smtplib)
from airflow.sdk import (
    Asset,
    CronTriggerTimetable,
    Param,
    TaskGroup,
    TriggerRule,
    dag,
    get_current_context,
    setup,
    task,
    teardown,
)

# `pipelines` is installed in Airflow's environment (scripts/bootstrap.sh: pip install -e .).
# pipelines.config and .runner need only pydantic, which Airflow has already imported: ~5 ms.
# They keep the form's choices and bounds, and the step order, identical to the CLI's.
# Everything heavy is imported inside tasks.
from pipelines import platforms
from pipelines.config import PROFILES, deployment_keys, form_schema, site_defaults
from pipelines.run.runner import FINISH_STEPS

log = logging.getLogger("imdb_benchmark")  # the module name Airflow gives the file is unreadable

POOL = "training_workers"
MAX_WORKERS = 4  # one train task per worker count 1..MAX_WORKERS (see docstring); raise freely
SLOTS_ENV = "BENCHMARK_TRAINING_SLOTS"  # the pool's size, exported by scripts/airflow_env.sh


def _field(key: str, title: str, section: str, description: str = "", **form) -> Param:
    """The form field of config field ``key`` (its flat name, as trigger forms have always sent it):
    type, bounds and choices from the config's JSON schema; empty (null) keeps the profile's value."""
    return Param(None, title=title, section=section, description=description or None,
                 **{**form_schema(key), **form})


def _profiles_md() -> str:
    rows = ["| profile | train / test reviews | seq len | epochs | workers | repeats |",
            "|---|---|---|---|---|---|"]
    for name, p in PROFILES.items():
        rows.append(f"| {name} | {p['train_samples'] or 'all'} / {p['test_samples'] or 'all'} | "
                    f"{p['max_seq_len']} | {p['epochs']} | {p['worker_counts']} | {p['repeats']} |")
    return "Defaults for every field left empty below.\n\n" + "\n".join(rows)


BACKENDS = platforms.names()
PARAMS = {
    "profile": Param("nightly", type="string", enum=list(PROFILES), title="Profile",
                     description_md=_profiles_md(), section="Profile"),
    "backends": _field("backends", "Backends", "Training matrix", uniqueItems=True, examples=BACKENDS,  # multi-select
                       description="Platforms to compare; empty = the profile's (all; smoke leaves out "
                                   "spark_dataframe, which needs a Spark cluster)."),
    "worker_counts": _field("worker_counts", "Worker counts", "Training matrix",
                            items={"type": "integer", "minimum": 1, "maximum": MAX_WORKERS},
                            description=f"World sizes to run as a JSON list, e.g. [1, 2] (each 1..{MAX_WORKERS}); "
                                        "empty = the profile's."),
    "repeats": _field("repeats", "Repeats", "Training matrix", "Runs of every cell (for medians)."),
    "strategies": _field("strategies", "Training strategies", "Training matrix", uniqueItems=True,
                         description_md="Strategies to compare, each a cell of its own (every backend x strategy "
                                        "x worker count): `default`, `fp16`, `bf16` (GPU only), `powersgd-r<rank>`, "
                                        "`localsgd-<steps>` (local SGD, parameters averaged every N steps), `fsdp`, "
                                        "`weighted_sampler`, `weighted_loss`; combine with `+` "
                                        "(`fsdp+weighted_loss`). Comm strategies have no 1-worker cell; "
                                        "a strategy a backend cannot run (Determined: comm hooks, local SGD, "
                                        "FSDP) is refused before any work. Empty = `default` only."),
    "networks": _field("networks", "Networks", "Training matrix", uniqueItems=True,
                       examples=["unshaped", "10gbit", "1gbit", "100mbit"],
                       description="Links between the emulated hosts (cluster profile), each a cell of its own: "
                                   "unshaped, 10gbit, 1gbit, 100mbit or <n>mbit; empty = the profile's."),
    "class_ratio": _field("class_ratio", "Class ratio", "Data",
                          "Imbalanced train sample on purpose: every other class gets this fraction of "
                          "label 0's rows (test stays balanced); empty = stratified as the source."),
    "epochs": _field("epochs", "Epochs", "Training", "Training epochs per cell."),
    "batch_size": _field("batch_size", "Batch size", "Training", "Per worker, or global (batch policy)."),
    "learning_rate": _field("learning_rate", "Learning rate", "Training", "AdamW peak learning rate at 1 worker."),
    "batch_policy": _field("batch_policy", "Batch policy", "Training",
                           "per_worker: batch size per worker (the global batch grows); "
                           "global: the batch size is split over the workers."),
    "lr_scaling": _field("lr_scaling", "Learning-rate scaling", "Training",
                         "How the learning rate follows the global batch."),
    "target_accuracy": _field("target_accuracy", "Target accuracy", "Training",
                              "Held-out accuracy that defines time-to-accuracy."),
    "seed": _field("seed", "Seed", "Training", "Sampling, initialisation and shuffling."),
    "train_samples": _field("train_samples", "Train reviews", "Data", "Stratified sample of the train split."),
    "test_samples": _field("test_samples", "Test reviews", "Data", "Stratified sample of the test split."),
    "max_seq_len": _field("max_seq_len", "Max sequence length", "Data", "Tokens per review."),
    "overrides": Param(None, type=["object", "null"], title="Other config fields", section="Advanced",
                       description_md="JSON object of any other config field, by dotted path or flat name, e.g. "
                                      '`{"training.warmup_ratio": 0.2}`; unknown keys are refused, and so are '
                                      "deployment fields (data, model and output locations, masters, "
                                      "tracking URI): those come from the workers' environment."),
}
# Form fields that map 1:1 onto BenchmarkConfig fields.
CONFIG_PARAMS = tuple(k for k in PARAMS if k not in ("profile", "overrides"))


def overrides_from_params(params: dict, environ: dict | None = None) -> dict:
    """Trigger params -> config overrides: site defaults from env, then the non-empty params. Deployment
    fields come from the environment only (deployment_keys); profiles (``overrides.profile`` too) from PROFILES."""
    from pipelines.config.loading import check_profiles  # ConfigError: the field and the names
    check_profiles(params.get("profile"), params.get("overrides"))
    given = {k: v for k, v in params.items() if k not in ("profile", "overrides")}
    refused = deployment_keys({**given, **(params.get("overrides") or {})})
    if refused:
        raise ValueError(f"{', '.join(refused)}: set by the deployment (BENCHMARK_* / MLFLOW_TRACKING_URI "
                         "environment of the Airflow workers), not by a trigger")
    if unknown := sorted(set(params) - set(PARAMS)):  # a conf key no form field has: never ignored
        raise ValueError(f"{', '.join(unknown)}: not a trigger field ({', '.join(PARAMS)}); put other config "
                         'fields in "overrides"')
    overrides = site_defaults(os.environ if environ is None else environ)
    overrides.update({k: params[k] for k in CONFIG_PARAMS if params.get(k) not in (None, "", [])})
    overrides.update(params.get("overrides") or {})
    return overrides


def plan_by_workers(cells: list[tuple], pool_slots: int | None) -> dict[str, list[dict]]:
    """Cells grouped by worker count -> kwargs lists for the train.wN tasks ("w1".."w4")."""
    plan: dict[str, list[dict]] = {f"w{n}": [] for n in range(1, MAX_WORKERS + 1)}
    for backend, strategy, network, workers, repeat in cells:
        if workers > MAX_WORKERS:
            raise ValueError(f"worker_counts: {workers} is above the DAG's maximum {MAX_WORKERS} "
                             f"(one train task per count); run it with `python -m pipelines` instead")
        if pool_slots is not None and workers > pool_slots:
            # The scheduler never starts a task that asks for more slots than its pool holds.
            raise ValueError(f"worker_counts: {workers} workers need {workers} slots of pool {POOL!r}, "
                             f"which has {pool_slots} ({SLOTS_ENV}; GPU or CPU count). Lower worker_counts "
                             f"or resize the pool: {SLOTS_ENV}={workers} bash scripts/airflow_setup.sh")
        plan[f"w{workers}"].append({"backend": str(backend), "strategy": strategy, "network": network,
                                    "workers": workers, "repeat": repeat})
    return plan


# Published by `track` for every finished benchmark; consumers schedule on it by name.
BENCHMARK_SUMMARY = Asset(name="imdb_benchmark_summary", uri="x-benchmark://imdb_benchmark/summary",
                          group="benchmark")
ALERT_CONN_ID = "benchmark_alerts"  # SMTP connection; extra {"from_email": ..., "to": "a@x, b@y"}


def benchmark_alert(ti, exception=None):
    """Jinja macro of the alert mails: subject/text/html of this run's alert (pipelines.tracking.alerts)."""
    from pipelines.tracking.alerts import build_alert

    run_dir = ti.xcom_pull(task_ids="prepare_run")
    return build_alert(run_dir, dag_run_id=ti.run_id, task_id=ti.task_id, exception=exception)


def alert_notifier() -> SmtpNotifier:
    """A fresh notifier per task (rendering mutates it): the message comes from the run folder."""
    return SmtpNotifier(
        smtp_conn_id=ALERT_CONN_ID,
        to=f"{{{{ conn.{ALERT_CONN_ID}.extra_dejson.get('to', '') }}}}",
        subject="{{ benchmark_alert(ti, exception).subject }}",
        html_content="{{ benchmark_alert(ti, exception).html }}",
    )


def _logged(name: str, result: dict) -> dict:
    log.info("%s: %s", name, result)
    return result


@dag(
    dag_id="imdb_benchmark",
    dag_display_name="IMDB distributed-training benchmark",
    description="BERT-tiny on IMDB through DDP, Spark TorchDistributor and Determined; report + MLflow",
    doc_md=__doc__,
    # Trigger timetable without start_date: unpausing waits for the next 02:00, no catch-up run.
    schedule=CronTriggerTimetable("0 2 * * *", timezone="UTC"),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    tags=["benchmark", "training", "mlflow"],
    default_args={"retries": 0},
    user_defined_macros={"benchmark_alert": benchmark_alert},
)
def imdb_benchmark():
    @task
    def prepare_run() -> str:
        """Resolve the config (profile + params) and create the run folder; returns its path."""
        from pipelines.run import stages
        from pipelines.config import load_config
        from pipelines.web.trends import record_dag_run

        ctx = get_current_context()
        params = dict(ctx["params"])
        overrides = overrides_from_params(params)
        # Refuse worker counts the train tasks cannot run (Airflow's pool) before any work is done.
        slots = os.environ.get(SLOTS_ENV)
        plan_by_workers(load_config(params["profile"], overrides).cells(), int(slots) if slots else None)
        # the CLI's start of a run: config, preflight (seconds, not a data stage), run folder
        run_dir = stages.prepare_run(params["profile"], overrides, run_id=ctx["run_id"])
        record_dag_run(run_dir, ctx["dag"].dag_id, ctx["run_id"])  # the page links back to this run
        log.info("run folder: %s", run_dir)
        return run_dir

    @setup
    def start_spark_cluster(run_dir: str) -> str | None:
        """spark_master=embedded: start the run's standalone cluster; returns its URL."""
        from pipelines.engines import spark_cluster
        from pipelines.config import read_config
        from pipelines.runfolder.paths import RunPaths

        paths = RunPaths(Path(run_dir))
        if read_config(paths.config).engine("spark").master != spark_cluster.EMBEDDED:
            log.info("spark_master is not 'embedded': no cluster to start")
            return None
        return spark_cluster.start(paths)

    @teardown
    def stop_spark_cluster(run_dir: str) -> list[int]:
        """Stop the run's embedded cluster (if any), whatever the tasks before it did."""
        from pipelines.engines import spark_cluster
        from pipelines.runfolder.paths import RunPaths

        return spark_cluster.stop(RunPaths(Path(run_dir)))

    @setup
    def start_cluster(run_dir: str) -> dict | None:
        """cluster.kind=emulated: start the run's hosts (pipelines.cluster.lifecycle); its state."""
        from pipelines.cluster import lifecycle
        from pipelines.config import read_config
        from pipelines.runfolder.paths import RunPaths

        paths = RunPaths(Path(run_dir))
        return lifecycle.start(paths, read_config(paths.config))

    @teardown
    def stop_cluster(run_dir: str) -> list[str]:
        """Stop the run's emulated hosts (if any), whatever the tasks before it did."""
        from pipelines.cluster import lifecycle
        from pipelines.runfolder.paths import RunPaths

        return lifecycle.stop(RunPaths(Path(run_dir)))

    @task
    def ingest(run_dir: str) -> dict:
        from pipelines.run import stages

        return _logged("ingest", stages.ingest(run_dir))

    @task
    def validate_snapshot(run_dir: str) -> dict:
        from pipelines.run import stages

        return _logged("validate_snapshot", stages.validate_snapshot(run_dir))

    @task
    def preprocess(run_dir: str) -> dict:
        from pipelines.run import stages

        return _logged("preprocess", stages.preprocess(run_dir))

    @task
    def validate_tokens(run_dir: str) -> dict:
        from pipelines.run import stages

        return _logged("validate_tokens", stages.validate_tokens(run_dir))

    @task
    def plan(run_dir: str, workers: int) -> list[dict]:
        """This run's cells with ``workers`` workers: the kwargs of the train.w<workers> instances."""
        from pipelines.config import read_config
        from pipelines.runfolder.paths import RunPaths

        cells = plan_by_workers(read_config(RunPaths(Path(run_dir)).config).cells(), None)[f"w{workers}"]
        log.info("cells with %d worker(s): %s", workers, cells or "none (the train task is skipped)")
        return cells

    # retries=0: a failed cell is retried by stages.train_cell (matrix.cell_retries, resuming from its
    # last checkpoint), the same policy as the CLI's; an Airflow retry would add more on top
    @task(pool=POOL, retries=0,
          map_index_template="{{ task.op_kwargs['backend'] }} {{ task.op_kwargs['strategy'] }}"
                             " {{ task.op_kwargs['network'] }} x{{ task.op_kwargs['workers'] }}"
                             " r{{ task.op_kwargs['repeat'] }}")
    def train(run_dir: str, backend: str, strategy: str, network: str, workers: int, repeat: int) -> dict:
        """One (backend, strategy, network, workers, repeat) cell; a retry resumes from its last checkpoint."""
        from pipelines.run import stages

        result = stages.train_cell(run_dir, backend, workers, repeat, strategy=strategy, network=network)
        return _logged(f"train {backend} {strategy} {network} x{workers} r{repeat}", result)

    @task
    def finish_step(run_dir: str, step: str) -> dict:
        """One step of pipelines.run.runner.FINISH_STEPS (evaluate, report, track, check_regression)."""
        from pipelines.run import runner

        result = _logged(step, runner.run_step(step, run_dir))
        if step == "track":  # MLflow has the run: publish its summary as an event of the asset
            from pipelines.web.trends import asset_extra

            ctx = get_current_context()
            ctx["outlet_events"][BENCHMARK_SUMMARY].extra = asset_extra(run_dir, ctx["run_id"])
        return result

    run_dir = prepare_run()
    cluster_up = start_spark_cluster(run_dir)
    hosts_up = start_cluster(run_dir)
    data_steps = [ingest(run_dir), validate_snapshot(run_dir), preprocess(run_dir), validate_tokens(run_dir)]
    [cluster_up, hosts_up] >> data_steps[0]
    for before, after in zip(data_steps, data_steps[1:]):
        before >> after
    with TaskGroup("train", tooltip="per worker count: plan_wN lists the cells, wN trains them "
                                    "(mapped, N pool slots each)") as train_group:
        for n in range(1, MAX_WORKERS + 1):
            cells = plan.override(task_id=f"plan_w{n}")(run_dir, n)
            data_steps[-1] >> cells
            train.override(task_id=f"w{n}", pool_slots=n).partial(run_dir=run_dir).expand_kwargs(cells)
    train_group >> stop_spark_cluster(run_dir).as_teardown(setups=cluster_up)
    train_group >> stop_cluster(run_dir).as_teardown(setups=hosts_up)
    # evaluate runs once every cell is done, failed ones included, so the report shows them;
    # each later step only after the one before succeeded (the CLI's policy too).
    previous = train_group
    # evaluate (no result at all) and check_regression (regression, failed cells) alert people;
    # track publishes the summary asset.
    step_options = {"evaluate": {"on_failure_callback": [alert_notifier()]},
                    "track": {"outlets": [BENCHMARK_SUMMARY]},
                    "check_regression": {"on_failure_callback": [alert_notifier()]}}
    for i, step in enumerate(FINISH_STEPS):
        rule = TriggerRule.ALL_DONE if i == 0 else TriggerRule.ALL_SUCCESS
        current = finish_step.override(task_id=step, trigger_rule=rule,
                                       **step_options.get(step, {}))(run_dir, step)
        previous >> current
        previous = current


imdb_benchmark()
