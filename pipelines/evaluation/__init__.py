"""Evaluation: the run-level summary of every training cell.

``evaluate_run(config, paths)`` (the ``evaluate`` stage) reads every configured
``cells/<backend>[-<strategy>][-<network>]-w<N>-r<repeat>/result.json`` and writes ``report/summary.json``
(``pipelines.runfolder.summary.RunSummary``):

- per cell: time-to-target-accuracy (MLPerf style: first epoch whose validation accuracy
  >= ``config.tracking.target_accuracy``, and the training-phase time up to it: evaluation and
  checkpoints excluded; None if never reached); its attempts, lost work and recovery time;
- per (backend, strategy, network, workers): median/min/max over repeats (repeat r trains with seed + r) of total
  and training time, samples/s, test accuracy/macro-F1, with a 95 % bootstrap interval of the
  median (and n) for total time and accuracy; recovery cost of resumed repeats; scaling efficiency t(1)/(N*t(N)) on training time (fixed
  global work; None without a 1-worker cell); overhead vs the reference platform (``platforms.reference()``)
  at the same worker count ((t - t_ref)/t_ref on total and training time), both within one network; the communication
  phase, the median epoch time and the bytes per step (handed to collectives; on the hosts' links);
  worker-hours and estimated cost (kept in the summary, not in the report); what the cells' processes
  used (``CellResult.resources``: peak memory of the ranks, the platform and the whole cell) and their
  cost from the price sheet (``resource_cost``); what each cell paid once and per epoch, and the
  total that makes for ``config.tracking.projected_job`` (``pipelines.evaluation.projection``);
- the failed cells and why (a missing result.json counts as failed "no result").

It never raises for failed cells: the report must come out for partial runs. Per-prediction
metrics live in ``pipelines.training.metrics`` (computed by the workers).
    python -c "from pipelines.run.stages import evaluate; print(evaluate('runs/<run>'))"
"""

from __future__ import annotations

import itertools
import json
import logging
import statistics

from pipelines import platforms
from pipelines.config import BenchmarkConfig
from pipelines import whatif
from pipelines.evaluation import projection
from pipelines.measure import footprint
from pipelines.evaluation.hardware import hardware
from pipelines.runfolder.paths import DEFAULT_NETWORK, DEFAULT_STRATEGY, RunPaths, cell_name
from pipelines.runfolder.results import CellResult
from pipelines.runfolder.summary import (Aggregate, CellRow, FailedCell, Interval, PriceSheet, RunSummary, Stats,
                                        read_service_starts)
from pipelines.training import phases

log = logging.getLogger(__name__)

NO_RESULT = "no result: cells/{cell}/result.json is missing (the training task never finished)"


CellKey = tuple[str, str, str, int, int]  # (backend, strategy, network, workers, repeat)


def read_cells(config: BenchmarkConfig, paths: RunPaths) -> dict[CellKey, CellResult | str]:
    """Every configured (backend, strategy, network, workers, repeat) -> its CellResult, or why
    there is none."""
    out: dict[CellKey, CellResult | str] = {}
    for key in config.cells():
        backend, strategy, network, workers, repeat = key
        cell = paths.cell(backend, workers, repeat, strategy, network)
        if not cell.result.exists():
            out[key] = NO_RESULT.format(cell=cell.name)
            continue
        try:
            out[key] = CellResult.read(cell.result)
        except (ValueError, OSError) as err:  # half-written or hand-edited file
            out[key] = f"unreadable result {cell.result}: {err}"
    return out


def time_to_target(result: CellResult, target: float) -> tuple[int | None, float | None]:
    """MLPerf style: the first epoch whose validation accuracy reaches ``target`` and the
    training-phase time up to its end (no evaluation, no checkpoints); (None, None) if none."""
    spent = 0.0
    for epoch in sorted(result.epochs, key=lambda e: e.epoch):
        spent += epoch.train_seconds
        if epoch.eval_accuracy >= target:
            return epoch.epoch, spent
    return None, None


def bootstrap_interval(values: list[float], confidence: float = 0.95, resamples: int = 2000) -> Interval:
    """Percentile bootstrap interval of the median (seeded: the same values give the same
    interval). One value gives a zero-width interval with n = 1."""
    import numpy as np

    if not values:
        return Interval()
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(0)
    medians = np.median(data[rng.integers(0, len(data), size=(resamples, len(data)))], axis=1)
    tail = (1 - confidence) / 2 * 100
    return Interval(low=float(np.percentile(medians, tail)), high=float(np.percentile(medians, 100 - tail)),
                    n=len(data))


