"""What the ``imdb_benchmark`` DAG decides, so that ``dags/imdb_benchmark.py`` only wires tasks.

    params={n: Param(**s) for n, s in dag_plan.param_specs().items()}   # the trigger form (Airflow Params)
    dag_plan.config_from_params(params)                  # trigger conf -> BenchmarkConfig
    run_dir = dag_plan.start_run(params, dag_id, run_id) # the prepare_run task
    dag_plan.cells_with(run_dir, workers)                # plan_wN: the kwargs of train.wN's instances
    user_defined_macros={"benchmark_alert": dag_plan.benchmark_alert}   # the alert mails' text

``doc_md()`` is the DAG's page in the Airflow UI and ``description()`` its one line, the platforms
named from the registry. The step order is ``pipelines.run.runner``'s
(``DATA_STEPS``, ``FINISH_STEPS``) and the clusters' start/stop are ``pipelines.run.stages``'
functions: the CLI's ``run`` reads the same ones.

Light at import (the config's pydantic models and the platform registry; Airflow has loaded
pydantic already): the DAG file imports it at parse time. Everything heavy is imported inside
the functions the tasks call.
"""

from __future__ import annotations

import logging
import os
from string import Template
from typing import Any

from pipelines import platforms
from pipelines.config import (
    PROFILES, SET_NULL, BenchmarkConfig, deployment_fields, deployment_keys, form_schema, load_config,
    site_defaults,
)

log = logging.getLogger(__name__)

POOL = "training_workers"
CELL_LABEL = ("{{ task.op_kwargs['backend'] }} {{ task.op_kwargs['strategy'] }} {{ task.op_kwargs['network'] }}"
              " x{{ task.op_kwargs['workers'] }} r{{ task.op_kwargs['repeat'] }}")  # a train instance's map index
MAX_WORKERS = 4  # one train task per worker count 1..MAX_WORKERS (see doc_md()); raise freely
SLOTS_ENV = "BENCHMARK_TRAINING_SLOTS"  # the pool's size, exported by scripts/airflow_env.sh
NOT_CONFIG = ("profile", "overrides")  # the form fields that are not one BenchmarkConfig field each

DOC_MD = Template("""
### IMDB distributed-training benchmark

Trains BERT-tiny on IMDB sentiment through ${platforms} (each platform's package says how it
runs) at several worker counts, then compares time, accuracy, scaling and platform overhead, and
logs everything to MLflow.

```
prepare_run -> start_services, start_cluster (setup) -> ingest -> validate_snapshot
  -> preprocess -> validate_tokens -> train.plan_wN -> train.wN   for N = 1..4 (mapped: one
  instance per backend x strategy x network x repeat) -> stop_services, stop_cluster
  (teardown: run whatever happened before)
  -> evaluate (runs when every cell is done, failed ones included) -> report -> track
  -> check_regression
```

`start_services` starts the services the run's platforms declare (`Platform.services`: a cluster
a platform keeps standing for its cells on 127.0.0.1, which preprocessing may use too; see each
platform's package) where the config wants them, and the teardown task `stop_services` stops
them, also when a task failed; where it wants none both tasks do nothing. With
`cluster.kind=emulated` (the `cluster` profile) `start_cluster` builds the run's emulated hosts
(`pipelines.cluster.lifecycle`: network namespaces with shaped links, one core each, on this
machine: the train tasks must run on it, as with LocalExecutor) and `stop_cluster` removes them.
These four tasks call the functions of `pipelines.run.stages` that `python -m pipelines run`
starts and stops its clusters with.

The data steps are `pipelines.run.runner.DATA_STEPS` and the steps after training
`pipelines.run.runner.FINISH_STEPS`: the same order and failure policy as `python -m pipelines run`
(a step runs only when the one before succeeded; failed cells fail the run at `check_regression`,
after their report). Every task calls one function of `pipelines.run.stages` (or
`pipelines.run.runner.run_step`) with the run folder `<output_root>/<run_id>/`; XCom carries only
that path and the small dicts the stages return. Each step reads the resolved config from
`<run folder>/config.json`, so a task can be cleared and re-run on its own.

**Params** (trigger form): `profile` picks the defaults (smoke = minutes on a laptop,
nightly = the scheduled run, paper = the published study); every other field left empty
keeps the profile's value. `overrides` sets any other `BenchmarkConfig` field.
Fields left empty that the machine must supply (data, tokenizer, model, output folder) come
from the environment: `BENCHMARK_OUTPUT_ROOT`, `BENCHMARK_DATASET_SOURCE`,
`BENCHMARK_TOKENIZER_SOURCE`, `BENCHMARK_MODEL_SOURCE` (set by `scripts/airflow_env.sh`); so do
the engines' addresses (${engine_variables}), which a trigger cannot set. The form, the
conf -> config step and the cell plan are `pipelines.run.dag_plan`.

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
""")  # doc_md() fills it from the registry


