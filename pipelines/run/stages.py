"""The benchmark's steps as plain functions of a run folder (Kedro-style nodes).

The Airflow DAG runs one task per function and passes only the run folder (a path) between
them; ``python -m pipelines run`` calls the same functions in order: ``prepare_run`` (config +
preflight + run folder), the run's clusters (``start_services``/``start_cluster``, the DAG's
setup tasks; ``run_clusters`` for the CLI), the data steps in ``pipelines.run.runner.DATA_STEPS``
order, ``train_cell`` for every planned cell (one retry policy), the clusters' stop functions (the
DAG's teardown tasks), then ``pipelines.run.runner.FINISH_STEPS``. Every step reads the
resolved config from ``<run_dir>/config.json``, so any step can be retried on its own.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines import platforms
from pipelines.cluster.lifecycle import ClusterGone
from pipelines.measure import signals
from pipelines.config import BenchmarkConfig, load_config, read_config, save_config
from pipelines.runfolder.paths import DEFAULT_STRATEGY, CellPaths, RunPaths, cell_name, safe_run_id

log = logging.getLogger(__name__)
RETRY_DELAY_S = 2.0  # between a failed try of a cell and its retry


def _load(run_dir: str | Path, tracking_uri: str | None = None) -> tuple[BenchmarkConfig, RunPaths]:
    """Config of the run folder; ``tracking_uri`` re-points MLflow (e.g. after losing a server)."""
    paths = RunPaths(Path(run_dir))
    config = read_config(paths.config)
    if tracking_uri:
        config = config.model_copy(update={"tracking.mlflow_tracking_uri": tracking_uri})
    return config, paths


def prepare_run(profile: str, overrides: dict[str, Any] | None, run_id: str,
                cells: list[tuple[str, str, int]] | None = None) -> str:
    """Resolve the config, check it (``pipelines.run.preflight``: only ``cells``, (backend, strategy,
    workers), when given; else every cell of the run) and create ``<output_root>/<run_id>/config.json``.
    Returns run_dir. The CLI and the DAG both start a run with this.

    Idempotent for the same inputs (a retried task writes the same file).
    """
    from pipelines.run import preflight

    config = load_config(profile, overrides)
    preflight.check(config, cells)  # seconds, before any data work
    root = Path(config.tracking.output_root).resolve()
    paths = RunPaths(root / safe_run_id(run_id))
    if paths.root.resolve().parent != root:  # safe_run_id never allows it; keep it that way
        raise ValueError(f"run id {run_id!r} would leave the output root {root}")
    if paths.config.exists():  # a retried task: same config, and its time of birth is kept
        if read_config(paths.config) != config:
            raise FileExistsError(f"{paths.root} already holds a run with a different config")
    else:
        save_config(config, paths.config)
    log.info("run folder %s, config:\n%s", paths.root, config.to_json())
    return str(paths.root)


def check_run(run_dir: str, cells: list[tuple[str, str, int]] | None = None) -> None:
    """The preflight of an existing run folder (a resumed run)."""
    from pipelines.run import preflight

    preflight.check(_load(run_dir)[0], cells)


def ingest(run_dir: str) -> dict:
    from pipelines.data.ingest import ingest as _ingest

    return _ingest(*_load(run_dir))


def validate_snapshot(run_dir: str) -> dict:
    from pipelines.data.validate import validate_snapshot as _validate

    return _validate(*_load(run_dir))


def preprocess(run_dir: str) -> dict:
    from pipelines.data.preprocess import preprocess as _preprocess

    return _preprocess(*_load(run_dir))


def validate_tokens(run_dir: str) -> dict:
    from pipelines.data.validate import validate_tokens as _validate

    return _validate(*_load(run_dir))


# --- the run's clusters: the DAG's setup/teardown tasks call these, the CLI through run_clusters ---

def start_services(run_dir: str, tied_to_caller: bool = False) -> dict[str, str | None]:
    """Start the services the run needs before its data stage (``pipelines.run.services``: e.g. an
    engine's embedded cluster the data stage uses too; idempotent); name -> address. ``tied_to_caller``: they end with this process
    (the CLI); else they outlive it until stopped."""
    from pipelines.run import services

    config, paths = _load(run_dir)
    return services.start(config, paths, tied_to_caller=tied_to_caller)


def stop_services(run_dir: str) -> list[int]:
    """Stop the run's services, if any are running; the pids stopped."""
    from pipelines.run import services

    return services.stop(RunPaths(Path(run_dir)))


def start_cluster(run_dir: str, tied_to_caller: bool = False) -> dict | None:
    """cluster.kind=emulated: start the run's hosts (``pipelines.cluster.lifecycle``; idempotent);
    their state, else None (local and ssh runs have nothing to start)."""
    from pipelines.cluster import lifecycle

    config, paths = _load(run_dir)
    return lifecycle.start(paths, config, tied_to_caller=tied_to_caller)


def stop_cluster(run_dir: str) -> list[str]:
    """Stop the run's emulated hosts, if any; what a dead keeper left and was swept."""
    from pipelines.cluster import lifecycle

    return lifecycle.stop(RunPaths(Path(run_dir)))


_CLI_OWNS_SERVICES = False  # inside run_clusters: the CLI owns the run's services (they die with it)


@contextlib.contextmanager
def run_clusters(run_dir: str, data_stage: bool = True) -> Iterator[None]:
    """The CLI's services and clusters for the block: started with the DAG's setup functions (tied
    to this process: a SIGKILLed CLI leaves nothing behind) and stopped with its teardown
    functions, whatever happened, SIGTERM included: the services a cell started on demand (a
    platform's standing cluster) too. ``data_stage=False`` (the token shards are there): the
    services the data stage would use are not started up front; a standing cell's come up on
    demand (``services.before_cell``), so a cell that uses none waits for none."""
    from pipelines.measure.signals import raise_on_sigterm

    global _CLI_OWNS_SERVICES
    stops = []
    with raise_on_sigterm():  # a SIGTERM'd run still stops its clusters
        try:
            _CLI_OWNS_SERVICES = True  # what a cell starts on demand ends with the CLI too
            stops.append(stop_services)
            if data_stage:
                start_services(run_dir, tied_to_caller=True)
            stops.append(stop_cluster)
            start_cluster(run_dir, tied_to_caller=True)
            yield
        finally:
            _CLI_OWNS_SERVICES = False
            for stop in reversed(stops):
                stop(run_dir)


def planned_cells(run_dir: str) -> list[tuple[str, str, str, int, int]]:
    """Every (backend, strategy, network, workers, repeat) of the run ."""
    config, _ = _load(run_dir)
    return config.cells()


def completed_result(cell: CellPaths):
    """The cell's result if it finished (status ok, last attempt ok), else None."""
    from pipelines.runfolder.results import CellResult

    if not cell.result.exists():
        return None
    try:
        result = CellResult.read(cell.result)
    except ValueError:
        return None
    done = result.status == "ok" and (not result.attempts or result.attempts[-1].outcome == "ok")
    return result if done else None


def train_cell(run_dir: str, backend: str, workers: int, repeat: int = 0,
               node_rank: int | None = None, force: bool = False, strategy: str = DEFAULT_STRATEGY,
               network: str | None = None) -> dict:
    """Train one (backend, strategy, network, workers, repeat) cell; writes cells/<cell>/result.json.

    ``strategy``: the name of one of the run's ``strategies`` (``"default"``, ``"powersgd-r2"``);
    ``network``: one of the run's networks (None = its first): on a cluster the cell's ranks run on
    its hosts (``pipelines.cluster.lifecycle``) with the links shaped to it.
    A failed cell is trained again up to ``matrix.cell_retries`` times, each retry resuming from
    its last checkpoint: the one retry policy of the CLI and the DAG. A signal (SIGTERM, Ctrl-C)
    is never retried.

    A cell that already finished is skipped (its result stands); ``force`` deletes the cell
    folder and trains it from scratch. An unfinished cell resumes from its last checkpoint
    (``run --run-dir``). ``node_rank``: this machine's rank for a platform started on every node
    (its ``node_rank_setting``, e.g. a torchrun on several nodes); every node runs
    the same cell.
    """
    config, paths = _load(run_dir)
    config.strategy(strategy)  # a name the run does not have is refused before anything happens
    network = network or config.networks()[0]
    if network not in config.networks():
        raise ValueError(f"network {network!r} is not one of this run's networks ({', '.join(config.networks())})")
    cell = paths.cell(backend, workers, repeat, strategy, network)
    if force:
        shutil.rmtree(cell.root, ignore_errors=True)
    elif (done := completed_result(cell)) is not None:
        log.info("%s already finished (%s): skipped; --force trains it again", cell.name, cell.result)
        return {"cell": cell.name, "status": done.status, "total_seconds": done.total_seconds, "skipped": True}
    if node_rank is not None:
        setting = platforms.get(backend).node_rank_setting
        if setting is None:
            raise ValueError(f"--node-rank: {backend} is not started on every node (no node rank setting)")
        config = config.model_copy(update={setting: node_rank})
    retries = config.matrix.cell_retries
    for tries in range(retries + 1):
        try:
            result = _train_once(config, paths, backend, workers, repeat, strategy, network)
            break
        except Exception as err:  # CellTerminated (a signal) is a BaseException: never retried
            terminated = signals.cause_of(err)
            if terminated is not None:  # a signal a library turned into its own error (py4j): not retried
                raise signals.CellTerminated(terminated.signum, f"behind {type(err).__name__}: {err}") from err
            if tries == retries or isinstance(err, ClusterGone):  # no host to retry on
                raise
            log.warning("cell %s failed (%s); retry %d of %d resumes from its last checkpoint",
                        cell.name, err, tries + 1, retries)
            time.sleep(RETRY_DELAY_S)
    return {"cell": cell.name, "status": result.status, "total_seconds": result.total_seconds,
            "skipped": False, "tries": tries + 1}


def _node_rank(config: BenchmarkConfig, backend: str) -> int:
    """This machine's node rank for a platform started on every node (0: not such a platform)."""
    setting = platforms.get(backend).node_rank_setting
    if setting is None:
        return 0
    section, platform, field = setting.split(".")  # engines.<platform>.<field>
    return getattr(config.engine(platform), field)


def _train_once(config: BenchmarkConfig, paths: RunPaths, backend: str, workers: int, repeat: int,
                strategy: str, network: str):
    from pipelines.run.cells import run_cell
    from pipelines.cluster.lifecycle import hosts_for_cell
    from pipelines.measure.signals import terminate_tree_on_signal
    from pipelines.tracking.runs import cell_tracking

    from pipelines.run import services

    hosts = hosts_for_cell(paths, config, workers, network)
    where = {"hosts": hosts, "network": network, "cluster": config.cluster.kind,
             "before_window": lambda: services.before_cell(config, paths, backend, tied_to_caller=_CLI_OWNS_SERVICES)}
    with terminate_tree_on_signal():  # SIGTERM/SIGINT: no orphan keeps training, the cell fails
        if _node_rank(config, backend) > 0:  # node 0 tracks the cell; other nodes only lend processes
            return run_cell(config, paths, backend, workers, repeat, strategy, **where)
        with cell_tracking(config, paths, backend, workers, repeat, strategy, network):
            return run_cell(config, paths, backend, workers, repeat, strategy, **where)


def train_cells(run_dir: str, force: bool = False) -> list[str]:
    """Every planned cell of the run in order, each with ``train_cell``'s retries; a cell that
    still fails is recorded (result.json) and the others go on. Returns the failed cells' names."""
    failed, gone, untried = [], None, []
    for backend, strategy, network, workers, repeat in planned_cells(run_dir):
        name = cell_name(backend, workers, repeat, strategy, network)
        if gone is not None:  # the cluster went: the others fail at once, with its cause
            untried.append(name)
            continue
        try:
            train_cell(run_dir, backend, workers, repeat, force=force, strategy=strategy, network=network)
        except Exception as err:
            log.error("cell %s failed: %s", name, err)
            failed.append(name)
            gone = err if isinstance(err, ClusterGone) else None
    if untried:
        log.error("the run's cluster is gone (%s): %d cell(s) not tried: %s", gone, len(untried), ", ".join(untried))
    return failed + untried


def evaluate(run_dir: str) -> dict:
    """Read every cell's result.json: time-to-accuracy, aggregates -> report/summary.json.

    Failed cells are part of the summary; a run where no cell wrote any result is an error
    (the data stage or every cell died before training: there is nothing to report).
    """
    from pipelines.evaluation import evaluate_run

    config, paths = _load(run_dir)
    if not paths.cell_results():
        raise RuntimeError(f"no training cell wrote a result under {paths.cells}: the data stage or "
                           "every cell failed before writing one; see the training logs")
    summary = evaluate_run(config, paths)
    return {"summary": str(paths.summary), "status": summary.status, "cells": len(summary.cells),
            "failed": [f.cell for f in summary.failed]}


def report(run_dir: str) -> dict:
    """Comparison table and plots -> report/report.{html,md}, *.png."""
    from pipelines.report import build_report

    return build_report(*_load(run_dir))


def track(run_dir: str, tracking_uri: str | None = None) -> dict:
    """Log the run folder to MLflow (parent + nested runs). Idempotent; files stay the truth."""
    from pipelines.tracking.runs import log_benchmark

    return log_benchmark(*_load(run_dir, tracking_uri))


def check_regression(run_dir: str, tracking_uri: str | None = None) -> dict:
    """Compare with the baseline run in MLflow; raise on a regression or on failed cells."""
    from pipelines.tracking.regression import check_regression as _check

    return _check(*_load(run_dir, tracking_uri))