def _stats(values: list[float]) -> Stats:
    if not values:
        return Stats()
    return Stats(median=float(statistics.median(values)), min=float(min(values)), max=float(max(values)))


def aggregate_key(backend: str, strategy: str, workers: int, network: str = DEFAULT_NETWORK) -> str:
    """``<backend>-w2`` (default strategy on this host, as before strategies and networks existed),
    ``<backend>-powersgd-r2-w2``, ``<backend>-100mbit-w2`` or ``<backend>-powersgd-r2-100mbit-w2``: the
    cell name without its repeat."""
    middle = "" if strategy in (None, DEFAULT_STRATEGY) else f"-{strategy}"
    middle += "" if network in (None, DEFAULT_NETWORK) else f"-{network}"
    return f"{backend}{middle}-w{workers}"


def _median_epoch_seconds(result: CellResult) -> float | None:
    """The cell's typical epoch: median over its epochs of epoch_seconds (train + eval + checkpoint)."""
    return _stats([e.epoch_seconds for e in result.epochs]).median


def _median_lists(lists: list[list[float]]) -> list[float]:
    """Element-wise median of equally long lists (per-class recall over repeats)."""
    if not lists or len({len(x) for x in lists}) != 1:
        return []
    return [float(statistics.median(values)) for values in zip(*lists)]


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def resource_cost(result: CellResult, tracking) -> float | None:
    """The cell priced from the price sheet (``config.tracking``): provisioned CPUs x wall hours x
    price_per_cpu_hour + peak memory GB x wall hours x price_per_gb_hour + GPUs x wall hours x
    price_per_gpu_hour. Wall hours = total_seconds (all attempts) / 3600; provisioned CPUs = the cores
    the cell could use (``ResourceUsage.cpus``); peak memory = ``peak_rss_mb`` / 1024 (GB = GiB, as
    cloud price lists count it); GPUs = the ranks on a CUDA device. None where nothing was measured."""
    usage = result.resources
    if usage is None or usage.cpus is None:
        return None
    gpus = sum(1 for d in result.devices if d.startswith("cuda"))
    return result.total_seconds / 3600.0 * (usage.cpus * tracking.price_per_cpu_hour
                                            + usage.peak_rss_mb / 1024.0 * tracking.price_per_gb_hour
                                            + gpus * tracking.price_per_gpu_hour)


def _resource_fields(result: CellResult, tracking) -> dict:
    usage = result.resources
    if usage is None:
        return {}
    return {"cpu_seconds": usage.cpu_seconds, "cpu_utilisation": usage.cpu_utilisation,
            "peak_rss_mb": usage.peak_rss_mb, "ranks_peak_rss_mb": usage.ranks_peak_rss_mb,
            "platform_peak_rss_mb": usage.platform_peak_rss_mb,
            "cost": None if tracking is None else resource_cost(result, tracking)}


def _staleness(records: list[dict]) -> dict:
    """An async aggregate's staleness over its repeats (``Aggregate.staleness_*``); {}: not async."""
    if not records:
        return {}
    return {"staleness_mean": _stats([s["mean"] for s in records]).median,
            "staleness_max": max(s["max"] for s in records),
            "dropped_fraction": _stats([s["dropped"] / max(1, s["updates"] + s["dropped"]) for s in records]).median}


