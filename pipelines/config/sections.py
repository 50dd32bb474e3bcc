"""The sections of a benchmark config: data, training, matrix, engines, tracking.

What a cell trains is ``data`` + ``training`` (the fingerprint: runs compare only within one);
``matrix`` says which cells a run has and how they are retried; ``engines`` holds the settings of
each platform (declared by the platform: ``pipelines.platforms.Platform.settings``) and of each engine
the data stage runs on (declared by the engine: ``pipelines.engines``); ``tracking`` says where
results go and how they are judged. A field marked ``deployment(...)`` is set by
whoever deploys the benchmark (its BENCHMARK_* variable), never by a DAG trigger.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipelines.config.strategy import STRATEGY_EXAMPLES, STRATEGY_PATTERN, TrainingStrategy, parse_strategy
from pipelines.engines import ENGINE_SETTINGS
from pipelines.platforms.fields import deployment
from pipelines.platforms import PlatformName

DEFAULT_DATASET = "stanfordnlp/imdb"  # hub dataset id; a local folder works too
DEFAULT_MODEL = "prajjwal1/bert-tiny"  # hub model id; a local folder works too


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(Section):
    """Where the reviews come from, the data contract (GX) and the tokenization."""

    dataset_source: str = deployment(DEFAULT_DATASET, env="BENCHMARK_DATASET_SOURCE")  # hub id or folder
    train_samples: int | None = Field(None, ge=2)  # stratified sample size; None = all 25k
    test_samples: int | None = Field(None, ge=2)
    min_text_chars: int = Field(1, ge=1)  # GX bounds on raw review length
    max_text_chars: int = Field(20_000, ge=1)
    min_class_fraction: float = Field(0.4, gt=0, le=0.5)  # GX class-balance bound per label
    # imbalanced train sample on purpose: every class other than label 0 gets class_ratio times
    # label 0's rows (test stays stratified); the train balance bound follows the ratio
    class_ratio: float | None = Field(None, gt=0, le=1)
    # data contract (GX): what a usable benchmark data set is; relaxing it keeps a run out of baselines
    max_overlap_fraction: float = Field(0.01, ge=0, le=1)  # test rows whose text is also in train
    max_duplicate_fraction: float = Field(0.05, ge=0, le=1)  # repeated texts within one split
    # the two bounds above also hold on normalised text (NFKC, case, spacing, punctuation, markup
    # ignored); near-duplicates: MinHash of 3-word shingles, two reviews at this Jaccard similarity
    # or above count as one (pipelines.data.near_duplicates); None bounds = the exact ones above
    near_duplicate_threshold: float = Field(0.9, gt=0, le=1)
    max_near_duplicate_fraction: float | None = Field(None, ge=0, le=1)  # near-copies within one split
    max_near_overlap_fraction: float | None = Field(None, ge=0, le=1)  # test rows with a near-copy in train
    min_rows_per_class: int = Field(5, ge=1)  # in train and in test
    allow_small_data: bool = False  # fewer rows than requested / classes below the minimum pass
    validation_fraction: float = Field(0.1, gt=0, lt=0.5)  # of train, held out (stratified, seeded)
    max_seq_len: int = Field(128, ge=8, le=512)
    # which end of a longer review is cut: "right" (the library's default, the study's) or
    # "left" (keeps the review's conclusion: a random-init model learns sentiment from it sooner)
    truncation_side: Literal["right", "left"] = "right"
    tokenizer_source: str = deployment(DEFAULT_MODEL, env="BENCHMARK_TOKENIZER_SOURCE")


class TrainingConfig(Section):
    """What every cell trains: the model and its optimisation."""

    model_source: str = deployment(DEFAULT_MODEL, env="BENCHMARK_MODEL_SOURCE")  # no weights -> random init
    seed: int = 42  # sampling, model init, shuffling: same seed -> same run
    epochs: int = Field(2, ge=1, le=1000)
    batch_size: int = Field(32, ge=1, le=4096)  # per worker, or global: see batch_policy
    # per_worker: every worker takes batch_size (the global batch grows with the workers);
    # global: batch_size is split over the workers (same optimisation at every worker count)
    batch_policy: Literal["per_worker", "global"] = "per_worker"
    # the learning rate at 1 worker; scaled with global batch / batch_size (Goyal et al. 2017: linear)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    learning_rate: float = Field(1e-4, gt=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    threads_per_worker: int = Field(1, ge=1, le=64)  # torch intra-op threads per rank on CPU


def _default_platforms() -> list[str]:
    from pipelines import platforms

    return platforms.default_names()


class MatrixConfig(Section):
    """The run's cells: every backend x strategy x worker count x repeat, and their retries."""

    backends: list[PlatformName] = Field(default_factory=_default_platforms, min_length=1)
    # a cell's own config carries its one strategy; one a backend cannot run is refused up front
    strategies: list[TrainingStrategy] = Field(
        default_factory=lambda: [TrainingStrategy()], min_length=1,
        json_schema_extra={"items": {"type": "string", "pattern": STRATEGY_PATTERN},
                           "examples": STRATEGY_EXAMPLES})
    worker_counts: list[int] = Field(default_factory=lambda: [1, 2], min_length=1)
    repeats: int = Field(1, ge=1, le=100)  # repeat r trains with seed + r (init and data order)
    # a failed cell is trained again this many times, resuming from its last checkpoint: the
    # same policy for the CLI and the DAG (pipelines.run.stages.train_cell)
    cell_retries: int = Field(2, ge=0, le=10)
    # losing a host (pipelines.measure.faults): "host_loss" kills every process of a cell's last host in the
    # middle of epoch fault_epoch of its first attempt; the platform gets recovery_deadline_s to
    # recover by its own means (platform_retries: the platform's own retry setting, named by its
    # Platform record's ``retries_note``), then the project's retry may
    fault: Literal["none", "host_loss", "host_return", "slow_host", "slow_link"] = "none"
    fault_epoch: int = Field(1, ge=1)
    # which host is lost: "worker" (the last host: not the rendezvous / head / master) or
    # "coordinator" (hosts[0]: the driver and the store, head or master a platform keeps there: its
    # Platform record's ``coordinator_note``)
    fault_victim: Literal["worker", "coordinator"] = "worker"
    # host_return: the lost host's platform agent is started again this long after the loss
    # (as an operator's supervisor would: the agent, node or worker a platform runs on each host)
    return_after_s: float = Field(20.0, ge=0, le=3600)
    # stragglers (pipelines.measure.stragglers): slow_host cuts the last host's CPU quota to this
    # fraction of its share; slow_link cuts its link to this fraction of the cell's network
    slow_fraction: float = Field(0.25, gt=0, lt=1)
    recovery_deadline_s: float = Field(120.0, gt=0, le=3600)
    platform_retries: int = Field(0, ge=0, le=10)
    # the networks each cell runs on (emulated cluster): "unshaped", "10gbit", "1gbit", "100mbit",
    # "<n>mbit"; None = the cluster's own ("local" on one host, "1gbit" emulated, "ssh" real machines)
    networks: list[str] | None = Field(None, min_length=1, json_schema_extra={"examples": [["1gbit"], ["unshaped", "100mbit"]]})

    @field_validator("worker_counts")
    @classmethod
    def _positive_unique_workers(cls, v: list[int]) -> list[int]:
        if any(n < 1 for n in v):
            raise ValueError("every worker count must be >= 1")
        return sorted(set(v))

    @field_validator("networks")
    @classmethod
    def _known_networks(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else list(dict.fromkeys(check_network(n) for n in v))

    @field_validator("backends")
    @classmethod
    def _unique_backends(cls, v: list[PlatformName]) -> list[PlatformName]:
        return list(dict.fromkeys(v))

    @field_validator("strategies", mode="before")
    @classmethod
    def _parse_strategies(cls, v: Any) -> Any:
        if isinstance(v, (str, dict)):  # one strategy given alone
            v = [v]
        return [parse_strategy(item) for item in v] if isinstance(v, list) else v

    @field_validator("strategies")
    @classmethod
    def _unique_strategies(cls, v: list[TrainingStrategy]) -> list[TrainingStrategy]:
        return list({s.name: s for s in v}.values())


def _flat_hint(settings: type[BaseModel], loc: tuple) -> str:
    field = settings.model_fields.get(str(loc[0])) if loc else None
    extra = field.json_schema_extra if field else None
    return f" (flat name: {extra['flat']})" if isinstance(extra, dict) and extra.get("flat") else ""


def settings_models() -> dict[str, type[BaseModel]]:
    """``engines.<name>`` -> its settings model (``settings_model``): the platforms' entries in report
    order, then the engines' (``pipelines.engines``) that no platform of that name reads."""
    from pipelines import platforms

    names = [p.name for p in platforms.all_platforms() if p.settings is not None]
    return {name: settings_model(name) for name in dict.fromkeys([*names, *ENGINE_SETTINGS])}


def settings_model(name: str) -> type[BaseModel] | None:
    """The settings model of ``engines.<name>``: the engine's, where an engine has that name (a
    platform on that engine declares the engine's model), else the platform's (None: it has none);
    UnknownPlatform names the registered platforms when neither has the name."""
    from pipelines import platforms

    if name not in ENGINE_SETTINGS:
        return platforms.get(name).settings
    platform = platforms.find(name)
    if platform is not None and platform.settings not in (None, ENGINE_SETTINGS[name]):
        raise ValueError(f"engines.{name}: platform {name!r} declares settings of its own, but the engine "
                         f"{name!r} owns that entry (declare its model: pipelines.engines)")
    return ENGINE_SETTINGS[name]


class EnginesConfig(BaseModel):
    """One entry per platform that has settings (``pipelines.platforms.Platform.settings``) and per
    engine of the data stage (``pipelines.engines``), named after it: ``engines.<name>.<field>``,
    a platform on an engine reading the engine's entry. A platform from outside the project (a
    plug-in, a test) appears only where set, so configs written without it load without it."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _declared_settings(cls, values: Any) -> Any:
        from pipelines import platforms

        values = dict(values or {})
        out = {}
        for name, value in values.items():
            settings = settings_model(name)  # UnknownPlatform names the registered ones
            if settings is None:
                raise ValueError(f"platform {name!r} has no settings")
            try:
                out[name] = settings.model_validate(value) if not isinstance(value, settings) else value
            except ValidationError as err:  # name the whole path, not the settings model's own
                raise ValueError("; ".join(f"engines.{name}.{'.'.join(map(str, e['loc']))}"
                                           f"{_flat_hint(settings, e['loc'])}: {e['msg']}"
                                           for e in err.errors())) from None
        # the project's own platforms and the engines: written out in full; a plug-in's only
        # where set (``of`` has its defaults)
        for name in (*platforms.default_names(), *ENGINE_SETTINGS):
            settings = settings_model(name)
            if settings is not None and name not in out:
                out[name] = settings()
        return out

    def of(self, name: str) -> Any:
        """The settings of platform or engine ``name`` (its defaults when this config predates it)."""
        found = (self.__pydantic_extra__ or {}).get(str(name))
        settings = settings_model(str(name))
        return found if found is not None or settings is None else settings()


NETWORK_LOCAL = "local"  # one host, loopback: today's cells
NETWORK_SSH = "ssh"  # real machines: whatever their network is


def check_network(name: str) -> str:
    """A network a cell may run on: ``local``, ``ssh`` or an emulated link (``unshaped``,
    ``10gbit``, ``1gbit``, ``100mbit``, ``<n>mbit``, ``<n>gbit``)."""
    from pipelines.config.links import NetworkSpec

    name = str(name).strip().lower()
    if name in (NETWORK_LOCAL, NETWORK_SSH):
        return name
    return NetworkSpec.parse(name).text  # ValueError names what is allowed


class ClusterConfig(Section):
    """Where the cells run: this host (``local``), hosts emulated on it (network namespaces with
    shaped links and one core each: ``pipelines.cluster``) or real machines over SSH."""

    kind: Literal["local", "emulated", "ssh"] = "local"
    hosts: int = Field(2, ge=1, le=16)  # emulated: how many
    cores_per_host: int = Field(1, ge=1, le=1)  # emulated: a host is pinned to one core
    # emulated: each host's CPU quota, a share of its core (0.5: half a core, so 4 hosts on 2 cores
    # do not share time); None: the whole core. The what-if model reads it (pipelines.whatif)
    cpu_per_host: float | None = Field(None, gt=0, le=1)
    # emulated: a memory cgroup limit (at most this machine's memory: checked when the hosts are built)
    memory_mb_per_host: int | None = Field(None, ge=256, le=4 * 1024 * 1024)
    # ssh: "user@host[:port]" per machine, node 0 first; the run folder and this project's Python must
    # be at the same paths there (shared storage), as for multi-node torchrun
    ssh_hosts: list[str] = deployment([], env="BENCHMARK_SSH_HOSTS")
    ssh_identity: str | None = deployment(None, env="BENCHMARK_SSH_IDENTITY")  # private key file
    # local: a one-host cell, and the clusters the run keeps on this host, run in loopback-only
    # network namespaces (pipelines.cluster.netns); where this host cannot make or enter one (unshare or
    # nsenter refused), preflight refuses the run, since their ports would listen on every interface.
    # true: run them so all the same (each result's resources.listening shows what was open)
    allow_unisolated_cells: bool = deployment(False, env="BENCHMARK_ALLOW_UNISOLATED_CELLS")
    # torch.distributed has no authentication: its TCP store and gloo listen on the hosts' interfaces
    # and any peer that connects takes part. A cell whose ranks talk over a real network (ssh hosts, a
    # worker container of the compose stack) is refused unless this states that every machine on that network is
    # trusted (README "Trusted network"); emulated hosts and one host never leave this machine
    trusted_network: bool = deployment(False, env="BENCHMARK_TRUSTED_NETWORK")

    @field_validator("ssh_hosts", mode="before")
    @classmethod
    def _host_list(cls, v: Any) -> Any:  # BENCHMARK_SSH_HOSTS="root@a root@b:2222" (or commas)
        return v.replace(",", " ").split() if isinstance(v, str) else v


class ProjectedJob(Section):
    """The job the report projects each platform's total to (``pipelines.evaluation.projection``): its
    fixed cost (provision, launch, teardown) + this many epochs of this many training reviews at
    the run's measured per-sample speed + the final test of ``test_samples`` reviews. Default: the
    published study's job, IMDB's 25,000 training reviews x 20 epochs, tested on its 25,000."""

    train_samples: int = Field(25_000, ge=1, le=10**9)  # training reviews per epoch
    epochs: int = Field(20, ge=1, le=100_000)
    test_samples: int = Field(25_000, ge=0, le=10**9)  # reviews of the final test (0: none)


class WhatIfConfig(Section):
    """The cluster and job the what-if model is asked about (``pipelines.whatif``; the report's "Your
    cluster"): ``hosts`` machines of ``workers_per_host`` ranks linked at ``network``, each rank's
    training step ``step_ms`` on the target device for this model and per-rank batch; without it,
    the step that makes the reference platform (``pipelines.platforms.reference()``) take
    ``reference_seconds`` for ``job`` on ``reference_workers`` hosts of one rank (the study's 499 s
    on 2 GPUs), or with neither, this run's own device. Default: the study's 3 nodes x 1 GPU and
    its job, at its 499 s."""

    hosts: int = Field(3, ge=1, le=10_000)
    workers_per_host: int = Field(1, ge=1, le=1024)
    # "unshaped" (as fast as the hosts can talk), or a link rate "25gbit", "100mbit" (1mbit to 100gbit)
    network: str = "10gbit"
    step_ms: float | None = Field(None, gt=0, le=3_600_000)
    reference_seconds: float | None = Field(499.0, gt=0)
    reference_workers: int = Field(2, ge=1, le=10_000)
    # each host's CPU as a share of what this run's hosts had (0.5: half as fast; None: the same)
    cpu_share: float | None = Field(None, gt=0, le=64)
    job: ProjectedJob = Field(default_factory=ProjectedJob)

    @field_validator("network")
    @classmethod
    def _rate(cls, v: str) -> str:
        from pipelines.config.links import NetworkSpec

        return NetworkSpec.parse(v).text  # ValueError names what is allowed (at least 1mbit)


class TrackingConfig(Section):
    """Where results go (run folders, MLflow) and how they are judged."""

    output_root: str = deployment("runs", env="BENCHMARK_OUTPUT_ROOT")
    # default $MLFLOW_TRACKING_URI, else <output_root>/mlflow.db
    mlflow_tracking_uri: str | None = deployment(None)
    mlflow_experiment: str = "distributed-training-benchmark"
    target_accuracy: float = Field(0.7, gt=0, le=1)  # for time-to-accuracy
    price_per_worker_hour: float = Field(0.0, ge=0)
    # The price sheet a cell's cost is priced from (pipelines.evaluation.resource_cost), USD:
    # provisioned CPUs x wall hours x price_per_cpu_hour + peak memory GB x wall hours x
    # price_per_gb_hour + GPUs x wall hours x price_per_gpu_hour. Defaults: Google Cloud Compute
    # Engine on-demand list prices, us-central1 (cloud.google.com/compute/vm-instance-pricing and
    # /compute/gpus-pricing): N2 vCPU 0.031611/h (SKU BB77-5FDA-69D9), N2 memory 0.004237/GiB-h
    # (SKU 5B01-D157-A097), NVIDIA A100 40GB 2.933908/GPU-h; as public GCP rate tables carry these
    # SKUs, looked up 2026-12-01. price_source is what the report states: change it with the prices.
    price_per_cpu_hour: float = Field(0.031611, ge=0)
    price_per_gb_hour: float = Field(0.004237, ge=0)
    price_per_gpu_hour: float = Field(2.933908, ge=0)
    price_source: str = ("Google Cloud Compute Engine on-demand list prices, us-central1: N2 vCPU, N2 memory "
                         "(per GiB), NVIDIA A100 40GB (looked up 2026-12-01)")
    regression_time_threshold: float = Field(0.25, gt=0)  # slowdown fraction that fails
    regression_accuracy_drop: float = Field(0.05, gt=0)  # absolute accuracy drop that fails
    regression_baseline_runs: int = Field(5, ge=1, le=50)  # K: baseline = median of the last K runs
    regression_window_days: int = Field(30, ge=1)  # long-term reference: oldest K runs in this window
    regression_pinned_baseline: str | None = None  # MLflow run id the team pins as long-term reference
    # the job the verdict and "Beside the published study" project each platform's total to: the
    # study's by default; set a team's own (``--set 'projected_job={"train_samples": 5000, "epochs": 3}'``)
    projected_job: ProjectedJob = Field(default_factory=ProjectedJob)
    # the cluster the report's "Your cluster" asks the what-if model about (pipelines.whatif)
    whatif: WhatIfConfig = Field(default_factory=WhatIfConfig)


SECTIONS: dict[str, type[BaseModel]] = {"data": DataConfig, "training": TrainingConfig, "matrix": MatrixConfig,
                                        "engines": EnginesConfig, "cluster": ClusterConfig,
                                        "tracking": TrackingConfig}
DEFAULT_NETWORK = {"local": NETWORK_LOCAL, "emulated": "1gbit", "ssh": NETWORK_SSH}
IDENTITY_SECTIONS = ("data", "training")  # what a cell trains: the fingerprint and checkpoint identity


def fault_problem(matrix: MatrixConfig, epochs: int, cluster: ClusterConfig) -> str | None:
    """Why the run's fault would inject nothing (or cannot be injected), naming the field; None if fine."""
    if matrix.fault == "none":
        return None
    if matrix.fault_epoch > epochs:
        return (f"matrix.fault_epoch (flat name: fault_epoch): {matrix.fault_epoch} is after the last epoch "
                f"(training.epochs={epochs}): it must be from 1 to {epochs}")
    # a host is lost through its cgroups (pipelines.measure.faults): emulated hosts only
    if cluster.kind != "emulated" or cluster.hosts < 2:
        return (f"matrix.fault (flat name: fault): {matrix.fault} needs an emulated cluster of at least 2 hosts "
                f"(cluster.kind=emulated, cluster.hosts >= 2); this run has cluster.kind={cluster.kind}"
                + (f" with {cluster.hosts} host(s)" if cluster.kind == "emulated" else ""))
    if max(matrix.worker_counts) < 2:
        return (f"matrix.fault (flat name: fault): {matrix.fault} needs cells of at least 2 workers (one per "
                f"host); matrix.worker_counts={matrix.worker_counts}")
    return None
