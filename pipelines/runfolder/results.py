"""The one result record every backend writes: ``cells/<cell>/result.json``.

Written locally first by the training cell; evaluation, MLflow logging and the report read
these files, so a lost tracking server loses nothing. The timing fields are filled from one
``pipelines.training.record.TrainingRecord`` whatever the backend, so they mean the same
thing everywhere (see that module for the definition of each phase).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipelines import platforms
from pipelines.runfolder.fileio import atomic_write_text


class EpochMetrics(BaseModel):
    epoch: int  # 1-based
    train_loss: float  # mean over the epoch's steps of the global batch's mean loss
    train_accuracy: float
    eval_loss: float  # held-out split, every row once across the ranks
    eval_accuracy: float
    train_seconds: float = 0.0  # this epoch's training phase (data + forward/backward/step)
    eval_seconds: float = 0.0  # this epoch's held-out evaluation phase
    checkpoint_seconds: float = 0.0  # this epoch's checkpoint phase (gather + write)
    epoch_seconds: float  # train + eval + checkpoint of this epoch
    elapsed_seconds: float  # wall time from the first step to the end of this epoch (all attempts)
    samples_per_second: float  # training samples/s over training time so far (all ranks)
    learning_rate: float | None = None  # the schedule's rate after the epoch's last step


class ClassMetrics(BaseModel):
    label: int
    precision: float
    recall: float
    f1: float
    support: int  # test rows of this class


class TestMetrics(BaseModel):
    __test__ = False  # not a pytest test class, despite the name

    accuracy: float
    f1: float  # macro average over the task's classes
    precision: float  # macro
    recall: float  # macro
    loss: float
    confusion_matrix: list[list[int]]  # K x K, rows = true label, columns = predicted
    per_class: list[ClassMetrics] = Field(default_factory=list)


class Attempt(BaseModel):
    """One attempt at a cell (a first run, a retry after a failure or a kill)."""

    attempt: int  # 1-based
    start: float  # unix time the adapter began (after the host lock)
    lock_wait_seconds: float = 0.0  # waited for the host lock (another timed cell) before start
    end: float | None = None  # None while running; a killed attempt ends at its last heartbeat
    outcome: Literal["running", "ok", "failed", "killed"] = "running"
    error: str | None = None
    epoch_reached: int = 0  # newest checkpointed epoch when the attempt ended
    startup_seconds: float | None = None  # attempt start -> first training step (if it got there)
    lost_seconds: float = 0.0  # training done after the last checkpoint, thrown away by the failure
    recovery_seconds: float | None = None  # previous attempt's failure -> this attempt's first step


class TimedWindow(BaseModel):
    """The cell's timed part on this host: no other timed cell overlaps it (host lock)."""

    start: float
    end: float
    lock_wait_seconds: float = 0.0  # waited for another cell before the window opened


class HostUsage(BaseModel):
    """What one host of a cell used (``ResourceUsage.per_host``); ``source`` says how it was
    measured: "cgroup" (an emulated host: cpuacct, memory cgroup), "proc" (the driver's processes
    on this machine) or "none" (an SSH host: only its link counters)."""

    source: Literal["cgroup", "proc", "none"] = "cgroup"
    cpus: int | None = None  # cores it could use (its cpuset)
    cpu_seconds: float | None = None  # user + system of everything on it
    cpu_utilisation: float | None = None  # cpu_seconds / (wall x cpus)
    peak_memory_mb: float | None = None  # cgroup: memory.max_usage_in_bytes (page cache included)
    ranks_cpu_seconds: float | None = None
    ranks_peak_rss_mb: float | None = None
    platform_cpu_seconds: float | None = None
    platform_peak_rss_mb: float | None = None
    platform_processes: dict[str, float] = Field(default_factory=dict)  # kind -> peak RSS MB
    bytes_sent: int | None = None  # its link's counters during the launch
    bytes_received: int | None = None
    note: str | None = None  # what could not be measured there, and why