def cell_row(name: str, result: CellResult, target: float, network: str | None = None,
             tracking=None) -> CellRow:
    """The summary's row of one finished cell; ``network``: the configured one (else the result's);
    ``tracking``: the price sheet (``config.tracking``) its cost is priced from."""
    tta_epoch, tta_seconds = time_to_target(result, target)
    return CellRow(
        cell=name, backend=result.backend, strategy=result.strategy, workers=result.world_size,
        repeat=result.repeat, comm_bytes_per_step=result.comm_bytes_per_step, staleness=result.staleness,
        network=network or result.network, cluster=result.cluster,
        link_bytes_per_step=result.link_bytes_per_step, link_bytes_per_train_step=result.link_bytes_per_train_step,
        epoch_seconds=_median_epoch_seconds(result),
        communication_seconds=result.phases.get("communication") if result.phases else None,
        recall_per_class=[c.recall for c in result.test.per_class] if result.test else [],
        status=result.status, error=result.error, device=result.device, host=result.host,
        platform_mode=result.platform_mode, data_feed=result.data_feed, model_source=result.model_source, total_seconds=result.total_seconds,
        training_seconds=result.training_seconds, startup_seconds=result.startup_seconds,
        evaluation_seconds=result.evaluation_seconds, checkpoint_seconds=result.checkpoint_seconds,
        samples_per_second=result.samples_per_second, peak_memory_mb=result.peak_memory_mb,
        test_accuracy=result.test.accuracy if result.test else None,
        test_f1=result.test.f1 if result.test else None, epochs_run=len(result.epochs),
        time_to_target_epoch=tta_epoch, time_to_target_seconds=tta_seconds, seed=result.seed,
        attempts=len(result.attempts), resumed=len(result.attempts) > 1 or result.resumed_from_epoch > 0,
        lost_seconds=result.lost_seconds, recovery_seconds=result.recovery_seconds,
        window_start=result.timed_window.start if result.timed_window else None,
        window_end=result.timed_window.end if result.timed_window else None,
        phases=result.phases, **_resource_fields(result, tracking), **projection.row_fields(result),
    )


def _median_phases(rows: list[CellRow]) -> dict[str, float]:
    """Per phase, the median over the repeats (a phase missing in a repeat counts as 0 s)."""
    names = [p for p in (phases.PROVISION, *phases.PHASES, phases.RETRIES) if any(p in r.phases for r in rows)]
    return {p: _stats([r.phases.get(p, 0.0) for r in rows if r.phases]).median for p in names}


def _aggregate_one(config: BenchmarkConfig, backend: str, strategy: str, network: str, workers: int,
                   rows: list[CellRow]) -> Aggregate:
    """Statistics over the repeats of one (backend, strategy, network, workers) that finished."""
    mine = [r for r in rows if (r.backend, r.strategy, r.network, r.workers) == (backend, strategy, network, workers)]
    ok = [r for r in mine if r.status == "ok" and r.total_seconds is not None]

    def col(key: str) -> list[float]:
        return [getattr(r, key) for r in ok if getattr(r, key) is not None]

    tta = col("time_to_target_seconds")
    total = _stats(col("total_seconds"))
    resumed = [r for r in ok if r.resumed]
    worker_hours = None if total.median is None else workers * total.median / 3600.0
    return Aggregate(
        key=aggregate_key(backend, strategy, workers, network), backend=backend, strategy=strategy,
        network=network, cluster="/".join(sorted({r.cluster for r in ok})) or None,
        workers=workers, comm_bytes_per_step=_stats(col("comm_bytes_per_step")).median,
        link_bytes_per_step=_stats(col("link_bytes_per_step")).median,
        link_bytes_per_train_step=_stats(col("link_bytes_per_train_step")).median,
        epoch_seconds=_stats(col("epoch_seconds")).median,
        communication_seconds=_stats(col("communication_seconds")).median,
        recall_per_class=_median_lists([r.recall_per_class for r in ok if r.recall_per_class]),
        **_staleness([r.staleness for r in ok if r.staleness and r.staleness.get("mean") is not None]),
        repeats=config.matrix.repeats, repeats_ok=len(ok), repeats_failed=len(mine) - len(ok),
        platform_mode="/".join(sorted({r.platform_mode for r in mine if r.platform_mode})) or None,
        data_feed="/".join(sorted({r.data_feed for r in mine if r.data_feed})) or None,
        total_seconds=total, training_seconds=_stats(col("training_seconds")),
        startup_seconds=_stats(col("startup_seconds")),
        samples_per_second=_stats(col("samples_per_second")),
        test_accuracy=_stats(col("test_accuracy")), test_f1=_stats(col("test_f1")),
        total_seconds_ci=bootstrap_interval(col("total_seconds")),
        test_accuracy_ci=bootstrap_interval(col("test_accuracy")),
        resumed_cells=len(resumed),
        recovery_seconds=_stats([r.recovery_seconds for r in resumed]).median,
        lost_seconds=_stats([r.lost_seconds for r in resumed]).median,
        peak_memory_mb_max=max(col("peak_memory_mb"), default=None),
        # median over the repeats that reached the target; how many did is stated beside
        time_to_target_seconds=_stats(tta).median, reached_target=len(tta),
        worker_hours=worker_hours,
        estimated_cost=None if worker_hours is None else worker_hours * config.tracking.price_per_worker_hour,
        cost=_stats(col("cost")).median, cpu_seconds=_stats(col("cpu_seconds")).median,
        peak_rss_mb_max=max(col("peak_rss_mb"), default=None),
        ranks_peak_rss_mb_max=max(col("ranks_peak_rss_mb"), default=None),
        platform_peak_rss_mb_max=max(col("platform_peak_rss_mb"), default=None),
        phases=_median_phases(ok), **projection.aggregate_fields(ok, config.tracking.projected_job),
    )


