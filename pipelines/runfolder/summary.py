"""The run summary ``report/summary.json``: typed, written by evaluation, read by everything after.

``RunSummary`` is what the report, MLflow tracking, the regression check and the Benchmarks page
read; ``read_summary`` fails with ``SummaryMissing`` (naming the command that writes it) rather
than silently re-running evaluation.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


from pipelines.runfolder.fileio import atomic_write_text
from pipelines.runfolder.paths import RunPaths

SUMMARY_VERSION = 2


class SummaryMissing(FileNotFoundError):
    """report/summary.json is not there: the evaluate step has not run for this folder."""


class Stats(BaseModel):
    median: float | None = None
    min: float | None = None
    max: float | None = None


class Interval(BaseModel):
    """95 % bootstrap interval of the median over repeats (``n`` = repeats it rests on)."""

    low: float | None = None
    high: float | None = None
    n: int = 0


class Job(BaseModel):
    """The job each platform's total is projected to (``config.tracking.projected_job``; the
    study's by default): training reviews per epoch, epochs, reviews of the final test."""

    train_samples: int = 25_000
    epochs: int = 20
    test_samples: int = 25_000


class Projection(BaseModel):
    """One aggregate's total projected to the summary's ``job`` (``pipelines.evaluation.projection``)."""

    total_seconds: float  # fixed + first-epoch warm-up + epochs x per-epoch + final test
    fixed_seconds: float  # provision + launch + teardown (+ retries), the job pays it once
    fixed_share: float  # fixed / total
    # the job length, in reviews x epochs (and in epochs of this run's training set), from which the
    # fixed cost stays under 5 % of the total (final test not counted); None: it never does
    fixed_under_5pct_sample_epochs: float | None = None
    fixed_under_5pct_epochs: int | None = None
    # the 95 % interval of total_seconds, from the repeats and the what-if model's fit (pipelines.whatif:
    # its prediction of this cell's own cluster and the job, its relative interval); None: not fitted
    low_seconds: float | None = None
    high_seconds: float | None = None


class CellRow(BaseModel):
    """One cell (backend, strategy, network, workers, repeat); failed cells carry only the first
    fields + error."""

    cell: str
    backend: str  # the platform's name (a record: kept as written, registered or not)
    strategy: str = "default"  # pipelines.config.TrainingStrategy.name
    network: str = "local"  # CellResult.network: "local" (one host) or the hosts' link ("1gbit", ...)
    cluster: str = "local"  # CellResult.cluster: "local" | "emulated" | "ssh"
    workers: int
    repeat: int
    status: Literal["ok", "failed"]
    error: str | None = None
    device: str | None = None
    host: str | None = None
    platform_mode: str | None = None  # CellResult.platform_mode
    data_feed: str | None = None  # CellResult.data_feed: "files" / "dataframe"
    model_source: str | None = None
    total_seconds: float | None = None
    training_seconds: float | None = None
    startup_seconds: float | None = None
    evaluation_seconds: float | None = None
    checkpoint_seconds: float | None = None
    samples_per_second: float | None = None
    peak_memory_mb: float | None = None
    test_accuracy: float | None = None
    test_f1: float | None = None  # macro-F1
    epochs_run: int | None = None
    time_to_target_epoch: int | None = None
    time_to_target_seconds: float | None = None  # training-phase time to the target (validation)
    seed: int | None = None
    attempts: int = 0
    resumed: bool = False  # trained over more than one attempt
    lost_seconds: float = 0.0
    recovery_seconds: float = 0.0
    window_start: float | None = None  # the timed window (host lock held)
    window_end: float | None = None
    phases: dict[str, float] = Field(default_factory=dict)  # CellResult.phases
    comm_bytes_per_step: float | None = None  # CellResult.comm_bytes_per_step
    link_bytes_per_step: float | None = None  # CellResult.link_bytes_per_step (across hosts)
    staleness: dict | None = None  # CellResult.staleness (async: {updates, dropped, mean, max, ...})
    epoch_seconds: float | None = None  # median over the cell's epochs of epoch_seconds
    communication_seconds: float | None = None  # phases["communication"]
    recall_per_class: list[float] = Field(default_factory=list)  # test recall of label 0..K-1
    # what the cell's processes used (CellResult.resources; None: not measured) and its cost from the
    # price sheet (pipelines.evaluation.resource_cost)
    cpu_seconds: float | None = None
    cpu_utilisation: float | None = None
    peak_rss_mb: float | None = None
    ranks_peak_rss_mb: float | None = None
    platform_peak_rss_mb: float | None = None
    cost: float | None = None
    # fixed versus per-epoch (pipelines.evaluation.projection.split): what the cell paid once, its first and
    # steady-state epoch (median of the epochs after the first; the one epoch of a 1-epoch cell), per
    # training review and epoch, and the rest (final test, model export); None: failed or no epoch
    fixed_seconds: float | None = None
    first_epoch_seconds: float | None = None
    steady_epoch_seconds: float | None = None
    per_sample_seconds: float | None = None
    final_seconds: float | None = None
    train_samples: int | None = None
    test_samples: int | None = None
    link_bytes_per_train_step: float | None = None  # CellResult.link_bytes_per_train_step


