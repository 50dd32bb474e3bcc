"""One typed configuration for a benchmark run.

The same ``BenchmarkConfig`` flows through the CLI (``python -m pipelines``), the Airflow
DAG params and the reports.  Values are layered: a named profile gives the defaults, then
overrides (DAG params, ``--set key=value`` on the CLI) replace single fields.  Unknown keys
and wrong types are refused with a message that names the field and the allowed values.

    >>> cfg = load_config("smoke", {"epochs": 3})
    >>> cfg.epochs
    3
"""

from __future__ import annotations

import json
import math
import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipelines.fileio import atomic_write_text
from pipelines.paths import DEFAULT_STRATEGY

DEFAULT_DATASET = "stanfordnlp/imdb"  # hub dataset id; a local folder works too
DEFAULT_MODEL = "prajjwal1/bert-tiny"  # hub model id; a local folder works too


class Backend(StrEnum):
    """Training platforms under comparison: the one registration of a backend.

    Adding one = a member here + the module ``pipelines/backends/<value>.py`` defining a
    ``TrainingBackend`` subclass (``pipelines.backends.get_backend`` finds it by that name).
    Strings become members once, where they enter: CLI arguments, DAG params, JSON files.
    """

    DDP = "ddp"
    SPARK = "spark"
    DETERMINED = "determined"
    RAY = "ray"
    # Spark TorchDistributor with the data fed through Spark (the tokenized DataFrame's partitions
    # reach the ranks in a barrier stage) instead of each rank reading the token shards ("spark")
    SPARK_DATAFRAME = "spark_dataframe"


def is_local_spark_master(master: str) -> bool:
    """``local`` / ``local[N]``: no executors, so no barrier tasks (TorchDistributor's local mode)."""
    return master == "local" or master.startswith("local[")


# --- training strategies (issue 13) ----------------------------------------------------------
class TrainingStrategy(BaseModel):
    """How the ranks of a cell cooperate, orthogonal to the backend that launches them.

    ``comm_hook``: DDP gradient communication (``none`` = fp32 all-reduce; ``fp16`` / ``bf16``
    compression; ``powersgd`` low-rank compression of rank ``powersgd_rank``); ``sync_every``:
    local SGD, parameters averaged every N steps (1 = plain synchronous DDP); ``sharding``:
    ``ddp`` (replicated) or ``fsdp`` (FSDP2 ``fully_shard``); ``imbalance``: how training
    counters an imbalanced train split (``weighted_sampler`` draws rows with probability
    1 / class count, ``weighted_loss`` weights the loss by N / (K * class count)).
    ``name`` is the short label of cells and reports ("default" when nothing is changed).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = "none"
    powersgd_rank: int = Field(1, ge=1, le=64)  # matrix_approximation_rank of PowerSGD
    sync_every: int = Field(1, ge=1, le=10_000)  # local SGD period in optimizer steps
    sharding: Literal["ddp", "fsdp"] = "ddp"
    imbalance: Literal["none", "weighted_sampler", "weighted_loss"] = "none"

    @property
    def name(self) -> str:
        parts = []
        if self.comm_hook == "powersgd":
            parts.append(f"powersgd-r{self.powersgd_rank}")
        elif self.comm_hook != "none":
            parts.append(self.comm_hook)
        if self.sync_every > 1:
            parts.append(f"localsgd-{self.sync_every}")
        if self.sharding != "ddp":
            parts.append(self.sharding)
        if self.imbalance != "none":
            parts.append(self.imbalance)
        return "+".join(parts) or DEFAULT_STRATEGY

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_STRATEGY

    def result_fields(self) -> dict[str, Any]:
        """The CellResult fields that record this strategy."""
        return {"strategy": self.name, "comm_hook": self.comm_hook,
                "powersgd_rank": self.powersgd_rank if self.comm_hook == "powersgd" else None,
                "sync_every": self.sync_every, "sharding": self.sharding, "imbalance": self.imbalance}

    @property
    def needs_process_group(self) -> bool:
        """Strategies about how ranks talk: meaningless on one worker."""
        return self.comm_hook != "none" or self.sync_every > 1 or self.sharding != "ddp"

    @model_validator(mode="after")
    def _compatible(self) -> "TrainingStrategy":
        if self.sharding == "fsdp" and (self.comm_hook != "none" or self.sync_every > 1):
            raise ValueError("sharding=fsdp takes no DDP comm_hook and no sync_every > 1 "
                             "(FSDP reduce-scatters gradients itself; hooks and local SGD are DDP's)")
        if self.comm_hook != "none" and self.sync_every > 1:
            raise ValueError("comm_hook and sync_every > 1 exclude each other: local SGD registers "
                             "its own DDP hook (post-local-SGD)")
        return self


def parse_strategy(value: Any) -> Any:
    """A strategy as the CLI / trigger form gives it: a dict of fields, or a canonical name
    (``"default"``, ``"fp16"``, ``"powersgd-r2"``, ``"localsgd-4"``, ``"fsdp"``,
    ``"weighted_loss"``, joined with ``+``)."""
    if not isinstance(value, str):
        return value
    fields: dict[str, Any] = {}
    for part in filter(None, value.strip().split("+")):
        if part == DEFAULT_STRATEGY:
            continue
        if part in ("fp16", "bf16", "powersgd"):
            fields["comm_hook"] = part
        elif part.startswith("powersgd-r") and part[10:].isdigit():
            fields.update(comm_hook="powersgd", powersgd_rank=int(part[10:]))
        elif part.startswith("localsgd-") and part[9:].isdigit():
            fields["sync_every"] = int(part[9:])
        elif part in ("fsdp", "ddp"):
            fields["sharding"] = part
        elif part in ("weighted_sampler", "weighted_loss"):
            fields["imbalance"] = part
        else:
            raise ValueError(f"unknown strategy part {part!r} in {value!r} (known: default, fp16, bf16, "
                             "powersgd, powersgd-r<rank>, localsgd-<steps>, fsdp, weighted_sampler, "
                             "weighted_loss; joined with '+')")
    return fields


# Fields that say where/how a run is launched, tracked or judged, not what a cell trains.
PLACEMENT_FIELDS = frozenset({
    "profile", "backends", "strategies", "worker_counts", "repeats", "target_accuracy", "spark_master",
    "ddp_nnodes", "ddp_node_rank", "ddp_rdzv_endpoint", "determined_master", "output_root",
    "mlflow_tracking_uri", "mlflow_experiment", "price_per_worker_hour",
    "regression_time_threshold", "regression_accuracy_drop", "regression_baseline_runs",
    "regression_window_days", "regression_pinned_baseline",
    "ray_address",
})


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field and what is allowed."""