def _platform_labels() -> list[str]:
    """The labels of the platforms a run trains by default, one per platform package (its variants and
    second data feeds are the same platform), in report order."""
    labels: dict[str, str] = {}
    for p in platforms.all_platforms():
        if platforms.is_builtin(p) and p.default:
            labels.setdefault(p.package, p.label)
    return list(labels.values())


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else "".join(items)


def _strategy_notes() -> str:
    """What each platform cannot run, from its record (``Platform.strategy_note``), for the form's help."""
    notes = [f"{p.label}: {p.strategy_note}" for p in platforms.all_platforms() if p.strategy_note]
    return "; ".join(notes) or "none today"


def doc_md() -> str:
    """The DAG's page (Markdown): ``DOC_MD`` with the registry's platforms and the engines' variables."""
    variables = [f"`{var}`" for path, var in deployment_fields().items() if path.startswith("engines.") and var]
    return DOC_MD.substitute(platforms=_and([f"**{label}**" for label in _platform_labels()]),
                             engine_variables=", ".join(variables))


def description() -> str:
    """The DAG's one line in the Airflow UI."""
    return f"BERT-tiny on IMDB through {_and(_platform_labels())}; report + MLflow"


def _field(key: str, title: str, section: str, description: str = "", **form: Any) -> dict[str, Any]:
    """The form field of config field ``key`` (its flat name, as trigger forms have always sent it):
    type, bounds and choices from the config's JSON schema; empty (null) keeps the profile's value."""
    return {"default": None, "title": title, "section": section, "description": description or None,
            **form_schema(key), **form}


def _profiles_md() -> str:
    rows = ["| profile | train / test reviews | seq len | epochs | workers | repeats |",
            "|---|---|---|---|---|---|"]
    for name, p in PROFILES.items():
        rows.append(f"| {name} | {p['train_samples'] or 'all'} / {p['test_samples'] or 'all'} | "
                    f"{p['max_seq_len']} | {p['epochs']} | {p['worker_counts']} | {p['repeats']} |")
    return "Defaults for every field left empty below.\n\n" + "\n".join(rows)


def param_specs() -> dict[str, dict[str, Any]]:
    """The trigger form, field by field: the keyword arguments of each ``airflow.sdk.Param``
    (default, description, JSON-schema keywords, the form's title and section), built from the
    config's schema, its PROFILES and the platform registry."""
    return {
        "profile": {"default": "nightly", "type": "string", "enum": list(PROFILES), "title": "Profile",
                    "description_md": _profiles_md(), "section": "Profile"},
        "backends": _field("backends", "Backends", "Training matrix", uniqueItems=True,
                           examples=platforms.names(),  # the UI's multi-select
                           description="Platforms to compare; empty = the profile's (all; smoke trains what fits "
                                       "its minutes on this machine, leaving out "
                                       f"{_and(sorted(set(platforms.default_names()) - set(platforms.smoke_names())))})."),
        "worker_counts": _field("worker_counts", "Worker counts", "Training matrix",
                                items={"type": "integer", "minimum": 1, "maximum": MAX_WORKERS},
                                description=f"World sizes to run as a JSON list, e.g. [1, 2] (each 1..{MAX_WORKERS}); "
                                            "empty = the profile's."),
        "repeats": _field("repeats", "Repeats", "Training matrix", "Runs of every cell (for medians)."),
        "strategies": _field("strategies", "Training strategies", "Training matrix", uniqueItems=True,
                             description_md="Strategies to compare, each a cell of its own (every backend x "
                                            "strategy x worker count): `default`, `fp16`, `bf16` (GPU only), "
                                            "`powersgd-r<rank>`, `localsgd-<steps>` (local SGD, parameters averaged "
                                            "every N steps), `fsdp`, `pipeline-<microbatches>` (the model's layers "
                                            "split over the workers), `weighted_sampler`, `weighted_loss`; combine "
                                            "with `+` (`fsdp+weighted_loss`). Comm strategies have no 1-worker cell; "
                                            f"a strategy a backend cannot run ({_strategy_notes()}) is refused before "
                                            "any work. Empty = `default` only."),
        "networks": _field("networks", "Networks", "Training matrix", uniqueItems=True,
                           examples=["unshaped", "10gbit", "1gbit", "100mbit"],
                           description="Links between the emulated hosts (cluster profile), each a cell of its "
                                       "own: unshaped, 10gbit, 1gbit, 100mbit or <n>mbit; empty = the profile's."),
        "class_ratio": _field("class_ratio", "Class ratio", "Data",
                              "Imbalanced train sample on purpose: every other class gets this fraction of "
                              "label 0's rows (test stays balanced); empty = stratified as the source."),
        "epochs": _field("epochs", "Epochs", "Training", "Training epochs per cell."),
        "batch_size": _field("batch_size", "Batch size", "Training", "Per worker, or global (batch policy)."),
        "learning_rate": _field("learning_rate", "Learning rate", "Training",
                                "AdamW peak learning rate at 1 worker."),
        "batch_policy": _field("batch_policy", "Batch policy", "Training",
                               "per_worker: batch size per worker (the global batch grows); "
                               "global: the batch size is split over the workers."),
        "lr_scaling": _field("lr_scaling", "Learning-rate scaling", "Training",
                             "How the learning rate follows the global batch."),
        "target_accuracy": _field("target_accuracy", "Target accuracy", "Training",
                                  "Held-out accuracy that defines time-to-accuracy."),
        "seed": _field("seed", "Seed", "Training", "Sampling, initialisation and shuffling."),
        "train_samples": _field("train_samples", "Train reviews", "Data",
                                "Stratified sample of the train split."),
        "test_samples": _field("test_samples", "Test reviews", "Data",
                               "Stratified sample of the test split."),
        "max_seq_len": _field("max_seq_len", "Max sequence length", "Data", "Tokens per review."),
        "overrides": {"default": None, "type": ["object", "null"], "title": "Other config fields",
                      "section": "Advanced",
                      "description_md": "JSON object of any other config field, by dotted path or flat name, "
                                        'e.g. `{"training.warmup_ratio": 0.2}`; unknown keys are refused, and so '
                                        "are deployment fields (data, model and output locations, masters, "
                                        "tracking URI): those come from the workers' environment."},
    }