def _aggregate(config: BenchmarkConfig, rows: list[CellRow]) -> list[Aggregate]:
    """One row per (backend, strategy, network, workers) with cells, in the matrix's order."""
    planned = {(b, s, net, n) for b, s, net, n, _ in config.cells()}
    strategies = [s.name for s in config.matrix.strategies]
    aggregates = [
        _aggregate_one(config, *key, rows)
        for key in itertools.product(config.matrix.backends, strategies, config.networks(), config.matrix.worker_counts)
        if key in planned  # e.g. a comm strategy at 1 worker: not applicable, no cell
    ]
    return _derive(aggregates)


def _derive(aggregates: list[Aggregate]) -> list[Aggregate]:
    """Scaling efficiency t(1)/(N*t(N)) on training time (fixed global work), and overhead
    versus the reference platform at the same worker count: (t_backend - t_ref) / t_ref; both within one
    network (a 1-worker cell of an emulated cluster runs on one host, under the run's network name)."""
    by_key = {(a.backend, a.strategy, a.network, a.workers): a for a in aggregates}
    out = []
    for agg in aggregates:
        t_n = agg.training_seconds.median
        # a comm strategy has no 1-worker cell: on one worker it is the default strategy
        one = (by_key.get((agg.backend, agg.strategy, agg.network, 1))
               or by_key.get((agg.backend, DEFAULT_STRATEGY, agg.network, 1)))
        t_1 = one.training_seconds.median if one else None
        ref = by_key.get((platforms.reference(), agg.strategy, agg.network, agg.workers))
        overhead = {}
        for what in ("total", "training"):
            mine = getattr(agg, f"{what}_seconds").median
            base = getattr(ref, f"{what}_seconds").median if ref else None
            overhead[f"overhead_vs_reference_{what}"] = None if mine is None or not base else (mine - base) / base
        out.append(agg.model_copy(update={
            "speedup": _ratio(t_1, t_n),
            "scaling_efficiency": None if t_1 is None or not t_n else t_1 / (agg.workers * t_n),
            **overhead,
        }))
    return out


def _manifest(paths: RunPaths) -> dict | None:
    try:
        return json.loads(paths.manifest.read_text())
    except (OSError, ValueError):
        return None


def _price_sheet(tracking) -> PriceSheet:
    return PriceSheet(per_cpu_hour=tracking.price_per_cpu_hour, per_gb_hour=tracking.price_per_gb_hour,
                      per_gpu_hour=tracking.price_per_gpu_hour, source=tracking.price_source,
                      per_worker_hour=tracking.price_per_worker_hour)