class ResourceUsage(BaseModel):
    """What a cell's processes used while it launched and trained (``pipelines.measure.resources``): the
    last attempt, sampled every ``interval_s``; the timeline is in ``<cell>/resources.json``.

    Ranks = the processes that wrote ``<cell>/ranks/rank-<k>.pid``; platform = every other process
    of the cell (launcher, JVMs, the platform's daemons, the driver), by kind in ``platform_processes``. CPU =
    user + system from /proc (locally, a process's CPU after its last sample is missed); RSS sums
    count pages shared between processes in each; on emulated hosts the cgroups count everything."""

    source: Literal["process tree", "hosts"] = "process tree"
    started: float  # unix time of the first sample: t = 0 of the timeline
    wall_seconds: float
    interval_s: float
    samples: int
    cpus: int | None = None  # cores the cell could use (locally: the driver's CPU affinity; hosts: cpusets)
    cpu_seconds: float  # user + system of all the cell's processes
    cpu_utilisation: float | None = None  # cpu_seconds / (wall x cpus)
    peak_rss_mb: float  # largest sum of RSS over one sample; hosts: sum of the cgroups' peaks + the driver's
    ranks: int = 0  # rank processes found
    ranks_cpu_seconds: float = 0.0
    ranks_peak_rss_mb: float = 0.0
    platform_cpu_seconds: float = 0.0
    platform_peak_rss_mb: float = 0.0
    platform_processes: dict[str, float] = Field(default_factory=dict)  # kind -> peak RSS MB
    sampler_cpu_seconds: float = 0.0  # the sampler's own thread (left out of every figure)
    bytes_sent: int | None = None  # hosts: links; locally: the cell's private namespace, else None
    bytes_received: int | None = None
    gpus: int | None = None  # GPUs nvidia-smi saw (None: none, or no nvidia-smi)
    gpu_utilisation_mean: float | None = None  # percent, mean over samples and GPUs (device-wide)
    gpu_peak_memory_mb: float | None = None  # largest sum over GPUs of memory used (device-wide)
    per_host: dict[str, HostUsage] = Field(default_factory=dict)  # hosts + "driver"; empty locally
    # beside the cell (pipelines.measure.outside): the run's processes that ran before the cell under
    # its driver and stayed alive through it (kind -> count; nothing of the run should), and the
    # host's CPU that processes outside the cell used during the window (share of all its cores)
    run_processes_outside: dict[str, int] = Field(default_factory=dict)
    # what the platform runs (the report's "What it takes"): kind -> processes that started in the
    # window (the cell's; ranks as "rank") and that were alive before it (a standing cluster's); kind
    # -> the "address:port"s they listened on (TCP; pipelines.measure.listeners)
    processes_started: dict[str, int] = Field(default_factory=dict)
    processes_standing: dict[str, int] = Field(default_factory=dict)
    listening: dict[str, list[str]] = Field(default_factory=dict)
    standing_listening: dict[str, list[str]] = Field(default_factory=dict)
    outside_cpu_seconds: float | None = None
    outside_cpu_share: float | None = None
    notes: list[str] = Field(default_factory=list)  # what was not measured, and why


class RankSteps(BaseModel):
    """One rank's optimizer steps in the cell's last attempt (``TrainingRecord.rank_steps``): who
    computed slowly and who waited. A step is the wall time from having its batch to asking for the
    next (forward, backward, gradient all-reduce, optimizer step); per step, compute + communication
    is about the step time (compute = the rest of the train phase, as in ``phases``)."""

    rank: int
    host: str | None = None  # the launch host (BENCHMARK_HOST) or the machine's name
    steps: int = 0
    step_mean_s: float = 0.0
    step_p50_s: float = 0.0
    step_p95_s: float = 0.0
    step_max_s: float = 0.0
    compute_s: float = 0.0  # this rank's compute in the train phase (train - data - communication)
    communication_s: float = 0.0  # gradient / parameter collectives in flight (CommTimer) + metrics' all-reduce
    data_s: float = 0.0  # waiting for the next batch

    @property
    def compute_per_step_s(self) -> float:
        return self.compute_s / self.steps if self.steps else 0.0

    @property
    def communication_per_step_s(self) -> float:
        return self.communication_s / self.steps if self.steps else 0.0


