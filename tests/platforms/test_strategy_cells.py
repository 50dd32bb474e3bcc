"""Training strategies through the real backends on the real IMDB copy (tiny): an FSDP2 cell
and a PowerSGD cell at world size 2 on CPU, Determined's up-front refusal, no 1-worker comm
cells, and the weighted sampler raising the minority class's recall on a train sample made
imbalanced on purpose (``class_ratio``). The hooks themselves: tests/training/test_strategies.py.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from pipelines.run.cells import run_cell
from pipelines.platforms.contract import UnsupportedStrategy
from pipelines.config import TrainingStrategy, load_config
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import CellResult

pytestmark = pytest.mark.slow  # most of these train through a backend (the refusals share their fixtures)


# --- through the backends, on the real data -------------------------------------------------------
@pytest.fixture(scope="module")
def strategy_config(bench_config):
    return bench_config.model_copy(update={"worker_counts": [1, 2], "strategies": [
        TrainingStrategy(), TrainingStrategy(comm_hook="powersgd", powersgd_rank=2), TrainingStrategy(sharding="fsdp")]})


def test_fsdp_cell_trains_on_two_cpu_ranks(strategy_config, run_paths):
    result = run_cell(strategy_config, run_paths, "ddp", 2, 0, strategy="fsdp")
    assert result.status == "ok" and result.strategy == "fsdp" and result.sharding == "fsdp"
    assert run_paths.cell("ddp", 2, 0, "fsdp").root.name == "ddp-fsdp-w2-r0"
    assert len(result.epochs) == strategy_config.training.epochs and result.test.accuracy > 0
    # checkpoint and export hold the full (unsharded) model: it loads like any other
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(result.model_path)
    assert model.bert.embeddings.word_embeddings.weight.shape[0] > 1000
    from pipelines.training.checkpoint import load_checkpoint

    state = load_checkpoint(Path(result.checkpoint_path))
    assert state["model"]["bert.embeddings.word_embeddings.weight"].shape == \
        model.bert.embeddings.word_embeddings.weight.shape


def test_powersgd_cell_records_strategy_and_bytes(strategy_config, run_paths):
    result = run_cell(strategy_config, run_paths, "ddp", 2, 0, strategy="powersgd-r2")
    on_disk = CellResult.read(run_paths.cell("ddp", 2, 0, "powersgd-r2").result)
    assert on_disk.strategy == "powersgd-r2" and on_disk.comm_hook == "powersgd" and on_disk.powersgd_rank == 2
    assert result.status == "ok" and all(e.train_loss == e.train_loss for e in result.epochs)
    params = sum(p.numel() for p in _bert(result).parameters())
    assert 0 < result.comm_bytes_per_step < params * 4  # far below the fp32 all-reduce of every gradient


def _bert(result: CellResult) -> torch.nn.Module:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(result.model_path)


def test_determined_refuses_comm_strategies_before_the_cell_starts(strategy_config, run_paths):
    with pytest.raises(UnsupportedStrategy, match="powersgd-r2.*determined.*own DistributedDataParallel"):
        run_cell(strategy_config, run_paths, "determined", 2, 0, strategy="powersgd-r2")
    cell = run_paths.cell("determined", 2, 0, "powersgd-r2")
    assert not cell.spec.exists()  # nothing was launched
    failed = CellResult.read(cell.result)
    assert failed.status == "failed" and "cannot run there" in failed.error and failed.strategy == "powersgd-r2"
    # ... and the whole run is refused up front by the pre-flight check
    from pipelines.run.cells import preflight_problems

    both = strategy_config.model_copy(update={"backends": ["ddp", "determined"]})
    assert any("determined" in r for r in preflight_problems(both))
    assert preflight_problems(both, [("ddp", "powersgd-r2", 2)]) == []  # one cell: only its own platform


def test_determined_runs_the_imbalance_strategies(strategy_config, run_paths):
    config = strategy_config.model_copy(update={"strategies": [TrainingStrategy(imbalance="weighted_loss")]})
    result = run_cell(config, run_paths, "determined", 1, 0, strategy="weighted_loss")
    assert result.status == "ok" and result.strategy == "weighted_loss" and result.imbalance == "weighted_loss"
    assert run_paths.cell("determined", 1, 0, "weighted_loss").result.exists() and result.test.accuracy > 0


def test_comm_strategies_have_no_one_worker_cell(strategy_config, run_paths):
    assert ("powersgd-r2", 1) in strategy_config.not_applicable_cells()
    assert all(not (s != "default" and n == 1) for _, s, _, n, _ in strategy_config.cells())
    with pytest.raises(UnsupportedStrategy, match="1 worker: not applicable"):
        run_cell(strategy_config, run_paths, "ddp", 1, 0, strategy="fsdp")


# --- imbalance ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def imbalanced_run(tmp_path_factory, imdb_dir, bert_tiny_dir):
    """The real ingest with class_ratio=0.25 (train: 80 % negative), tokenized with the Spark job's
    tokenize_frame (no Spark needed here); test stays balanced. BERT-tiny from random init needs
    ~2k reviews to learn anything (smaller samples stay at chance, whatever the sampler); 2
    epochs, before the oversampled minority rows are memorised (measured: minority recall 0.15
    plain, 0.35 weighted sampler; at 4 epochs both ~0.2)."""
    from pipelines.data.ingest import ingest
    from pipelines.data.tokens import tokenize_frame

    root = tmp_path_factory.mktemp("imbalanced")
    config = load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
        output_root=str(root), train_samples=2000, test_samples=200, max_seq_len=64, epochs=2, batch_size=16,
        learning_rate=1e-3, class_ratio=0.25, worker_counts=[1], backends=["ddp"],
        strategies=["default", "weighted_sampler", "weighted_loss"]))
    paths = RunPaths(root / "run")
    manifest = ingest(config, paths)
    for split in ("train", "validation", "test"):
        frame = pd.read_parquet(paths.snapshot_split(split))
        paths.token_split(split).mkdir(parents=True)
        tokenize_frame(frame, str(bert_tiny_dir), config.data.max_seq_len).to_parquet(
            paths.token_split(split) / "part-00000.parquet")
    return config, paths, manifest


def test_class_ratio_builds_an_imbalanced_train_sample(imbalanced_run):
    config, paths, manifest = imbalanced_run
    train, test = manifest["splits"]["train"]["rows_per_label"], manifest["splits"]["test"]["rows_per_label"]
    assert train["1"] / train["0"] == pytest.approx(0.25, abs=0.02) and manifest["class_ratio"] == 0.25
    assert test["0"] == test["1"] == 100  # test stays stratified: per-class recall is measurable
    from pipelines.data.validate import class_share_bound

    # the train balance bound follows the ratio; test keeps min_class_fraction
    assert class_share_bound(config, 2, "train") == pytest.approx(0.9 * 0.25 / 1.25)
    assert class_share_bound(config, 2, "test") == config.data.min_class_fraction
    # the data contract (GX) passes the intended imbalance; without class_ratio it says how to allow it
    from pipelines.data.validate import DataValidationError, validate_snapshot

    assert validate_snapshot(config, paths)["success"]
    with pytest.raises(DataValidationError, match="train_classes.*set class_ratio"):
        validate_snapshot(config.model_copy(update={"class_ratio": None}), paths)


@pytest.mark.heavy  # ~2 min of learning; CI: the strategy cells train and record (test_determined_runs_the_imbalance_strategies)
def test_weighted_sampler_raises_minority_recall(imbalanced_run):
    config, paths, _ = imbalanced_run
    plain = run_cell(config, paths, "ddp", 1, 0, strategy="default")
    weighted = run_cell(config, paths, "ddp", 1, 0, strategy="weighted_sampler")
    recall = {name: [c.recall for c in r.test.per_class] for name, r in
              (("plain", plain), ("weighted", weighted))}
    print("per-class test recall:", recall)
    assert weighted.imbalance == "weighted_sampler" and paths.cell("ddp", 1, 0, "weighted_sampler").result.exists()
    assert recall["weighted"][1] > recall["plain"][1] + 0.1, recall  # the minority class (label 1)