class Aggregate(BaseModel):
    """Statistics over the repeats of one (backend, strategy, network, workers)."""

    # "<backend>[-<strategy>][-<network>]-w<N>": strategy only if not default, network only if not local
    key: str
    backend: str  # the platform's name (a record: kept as written, registered or not)
    strategy: str = "default"
    network: str = "local"
    cluster: str | None = None  # the cells' cluster kind (joined with "/" if they differ)
    workers: int
    comm_bytes_per_step: float | None = None  # median over the repeats
    link_bytes_per_step: float | None = None  # median over the repeats (all hosts' tx / steps)
    # async: median over the repeats of the pushes' mean staleness and of the share of pushes dropped;
    # the largest staleness of any push of any repeat
    staleness_mean: float | None = None
    staleness_max: int | None = None
    dropped_fraction: float | None = None
    link_bytes_per_train_step: float | None = None  # median over the repeats (the training steps alone)
    epoch_seconds: float | None = None  # median over the repeats of the cells' median epoch time
    communication_seconds: float | None = None  # median over the repeats of the communication phase
    recall_per_class: list[float] = Field(default_factory=list)  # median test recall per label
    repeats: int
    repeats_ok: int
    repeats_failed: int
    platform_mode: str | None = None  # the cells' (joined with "/" if they differ)
    data_feed: str | None = None  # the cells' CellResult.data_feed (joined with "/" if they differ)
    total_seconds: Stats
    training_seconds: Stats
    startup_seconds: Stats
    samples_per_second: Stats
    test_accuracy: Stats
    test_f1: Stats
    total_seconds_ci: Interval = Field(default_factory=Interval)
    # 95 % interval of the median total from the what-if model's fit of the run's cells (pipelines.whatif:
    # its prediction of these cells, its relative interval): the verdict's noise where repeats give none
    total_seconds_fit: Interval = Field(default_factory=Interval)
    test_accuracy_ci: Interval = Field(default_factory=Interval)
    resumed_cells: int = 0
    recovery_seconds: float | None = None  # median over the resumed repeats
    lost_seconds: float | None = None
    peak_memory_mb_max: float | None = None  # rank 0's own peak (RSS, or CUDA memory allocated)
    time_to_target_seconds: float | None = None  # median over the repeats that reached it
    reached_target: int = 0
    worker_hours: float | None = None  # not in the report (the priced ``cost`` is)
    estimated_cost: float | None = None  # worker-hours x price_per_worker_hour; not in the report
    cost: float | None = None  # median over the repeats of the cells' cost (price sheet)
    cpu_seconds: float | None = None  # median over the repeats
    peak_rss_mb_max: float | None = None  # the largest over the repeats: the whole cell
    ranks_peak_rss_mb_max: float | None = None  # the ranks' (sum of their RSS at the peak sample)
    platform_peak_rss_mb_max: float | None = None  # every other process of the cell
    speedup: float | None = None  # t(1 worker) / t(N) on training time
    scaling_efficiency: float | None = None  # t(1) / (N * t(N))
    # (t - t_ref) / t_ref against the reference platform (``platforms.reference()``) at the same worker
    # count; summaries written before the reference was a registry entry call them overhead_vs_ddp_*
    overhead_vs_reference_total: float | None = Field(
        None, validation_alias=AliasChoices("overhead_vs_reference_total", "overhead_vs_ddp_total"))
    overhead_vs_reference_training: float | None = Field(
        None, validation_alias=AliasChoices("overhead_vs_reference_training", "overhead_vs_ddp_training"))
    phases: dict[str, float] = Field(default_factory=dict)  # per phase, median over the repeats
    # fixed versus per-epoch: medians over the repeats of the cells' (CellRow), and the total they
    # project for the summary's job
    fixed_seconds: float | None = None
    first_epoch_seconds: float | None = None
    steady_epoch_seconds: float | None = None
    per_sample_seconds: float | None = None
    final_seconds: float | None = None
    train_samples: int | None = None
    test_samples: int | None = None
    projection: Projection | None = None