def evaluate_run(config: BenchmarkConfig, paths: RunPaths) -> RunSummary:
    """Read all cells, compute time-to-target and aggregates; write report/summary.json.

    Missing or unreadable result files count as failed cells (with the reason), so the
    report still comes out when some training tasks died.
    """
    cells = read_cells(config, paths)
    rows, failed = [], []
    for (backend, strategy, network, workers, repeat), result in cells.items():
        name = cell_name(backend, workers, repeat, strategy, network)
        if isinstance(result, str):
            rows.append(CellRow(cell=name, backend=backend, strategy=strategy, network=network, workers=workers,
                                repeat=repeat, status="failed", error=result))
            failed.append(FailedCell(cell=name, error=result))
            continue
        rows.append(cell_row(name, result, config.tracking.target_accuracy, network, config.tracking))
        if result.status != "ok":
            failed.append(FailedCell(cell=name, error=result.error or "failed (no error recorded)"))
    ok_results = [r for r in cells.values() if isinstance(r, CellResult) and r.status == "ok"]
    finished = {cell_name(b, w, r, s, net): res for (b, s, net, w, r), res in cells.items() if isinstance(res, CellResult)}
    costs = [r.cost for r in rows if r.status == "ok"]
    summary = RunSummary(
        run=paths.root.name, profile=config.profile, fingerprint=config.fingerprint(),
        cluster=config.cluster.kind, networks=config.networks(),
        batch_policy=config.training.batch_policy, lr_scaling=config.training.lr_scaling,
        status="success" if not failed else "failed",
        target_accuracy=config.tracking.target_accuracy, price_per_worker_hour=config.tracking.price_per_worker_hour,
        dataset=_manifest(paths),
        model_sources=sorted({r.model_source for r in ok_results if r.model_source}),
        hardware=hardware(ok_results), job=projection.job_of(config.tracking.projected_job),
        cells=rows, aggregates=_aggregate(config, rows), failed=failed,
        estimated_cost_total=sum(r.world_size * r.total_seconds / 3600.0 * config.tracking.price_per_worker_hour
                                 for r in ok_results),
        price_sheet=_price_sheet(config.tracking),
        cost_total=sum(c for c in costs if c is not None) if any(c is not None for c in costs) else None,
        standing_clusters={name: [s["provision_seconds"] for s in starts]
                           for name, starts in read_service_starts(paths).items()},
        what_it_takes=footprint.what_it_takes(finished),
    )
    _fit_intervals(summary, whatif.write_model(paths, finished))
    summary.write(paths)
    log.info("summary: %d cells, %d failed -> %s", len(rows), len(failed), paths.summary)
    return summary


def _fit_intervals(summary: RunSummary, model) -> None:
    """Each aggregate's total and projection get a 95 % interval from the what-if model (fitted on the
    run's cells, repeats included): its relative interval for the same cells (and the job), applied
    to the measured median (and the projected total)."""
    if model is None:
        return

    def scaled(value: float, job=None) -> tuple[float, float] | None:
        pred = whatif.own_cluster(model, str(a.backend), a.strategy, a.workers, a.network, job)
        return None if pred is None or pred.total <= 0 else (value * pred.low / pred.total,
                                                             value * pred.high / pred.total)

    for a in summary.aggregates:
        if a.total_seconds.median is not None and (bounds := scaled(a.total_seconds.median)):
            a.total_seconds_fit = Interval(low=bounds[0], high=bounds[1], n=a.repeats_ok)
        if a.projection is not None and (bounds := scaled(a.projection.total_seconds, summary.job)):
            a.projection.low_seconds, a.projection.high_seconds = bounds


def summary_metrics(summary: RunSummary) -> dict[str, float]:
    """Flat parent-run metrics from the summary: ``<backend>-w<N>/<name>``.

    The overhead is logged as ``overhead_vs_reference_total`` only: parent runs logged before the
    reference was a registry entry carry the older name, and nothing reads it back (the regression
    check compares total time and accuracy), so the two names are not both written."""
    out: dict[str, float] = {}
    for agg in summary.aggregates:
        values = {
            "total_seconds_median": agg.total_seconds.median,
            "training_seconds_median": agg.training_seconds.median,
            "samples_per_second_median": agg.samples_per_second.median,
            "test_accuracy_median": agg.test_accuracy.median,
            "test_f1_median": agg.test_f1.median,
            "time_to_target_seconds": agg.time_to_target_seconds,
            "scaling_efficiency": agg.scaling_efficiency,
            "overhead_vs_reference_total": agg.overhead_vs_reference_total,
            "estimated_cost": agg.estimated_cost,
            "cost": agg.cost,
            "cpu_seconds_median": agg.cpu_seconds,
            "peak_rss_mb_max": agg.peak_rss_mb_max,
            "epoch_seconds_median": agg.epoch_seconds,
            "link_bytes_per_step_median": agg.link_bytes_per_step,
            "link_bytes_per_train_step_median": agg.link_bytes_per_train_step,
            "fixed_seconds_median": agg.fixed_seconds,
            "steady_epoch_seconds_median": agg.steady_epoch_seconds,
            "projected_total_seconds": agg.projection.total_seconds if agg.projection else None,
        }
        values.update({f"phase_{p}_seconds_median": v for p, v in agg.phases.items()})
        out.update({f"{agg.key}/{k}": float(v) for k, v in values.items() if v is not None})
    out["cells_failed"] = float(len(summary.failed))
    out["estimated_cost_total"] = float(summary.estimated_cost_total)
    if summary.cost_total is not None:
        out["cost_total"] = float(summary.cost_total)
    return out
