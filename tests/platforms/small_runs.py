"""Small 2-worker runs of a platform beside DDP, shared by the platforms' own test modules: token
shards of a stratified slice of the real IMDB copy (48 + 24 reviews per class, 32 tokens), the
smoke profile at 2 epochs of batch 16, and what a cell across emulated hosts may leave behind."""

from __future__ import annotations

from pathlib import Path

from pipelines.config import load_config, save_config
from pipelines.runfolder.paths import RunPaths
from tests.token_shards import write_token_shards


def small_config(root: Path, imdb_dir: Path, bert_tiny_dir: Path, *, backends: list[str], **update):
    return load_config("smoke", {
        "dataset_source": str(imdb_dir), "tokenizer_source": str(bert_tiny_dir), "model_source": str(bert_tiny_dir),
        "output_root": str(root), "max_seq_len": 32, "epochs": 2, "batch_size": 16, "batch_policy": "per_worker",
        "learning_rate": 5e-4, "seed": 42, "backends": backends, "worker_counts": [2], **update})


def small_run(root: Path, name: str, imdb_dir: Path, bert_tiny_dir: Path, *, backends: list[str], **update):
    """(config, run paths) of a run folder ``root/name`` with its token shards and config written."""
    paths = write_token_shards(RunPaths(root / name), imdb_dir, bert_tiny_dir, train_per_class=48,
                               test_per_class=24, seq_len=32, seed=3)
    config = small_config(root, imdb_dir, bert_tiny_dir, backends=backends, **update)
    save_config(config, paths.config)
    return config, paths


def left_in_hosts(hosts) -> dict[str, list[int]]:
    """Each emulated host's processes still in its network namespace or cgroups (a finished cell: none)."""
    from pipelines.cluster.leftovers import _cgroup_pids, _netns_pids

    return {h.name: _netns_pids(h.netns) + [p for cg in h.cgroups for p in _cgroup_pids(cg)] for h in hosts}