class BenchmarkConfig(BaseModel):
    """Everything that decides what a benchmark run does. Immutable once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = "custom"

    # --- data ---------------------------------------------------------------------------
    dataset_source: str = DEFAULT_DATASET  # hub id, or folder: parquet/csv/jsonl/aclImdb tree
    train_samples: int | None = Field(None, ge=2)  # stratified sample size; None = all 25k
    test_samples: int | None = Field(None, ge=2)
    seed: int = 42  # sampling, model init, shuffling: same seed -> same run
    min_text_chars: int = Field(1, ge=1)  # GX bounds on raw review length
    max_text_chars: int = Field(20_000, ge=1)
    min_class_fraction: float = Field(0.4, gt=0, le=0.5)  # GX class-balance bound per label
    # imbalanced train sample on purpose: every class other than label 0 gets class_ratio times
    # label 0's rows (test stays stratified); the train balance bound follows the ratio
    class_ratio: float | None = Field(None, gt=0, le=1)
    # data contract (GX): what a usable benchmark data set is; relaxing it keeps a run out of baselines
    max_overlap_fraction: float = Field(0.01, ge=0, le=1)  # test rows whose text is also in train
    max_duplicate_fraction: float = Field(0.05, ge=0, le=1)  # repeated texts within one split
    min_rows_per_class: int = Field(5, ge=1)  # in train and in test
    allow_small_data: bool = False  # fewer rows than requested / classes below the minimum pass
    validation_fraction: float = Field(0.1, gt=0, lt=0.5)  # of train, held out (stratified, seeded)
    max_seq_len: int = Field(128, ge=8, le=512)
    # which end of a longer review is cut: "right" (the library's default, the study's) or
    # "left" (keeps the review's conclusion: a random-init model learns sentiment from it sooner)
    truncation_side: Literal["right", "left"] = "right"
    tokenizer_source: str = DEFAULT_MODEL  # hub id or local folder with tokenizer files

    # --- model & training ------------------------------------------------------------------
    model_source: str = DEFAULT_MODEL  # hub id / folder; no weights there -> random init
    backends: list[Backend] = Field(default_factory=lambda: list(Backend), min_length=1)
    # training strategies: every backend x strategy x worker count is a cell (a cell's own config
    # carries its one strategy); a strategy a backend cannot run is refused before the cell starts
    strategies: list[TrainingStrategy] = Field(default_factory=lambda: [TrainingStrategy()], min_length=1)
    worker_counts: list[int] = Field(default_factory=lambda: [1, 2], min_length=1)
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
    repeats: int = Field(1, ge=1, le=100)  # repeat r trains with seed + r (init and data order)
    threads_per_worker: int = Field(1, ge=1)  # torch intra-op threads per rank on CPU
    target_accuracy: float = Field(0.7, gt=0, le=1)  # for time-to-accuracy

    # --- engines (scale-out is configuration only) -----------------------------------------
    # "local[*]" (TorchDistributor local mode: torchrun on the driver), "embedded" (a standalone
    # cluster the run starts and stops: pipelines.spark_cluster) or a cluster URL spark://host:7077
    # (barrier mode on its executors)
    spark_master: str = "local[*]"
    ddp_nnodes: int = Field(1, ge=1)
    ddp_node_rank: int = Field(0, ge=0)
    ddp_rdzv_endpoint: str | None = None  # host:port; None -> --standalone
    determined_master: str | None = None  # None -> local Trainer; else DET_MASTER
    # --- ray (pipelines.backends.ray) ---
    # None: a local Ray cluster on 127.0.0.1 started for each ray cell and stopped after it;
    # "auto" (the cluster this host belongs to), "ray://host:10001" (Ray Client) or
    # "host:6379" (the head's GCS address): join that cluster, which is left running
    ray_address: str | None = None

    # --- tracking, reporting, output -------------------------------------------------------
    output_root: str = "runs"
    mlflow_tracking_uri: str | None = None  # default $MLFLOW_TRACKING_URI, else <output_root>/mlflow.db
    mlflow_experiment: str = "distributed-training-benchmark"
    price_per_worker_hour: float = Field(0.0, ge=0)
    regression_time_threshold: float = Field(0.25, gt=0)  # slowdown fraction that fails
    regression_accuracy_drop: float = Field(0.05, gt=0)  # absolute accuracy drop that fails
    regression_baseline_runs: int = Field(5, ge=1, le=50)  # K: baseline = median of the last K runs
    regression_window_days: int = Field(30, ge=1)  # long-term reference: oldest K runs in this window
    regression_pinned_baseline: str | None = None  # MLflow run id the team pins as long-term reference

    @field_validator("worker_counts")
    @classmethod
    def _positive_unique_workers(cls, v: list[int]) -> list[int]:
        if any(n < 1 for n in v):
            raise ValueError("every worker count must be >= 1")
        return sorted(set(v))

    @field_validator("spark_master")
    @classmethod
    def _known_spark_master(cls, v: str) -> str:
        if v == "embedded" or v == "local" or v.startswith(("local[", "spark://", "k8s://", "yarn")):
            return v
        raise ValueError("must be local[N|*], embedded (the run's own standalone cluster) or a cluster "
                         "master URL (spark://host:7077, k8s://..., yarn)")

    @field_validator("ray_address")
    @classmethod
    def _known_ray_address(cls, v: str | None) -> str | None:
        if v is None or v == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9_.\-]+:\d{1,5}", v):
            return v
        raise ValueError("must be empty (a local Ray cluster started for each cell), 'auto' (the cluster "
                         "this host belongs to), ray://host:port (Ray Client) or host:port (the head's GCS)")

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

    def strategy(self, name: str | None = None) -> TrainingStrategy:
        """The run's strategy called ``name``; a cell's config (one strategy): its own."""
        if name is None:
            if len(self.strategies) != 1:
                raise ConfigError(f"strategies: this config holds {len(self.strategies)}; name one")
            return self.strategies[0]
        for s in self.strategies:
            if s.name == name:
                return s
        raise ConfigError(f"strategy {name!r} is not one of this run's strategies "
                          f"({', '.join(s.name for s in self.strategies)})")

    @field_validator("backends")
    @classmethod
    def _unique_backends(cls, v: list[Backend]) -> list[Backend]:
        return list(dict.fromkeys(v))

    def resolved_tracking_uri(self) -> str:
        """MLflow URI: the config's, else a SQLite store in the output root.

        Never MLflow's implicit default (a store in the current working directory). The
        environment's MLFLOW_TRACKING_URI is taken when the config is built (``load_config``),
        not here: MLflow itself sets that variable in-process, which must not re-route a run.
        """
        if self.mlflow_tracking_uri:
            return self.mlflow_tracking_uri
        return f"sqlite:///{Path(self.output_root).resolve() / 'mlflow.db'}"

    def cells(self) -> list[tuple[Backend, str, int, int]]:
        """Every (backend, strategy name, workers, repeat) training cell of this run, in a
        stable order. Strategies about how ranks talk (comm hooks, local SGD, FSDP) have no
        1-worker cell: they do not apply there (``not_applicable_cells`` lists them)."""
        return [
            (b, s.name, n, r)
            for r in range(self.repeats)
            for b in self.backends
            for s in self.strategies
            for n in self.worker_counts
            if n > 1 or not s.needs_process_group
        ]

    def not_applicable_cells(self) -> list[tuple[str, int]]:
        """(strategy name, workers) pairs left out of ``cells``: nothing to communicate."""
        return [(s.name, n) for s in self.strategies for n in self.worker_counts
                if n == 1 and s.needs_process_group]

    def for_cell(self, world_size: int, repeat: int, strategy: str | None = None) -> "BenchmarkConfig":
        """The config one cell trains with: seed + repeat, the per-worker batch of the batch
        policy, the learning rate scaled to the global batch and the cell's one strategy
        (``strategy``: a name of ``strategies``; None = the first). Stored in the cell's spec."""
        if self.batch_policy == "global":
            if self.batch_size % world_size:
                raise ConfigError(f"batch_size: the global batch {self.batch_size} cannot be split evenly "
                                  f"over {world_size} workers (batch_policy=global)")
            per_worker = self.batch_size // world_size
        else:
            per_worker = self.batch_size
        factor = per_worker * world_size / self.batch_size  # global batch vs the 1-worker batch
        scale = {"none": 1.0, "linear": factor, "sqrt": math.sqrt(factor)}[self.lr_scaling]
        chosen = self.strategy(strategy) if strategy is not None else self.strategies[0]
        return self.model_copy(update={"seed": self.seed + repeat, "batch_size": per_worker,
                                       "learning_rate": self.learning_rate * scale,
                                       "strategies": [chosen]})

    def fingerprint(self) -> str:
        """sha256 over every field that changes the work or the result (not where it runs, how
        it is tracked or judged): runs compare only with runs of the same fingerprint."""
        import hashlib

        return hashlib.sha256(json.dumps(self.training_identity(), sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def training_identity(self) -> dict[str, Any]:
        """The fields that decide what a cell trains; a checkpoint resumes only if they match.

        Where and how the run is launched or tracked (master URLs, rendezvous endpoint, output
        and tracking locations, the matrix of cells) may change between attempts.
        """
        identity = self.model_dump(mode="json", exclude=PLACEMENT_FIELDS)
        # new fields enter the identity only when used, so earlier runs keep their fingerprint
        if identity.get("class_ratio") is None:
            identity.pop("class_ratio", None)
        if len(self.strategies) == 1 and not self.strategies[0].is_default:  # a cell's config
            identity["strategy"] = self.strategies[0].model_dump(mode="json")
        return identity


# Learning rates: BERT-tiny from random init (no hub here) needs ~1e-3 to leave chance level
# within a few epochs (measured: 2k reviews, 4 epochs, lr 1e-3 -> 0.76 test accuracy; at 2e-4
# it stays at 0.50 after 3 epochs of 4k). `paper` keeps a fine-tuning rate for pretrained weights.
PROFILES: dict[str, dict[str, Any]] = {
    # Minutes on 2 CPU cores: the README's main command and CI use it. Sized to visibly learn
    # from random init (measured, 4 seeds: test accuracy 0.69-0.72 with 1,080 training reviews x
    # 3 epochs, their last 48 tokens, batch 16, lr 1e-3; 400-800 reviews or 2 epochs stay at 0.50
    # for some seeds). A global batch gives 2 workers the same steps as 1.
    "smoke": dict(
        train_samples=1200, test_samples=400, max_seq_len=48, truncation_side="left", epochs=3,
        batch_size=16, batch_policy="global", learning_rate=1e-3, worker_counts=[1, 2], repeats=1,
        target_accuracy=0.65, min_class_fraction=0.35,
        # local[*] has no executors for the dataframe feed's barrier tasks (pipelines.preflight)
        backends=[b for b in Backend if b != Backend.SPARK_DATAFRAME],
    ),
    # Every night: big enough for stable medians, small enough for a CPU box.
    "nightly": dict(
        train_samples=4000, test_samples=2000, max_seq_len=128, epochs=3, batch_size=32,
        learning_rate=1e-3, worker_counts=[1, 2], repeats=3, target_accuracy=0.7,
        spark_master="embedded",  # Spark as teams deploy it: barrier tasks on a standalone cluster
    ),
    # The published study: full IMDB, 20 epochs, up to 3 workers.
    "paper": dict(
        train_samples=None, test_samples=None, max_seq_len=128, epochs=20, batch_size=32,
        learning_rate=1e-4, worker_counts=[1, 2, 3], repeats=1, target_accuracy=0.8,
        spark_master="embedded",
    ),
}


# Machine-specific defaults (where the data and the run folders are on this host), read by the
# DAG and the CLI for fields a trigger or command line leaves empty; scripts/airflow_env.sh sets them.
SITE_DEFAULT_ENV = {
    "output_root": "BENCHMARK_OUTPUT_ROOT",
    "dataset_source": "BENCHMARK_DATASET_SOURCE",
    "tokenizer_source": "BENCHMARK_TOKENIZER_SOURCE",
    "model_source": "BENCHMARK_MODEL_SOURCE",
    "spark_master": "BENCHMARK_SPARK_MASTER",
    "determined_master": "BENCHMARK_DETERMINED_MASTER",
    "ray_address": "BENCHMARK_RAY_ADDRESS",
}
# Where a run reads, writes, trains and reports: set by whoever deploys the benchmark (the
# environment above, MLFLOW_TRACKING_URI), never by a DAG trigger, so a trigger cannot point a
# run, or the credentials it carries, at another machine or folder.
DEPLOYMENT_FIELDS = frozenset({
    "output_root", "dataset_source", "tokenizer_source", "model_source", "spark_master",
    "determined_master", "ddp_rdzv_endpoint", "ddp_nnodes", "ddp_node_rank", "mlflow_tracking_uri",
    "ray_address",
})


def site_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Config overrides from the BENCHMARK_* variables that are set (see SITE_DEFAULT_ENV)."""
    environ = os.environ if environ is None else environ
    return {field: environ[var] for field, var in SITE_DEFAULT_ENV.items() if environ.get(var)}


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "config"
        allowed = ""
        if field.split(".")[0] == "backends":
            allowed = f" (allowed: {', '.join(b.value for b in Backend)})"
        elif e["type"] == "extra_forbidden":
            allowed = f" (known fields: {', '.join(BenchmarkConfig.model_fields)})"
        lines.append(f"{field}: {e['msg']}{allowed}; got {e.get('input')!r}")
    return "invalid benchmark config:\n  " + "\n  ".join(lines)


def load_config(profile: str = "smoke", overrides: dict[str, Any] | None = None) -> BenchmarkConfig:
    """Profile defaults, then $MLFLOW_TRACKING_URI, then overrides (None = keep the default)."""
    if profile not in PROFILES:
        raise ConfigError(f"profile: unknown profile {profile!r} (allowed: {', '.join(PROFILES)})")
    values: dict[str, Any] = {**PROFILES[profile], "profile": profile}
    if os.environ.get("MLFLOW_TRACKING_URI"):  # e.g. the compose stack's MLflow server
        values["mlflow_tracking_uri"] = os.environ["MLFLOW_TRACKING_URI"]
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return BenchmarkConfig(**values)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None


def parse_set_options(pairs: list[str]) -> dict[str, Any]:
    """``["epochs=3", "backends=[\\"ddp\\"]"]`` -> dict; values are JSON if they parse, else str."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r}: expected key=value")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def save_config(config: BenchmarkConfig, path: Path) -> None:
    atomic_write_text(path, config.to_json())


def read_config(path: Path) -> BenchmarkConfig:
    try:
        return BenchmarkConfig.model_validate_json(Path(path).read_text())
    except ValidationError as err:
        raise ConfigError(f"{path}: " + _format_error(err)) from None