class CellResult(BaseModel):
    """One training cell = (backend, strategy, world size, repeat)."""

    model_config = ConfigDict(extra="forbid")

    backend: str  # the platform's name (a record: kept as written, registered or not)
    world_size: int
    repeat: int = 0
    # --- training strategy (pipelines.config.TrainingStrategy) ---------------------------------
    strategy: str = "default"  # its canonical name; the fields below are its settings
    comm_hook: str = "none"
    powersgd_rank: int | None = None  # only with comm_hook=powersgd
    sync_every: int = 1
    sharding: str = "ddp"
    imbalance: str = "none"
    pipeline_microbatches: int = 0  # > 0: the cell split the model's layers over its ranks (pipeline)
    asynchronous: bool = False  # the workers pushed gradients to a parameter server, no barrier (async)
    staleness_bound: int | None = None  # async: a gradient staler than this was dropped
    # async (pipelines.training.parameter_server): server updates between the weights a gradient was
    # computed on and those it was applied to: {updates, dropped, mean, p50, p95, max, bound, histogram}
    staleness: dict | None = None
    # payload this rank handed to gradient / parameter collectives per optimizer step, averaged
    # over training (comm hook buckets after compression, local SGD's parameter averaging);
    # None where not measured (one worker, FSDP). Wire bytes of a ring all-reduce are ~2(W-1)/W of it.
    # A pipeline: every byte its stages sent each other per step (activations, their gradients), all ranks.
    comm_bytes_per_step: float | None = None
    steps_per_epoch: int = 0  # optimizer steps per epoch on each rank
    # where the cell ran (pipelines.cluster): "local" (this host) or "emulated" / "ssh" hosts, and
    # the network of its links ("local" = loopback; "unshaped", "1gbit", "100mbit", ... between hosts)
    cluster: str = "local"
    network: str = "local"
    # how its processes on this host were kept off its interfaces (pipelines.cluster.netns): "own-netns"
    # (a loopback-only namespace of the cell's own), "run-netns" (the run's, with its standing cluster),
    # "host-netns" (a driver reaching a cluster elsewhere), "none (allow_unisolated_cells)" (no namespace
    # could be made: its ports listened on every interface), places joined by ", "; "emulated hosts"
    # (each host a namespace of its own), "none (ssh hosts)" (real machines); None: not recorded
    isolation: str | None = None
    status: Literal["ok", "failed"] = "ok"
    error: str | None = None  # why the cell failed, for the report
    device: str = "cpu"  # e.g. "cpu", "cuda:NVIDIA H200"
    model_source: Literal["pretrained", "random_init"] | None = None
    model_name: str | None = None
    train_samples: int = 0
    test_samples: int = 0
    max_seq_len: int = 0
    num_labels: int = 2  # classes of the task (from the snapshot manifest)
    batch_size_per_worker: int = 0
    global_batch_size: int = 0
    batch_policy: str = "per_worker"  # see BenchmarkConfig.batch_policy / lr_scaling
    lr_scaling: str = "none"
    learning_rate: float = 0.0  # after lr_scaling
    seed: int = 0  # config seed + repeat
    epochs: list[EpochMetrics] = Field(default_factory=list)
    test: TestMetrics | None = None
    # wall time split (pipelines.training.record): launch -> first step, training phase,
    # held-out + final test evaluation, checkpoints; total = adapter entry -> result written
    startup_seconds: float = 0.0
    training_seconds: float = 0.0
    evaluation_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    total_seconds: float = 0.0
    # where the wall time goes, one definition for every backend (pipelines.training.phases):
    # launch, data, compute, communication, checkpoint, evaluation, teardown [, retries]
    phases: dict[str, float] = Field(default_factory=dict)
    work_end: float | None = None  # unix time rank 0's result was complete (teardown starts)
    samples_per_second: float = 0.0
    peak_memory_mb: float = 0.0
    checkpoint_path: str | None = None  # last training checkpoint (model + optimizer + RNG)
    model_path: str | None = None  # trained model, Hugging Face format (save_pretrained)
    resumed_from_epoch: int = 0  # 0 = fresh start
    # every attempt; the cell's total is their sum; lost work and recovery measure fault tolerance
    attempts: list[Attempt] = Field(default_factory=list)
    lost_seconds: float = 0.0
    recovery_seconds: float = 0.0
    timed_window: TimedWindow | None = None
    devices: list[str] = Field(default_factory=list)  # per rank: "cpu:cores 0" or "cuda:0"
    placements: list[str] = Field(default_factory=list)  # per rank: host [+ " executor <app>/<id>"]
    # how the platform's driver session (a library's session object, where its adapter has one) was
    # started: "fresh" (started for this cell, stopped after it); None: it has none. Results written
    # before the field was neutral call it by the platform's word (Platform.result_renames)
    platform_session: str | None = None
    # how the platform ran (TrainingBackend.platform_fields): ddp "torchrun" / "torchrun-<k>-nodes";
    # spark "local" (torchrun on the driver) / "cluster" (barrier tasks on executors);
    # determined "local" (Trainer in-process) / "master" (experiment on a Determined master)
    platform_mode: str | None = None
    # across hosts (TrainingBackend.launch_on_hosts): the bytes each host's link moved meanwhile
    link_bytes: dict[str, dict[str, int]] | None = None
    # bytes all hosts' links sent during the launch / optimizer steps trained in it (every byte:
    # gradients, evaluation, rendezvous, data a platform moved)
    link_bytes_per_step: float | None = None
    # what the training steps alone moved over the links per step (the ranks' own interface counters
    # around each epoch's steps: no model broadcast, evaluation or start-up); None on one host
    link_bytes_per_train_step: float | None = None
    # matrix.fault (pipelines.measure.faults.record): the host lost, where, who recovered and at what cost
    fault: dict | None = None
    # matrix.fault slow_host / slow_link (pipelines.measure.stragglers.record): which host, how slow
    straggler: dict | None = None
    # every rank's step times and where its train phase went, gathered by rank 0 (last attempt)
    rank_steps: list[RankSteps] = Field(default_factory=list)
    # how the training rows reached the ranks (TrainingBackend.data_feed): "files" (each rank reads
    # the token shards) or "dataframe" (spark_dataframe: the DataFrame's partitions, through Spark)
    data_feed: str | None = None
    # CPU, memory, bytes and GPU of the cell's processes, ranks vs platform (pipelines.measure.resources)
    resources: ResourceUsage | None = None
    versions: dict[str, str] = Field(default_factory=dict)  # torch, transformers, backend lib
    host: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        """A result written before a field's rename: its old name, declared by the platform that
        stored it (``Platform.result_renames``), reads as the field now; a value under the new name wins."""
        if isinstance(data, dict) and (renames := {k: v for k, v in platforms.result_renames().items() if k in data}):
            data = dict(data)
            for old, new in renames.items():
                data.setdefault(new, data.pop(old))
        return data

    def write(self, path: Path) -> None:
        atomic_write_text(path, self.model_dump_json(indent=2))

    @classmethod
    def read(cls, path: Path) -> "CellResult":
        return cls.model_validate_json(Path(path).read_text())