class PriceSheet(BaseModel):
    """What a cell's cost is priced from (``config.tracking``): USD per vCPU-hour, per GB-hour of
    memory, per GPU-hour, per worker-hour (the older estimate), and where these prices come from."""

    per_cpu_hour: float = 0.0
    per_gb_hour: float = 0.0
    per_gpu_hour: float = 0.0
    per_worker_hour: float = 0.0
    source: str = ""


class FailedCell(BaseModel):
    cell: str
    error: str


class Hardware(BaseModel):
    hardware_class: str = "unknown"  # device kind and count, CPU model, hosts: runs compare within one
    devices: list[str] = Field(default_factory=list)
    hosts: list[str] = Field(default_factory=list)  # where the driver ran (CellResult.host)
    # the machines the cells' ranks ran on across hosts (emulated or SSH: placements, links); empty locally
    cluster_hosts: list[str] = Field(default_factory=list)
    cpu_count: int | None = None
    versions: dict[str, str] = Field(default_factory=dict)  # library -> versions over the cells


class PlatformNeeds(BaseModel):
    """What it takes to run one platform (``pipelines.measure.footprint`` says how each is measured)."""

    model_config = ConfigDict(extra="forbid")

    platform: str
    label: str
    lifetime: str | None = None  # its cluster's: standing, per_job, or None (none of its own)
    install_mb: float  # what its Python distributions add beyond torch and transformers
    install_distributions: int
    install_largest: str = ""  # the three largest, with their MB
    programs: str = ""  # programs beside Python: MB of their installation (a JDK)
    measured_cell: str | None = None  # the cell its processes and ports come from (most workers)
    processes_per_cell: str | None = None  # kind count, ...: started in the cell's window
    processes_per_run: str | None = None  # kind count, ...: alive before the cell (a standing cluster)
    ports_per_cell: int | None = None  # TCP ports its started processes listened on
    ports_per_cell_beyond_loopback: int | None = None
    ports_per_run: int | None = None  # ... its standing processes
    ports_per_run_beyond_loopback: int | None = None
    cluster_config: str = ""  # settings and files a user sets to run it across machines
    package_lines: int = 0  # code lines of its package here
    features: str = ""  # orchestration features a test here shows (Platform.features)


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = SUMMARY_VERSION
    run: str
    profile: str
    fingerprint: str = ""  # BenchmarkConfig.fingerprint(): runs compare only within one
    cluster: str = "local"  # BenchmarkConfig.cluster.kind: where the cells ran
    networks: list[str] = Field(default_factory=lambda: ["local"])  # BenchmarkConfig.networks()
    batch_policy: str = "per_worker"
    lr_scaling: str = "none"
    status: Literal["success", "failed"]
    target_accuracy: float
    price_per_worker_hour: float
    price_sheet: PriceSheet = Field(default_factory=PriceSheet)
    dataset: dict[str, Any] | None = None  # the snapshot manifest
    model_sources: list[str] = Field(default_factory=list)
    hardware: Hardware = Field(default_factory=Hardware)
    cells: list[CellRow] = Field(default_factory=list)
    aggregates: list[Aggregate] = Field(default_factory=list)
    failed: list[FailedCell] = Field(default_factory=list)
    estimated_cost_total: float = 0.0  # worker-hours x price_per_worker_hour; not in the report
    job: Job = Field(default_factory=Job)  # what the aggregates' ``projection`` projects to
    cost_total: float | None = None  # sum of the cells' cost (price sheet); None: no cell measured
    # the run's standing clusters (pipelines.run.services): name -> the provision seconds of each
    # start, outside every cell (a standing cell's phases hold none of it)
    standing_clusters: dict[str, list[float]] = Field(default_factory=dict)
    what_it_takes: list[PlatformNeeds] = Field(default_factory=list)  # per platform (pipelines.measure.footprint)

    def write(self, paths: RunPaths) -> None:
        atomic_write_text(paths.summary, self.model_dump_json(indent=2))


def read_summary(paths: RunPaths) -> RunSummary:
    """The run's summary; SummaryMissing if evaluation has not written it."""
    if not paths.summary.exists():
        raise SummaryMissing(f"{paths.summary} missing: evaluate the run first "
                             f"(python -m pipelines report {paths.root})")
    return RunSummary.model_validate_json(paths.summary.read_text())


def read_service_starts(paths: RunPaths) -> dict[str, list[dict]]:
    """``<run>/services.json`` (written by ``pipelines.run.services``): service name -> each start of it
    in this run, {started, provision_seconds}; {} before any."""
    try:
        return json.loads((paths.root / "services.json").read_text())
    except (OSError, ValueError):
        return {}