def overrides_from_params(params: dict, environ: dict | None = None) -> dict:
    """Trigger params -> config overrides: site defaults from env, then the non-empty params.
    Deployment fields come from the environment only (deployment_keys); profiles
    (``overrides.profile`` too) from PROFILES."""
    from pipelines.config.loading import check_profiles  # ConfigError: the field and the names

    check_profiles(params.get("profile"), params.get("overrides"))
    given = {k: v for k, v in params.items() if k not in NOT_CONFIG}
    refused = deployment_keys({**given, **(params.get("overrides") or {})})
    if refused:
        raise ValueError(f"{', '.join(refused)}: set by the deployment (BENCHMARK_* / MLFLOW_TRACKING_URI "
                         "environment of the Airflow workers), not by a trigger")
    fields = list(param_specs())
    if unknown := sorted(set(params) - set(fields)):  # a conf key no form field has: never ignored
        raise ValueError(f"{', '.join(unknown)}: not a trigger field ({', '.join(fields)}); put other config "
                         'fields in "overrides"')
    overrides = site_defaults(os.environ if environ is None else environ)
    overrides.update({k: params[k] for k in fields
                      if k not in NOT_CONFIG and params.get(k) not in (None, "", [])})
    # a null in "overrides" was typed on purpose: it sets the field to None (load_config refuses it,
    # naming the field, where None is not allowed); an empty form field above means "the profile's"
    overrides.update({k: SET_NULL if v is None else v for k, v in (params.get("overrides") or {}).items()})
    return overrides


def config_from_params(params: dict, environ: dict | None = None) -> BenchmarkConfig:
    """Trigger params -> the run's config (profile, site defaults, params, ``overrides``)."""
    return load_config(params["profile"], overrides_from_params(params, environ))


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


def start_run(params: dict, dag_id: str, run_id: str, environ: dict | None = None) -> str:
    """The prepare_run task: resolve the config (profile + params), refuse worker counts the train
    tasks cannot run (Airflow's pool) before any work, then the CLI's start of a run (config,
    preflight, run folder) and the run's link back to its DAG run. Returns the run folder."""
    from pipelines.run import stages
    from pipelines.web.trends import record_dag_run

    environ = os.environ if environ is None else environ
    overrides = overrides_from_params(params, environ)
    slots = environ.get(SLOTS_ENV)
    plan_by_workers(load_config(params["profile"], overrides).cells(), int(slots) if slots else None)
    run_dir = stages.prepare_run(params["profile"], overrides, run_id=run_id)
    record_dag_run(run_dir, dag_id, run_id)  # the page links back to this run
    log.info("run folder: %s", run_dir)
    return run_dir


def cells_with(run_dir: str, workers: int) -> list[dict]:
    """The run's cells with ``workers`` workers: the kwargs of the train.w<workers> instances."""
    from pathlib import Path

    from pipelines.config import read_config
    from pipelines.runfolder.paths import RunPaths

    cells = plan_by_workers(read_config(RunPaths(Path(run_dir)).config).cells(), None)[f"w{workers}"]
    log.info("cells with %d worker(s): %s", workers, cells or "none (the train task is skipped)")
    return cells


def benchmark_alert(ti, exception=None):
    """Jinja macro of the alert mails: subject/text/html of this run's alert (pipelines.tracking.alerts)."""
    from pipelines.tracking.alerts import build_alert

    run_dir = ti.xcom_pull(task_ids="prepare_run")
    return build_alert(run_dir, dag_run_id=ti.run_id, task_id=ti.task_id, exception=exception)
