"""Cheap checks before expensive stages, so a doomed run fails in seconds, not after the data stage.

    problems = preflight.problems(config)                 # [] when the run can start
    preflight.check(config, cells=[(backend, "default", 2)])  # only the cell a `train` trains

Checks: worker counts, what each platform checks for its cells (``TrainingBackend.preflight``:
the strategies it can run, a cluster with executors for a feed that needs one), that the tokenizer
and the model's config load from their sources, that the output root is writable, and that its disk
has room for an estimate of what the run writes (snapshot, token shards, two checkpoints and a model
per cell). Called by the CLI
before the data stage and by the DAG's prepare_run before the run folder exists.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pipelines.config import BenchmarkConfig, ConfigError

CHECKPOINT_MB = 55.0  # BERT-tiny weights + AdamW state, as written (measured: ~52 MB)
MODEL_MB = 18.0  # the exported Hugging Face model per cell
BYTES_PER_TOKEN = 5  # int32 id + int8 mask
SOURCE_ROWS = 50_000  # IMDB's train + test when no sample size is given


def estimate_mb(config: BenchmarkConfig) -> float:
    rows = (config.data.train_samples or SOURCE_ROWS // 2) + (config.data.test_samples or SOURCE_ROWS // 2)
    snapshot = rows * 1.4e-3  # ~1.3 KB of text per review (parquet, compressed)
    tokens = rows * config.data.max_seq_len * BYTES_PER_TOKEN / 2**20
    cells = len(config.cells())
    return snapshot + tokens + cells * (2 * CHECKPOINT_MB + MODEL_MB)


def problems(config: BenchmarkConfig, cells: list[tuple[str, str, int]] | None = None) -> list[str]:
    """Every reason the run (or only ``cells``: (backend, strategy, workers)) cannot start."""
    out = [f"workers: {n} is not a worker count (>= 1)" for _, _, n in cells or [] if n < 1]
    out += _cluster_problems(config)
    if not out:
        from pipelines.run.cells import preflight_problems

        out += preflight_problems(config, cells)  # e.g. powersgd on determined: refused before any work
    out += trusted_network_problems(config, cells)  # torch.distributed's ports on a real network
    try:
        from pipelines.data.tokens import load_tokenizer

        load_tokenizer(config.data.tokenizer_source)
    except OSError as err:
        out.append(str(err))
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(config.training.model_source)
    except (OSError, ValueError) as err:
        out.append(f"model_source={config.training.model_source!r}: no model config can be loaded from it ({err}); "
                   "give a reachable/cached hub id or a folder with config.json (weights optional)")
    root = Path(config.tracking.output_root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".write-check-"):
            pass
    except OSError as err:
        out.append(f"output_root={str(root)!r} is not writable ({err})")
    else:
        free_mb = shutil.disk_usage(root).free / 2**20
        need = estimate_mb(config)
        if free_mb < need:
            out.append(f"output_root={str(root)!r}: {free_mb:.0f} MB free, the run needs about {need:.0f} MB "
                       "(snapshot, token shards, checkpoints and models); free space or point it elsewhere")
    return out


def check(config: BenchmarkConfig, cells: list[tuple[str, str, int]] | None = None) -> None:
    found = problems(config, cells)
    if found:
        raise ConfigError("the run cannot start:\n  " + "\n  ".join(found))


def _cluster_problems(config: BenchmarkConfig) -> list[str]:
    """The cluster the run asks for: can it be built here, can it place every worker count."""
    if config.matrix.fault != "none" and config.cluster.kind != "emulated":
        return [f"matrix.fault={config.matrix.fault} acts on a host through its cgroups and its link: it needs an "
                "emulated cluster (cluster.kind=emulated, e.g. the cluster profile)"]
    if config.cluster.kind == "local":
        return _isolation_problems(config)
    from pipelines.cluster import why_unavailable
    from pipelines.cluster.lifecycle import worker_count_problems

    out = worker_count_problems(config)
    if config.cluster.kind == "ssh":
        from pipelines import platforms

        out += [f"cluster.kind=ssh: {b} is refused: {platforms.get(b).ssh_refusal}"
                for b in config.matrix.backends if platforms.get(b).ssh_refusal]
    if config.cluster.kind == "emulated" and (reason := why_unavailable()):
        out.append(f"cluster.kind=emulated: no emulated cluster can be built on this machine: {reason}")
    return out


def _isolation_problems(config: BenchmarkConfig) -> list[str]:
    """One-host cells need loopback-only network namespaces (``pipelines.cluster.netns``): a cell's
    own, and the run's for the clusters it keeps standing here. Where this host cannot make them,
    their ports would listen on every interface: refused, unless ``cluster.allow_unisolated_cells``."""
    from pipelines.cluster import netns

    if config.cluster.allow_unisolated_cells:
        return []
    why = netns.own_problem()
    if why is None and _uses_a_standing_cluster_here(config):
        why = netns.run_problem()
    if why is None:
        return []
    from pipelines import platforms

    labels = ", ".join(dict.fromkeys(platforms.get(b).label or str(b) for b in config.matrix.backends))
    return [f"cluster.kind=local: this host cannot give the run's cells and clusters a loopback-only network "
            f"namespace ({why}); without one, torch's rendezvous store and what the run's platforms ({labels}) "
            "start (a cluster's control services, a local chief) listen on every interface of this host. Run as "
            "root, allow user namespaces (sysctl kernel.unprivileged_userns_clone=1; in a container, a seccomp profile that allows "
            "unshare and setns), or set cluster.allow_unisolated_cells=true (BENCHMARK_ALLOW_UNISOLATED_CELLS=1) "
            "to run them exposed"]


def _uses_a_standing_cluster_here(config: BenchmarkConfig) -> bool:
    """Does the run keep a cluster standing on this host: a service started at setup, or one a
    standing platform of its matrix uses (``pipelines.run.services``)?"""
    from pipelines import platforms
    from pipelines.run import services

    found = services.declared()
    used = {t for b in config.matrix.backends if platforms.get(b).lifetime == "standing" for t in platforms.get(b).services}
    return any(service.at_setup(config) or (target in used and service.wanted(config))
               for target, service in found.items())


# --- cluster.trusted_network -----------------------------------------------------------------
_UNTRUSTED = ("torch.distributed has no authentication: its rendezvous store and gloo / NCCL ports listen "
              "there, and any machine that can reach them can join the cell or send its ranks data. Set "
              "cluster.trusted_network=true (BENCHMARK_TRUSTED_NETWORK=true) to state that every machine on "
              "that network is trusted (README \"Trusted network\"), or run the cells on this host or on "
              "emulated hosts (cluster.kind=local or emulated), which never leave this machine")


def trusted_network_problems(config: BenchmarkConfig,
                             cells: list[tuple[str, str, int]] | None = None) -> list[str]:
    """Cells whose ranks would meet over a real network, refused unless ``cluster.trusted_network``:
    every cell on ``ssh`` hosts (even one machine's store listens on its address), and on this host
    a platform setting that sends the ranks to other machines (a cluster URL, a rendezvous
    endpoint). Emulated hosts and loopback addresses stay on this machine."""
    if config.cluster.trusted_network:
        return []
    from pipelines import platforms

    backends = sorted({b for b, _, _ in cells} if cells else set(config.matrix.backends))
    if config.cluster.kind == "ssh":
        return [f"cluster.trusted_network is not set: cluster.kind=ssh runs {', '.join(backends)} with "
                f"ranks on {', '.join(config.cluster.ssh_hosts)}, meeting over those machines' network; "
                f"{_UNTRUSTED}"]
    if config.cluster.kind != "local":
        return []
    found = [(b, setting) for b in backends if (setting := _remote_setting(config, platforms.get(b)))]
    return [f"cluster.trusted_network is not set: {b} with {setting} has its ranks meet on other machines "
            f"over the network; {_UNTRUSTED}" for b, setting in found]


def _remote_setting(config: BenchmarkConfig, platform) -> str | None:
    """``field=value`` of the setting that sends a one-host run's cells of ``platform`` to other
    machines (the platform's ``remote_ranks``), or None. A per-job platform starts its own cluster
    here: none."""
    if platform.lifetime == "per_job" or platform.remote_ranks is None:
        return None
    setting = platform.remote_ranks(config)
    return setting if setting and not _on_loopback(setting.partition("=")[2]) else None


def _on_loopback(address: str) -> bool:
    """Does ``[scheme://]host[:port][/path]`` name this machine's loopback (127.0.0.0/8, [::1], localhost)?"""
    import ipaddress

    host = address.partition("://")[2] or address
    host = host.split("/", 1)[0]
    host = host[1:].partition("]")[0] if host.startswith("[") else host.rpartition(":")[0] or host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
