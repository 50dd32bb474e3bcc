"""TensorFlow (``pipelines/platforms/tensorflow/``): its declaration and refusals, then real cells of
Keras on TensorFlow's MultiWorkerMirroredStrategy: 2 ranks on this host beside DDP on the same tokens
(its phases, resources and the report's word that it is a second implementation), a failed attempt
resumed from its checkpoint, and a cell across two emulated hosts at 100 Mbit/s.

Loss tolerance against DDP: the two are different code for the same shape (Keras Hub's BERT vs
transformers', different initial weights from the same seed, different dropout streams), so no
parity of values is possible; what must hold is the recipe: both start near ln 2 (two balanced
classes) and after 2 epochs of 96 reviews their train losses are within ``RECIPE_TOL`` (measured:
see the test's print).
"""

from __future__ import annotations

import json
import math
import os
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines import platforms
from pipelines.cluster import why_unavailable
from pipelines.config import TrainingStrategy, parse_strategy
from pipelines.platforms.tensorflow import adapter as tf_adapter
from pipelines.platforms.tensorflow.worker import tf_config
from pipelines.runfolder.paths import PROJECT_ROOT
from tests.platforms.small_runs import left_in_hosts, small_config, small_run

RECIPE_TOL = 0.15  # train loss, nats; see the module docstring
MB = 10**6
_NO_NETNS = why_unavailable()


_config = partial(small_config, backends=["ddp", "tensorflow"])
_run = partial(small_run, backends=["ddp", "tensorflow"])


# --- without training ------------------------------------------------------------------------------
def test_the_platform_is_named_by_a_run_and_trains_the_default_strategy_only():
    platform = platforms.get("tensorflow")
    assert platform.package == "pipelines.platforms.tensorflow"
    assert "tensorflow" not in platforms.default_names() and "tensorflow" not in platforms.smoke_names()
    backend = tf_adapter.TensorFlowBackend()
    assert backend.strategy_refusal(TrainingStrategy.model_validate(parse_strategy("default")), 2) is None
    for name in ("powersgd-r2", "localsgd-4", "fsdp", "pipeline-4", "async"):
        assert "default strategy only" in backend.strategy_refusal(TrainingStrategy.model_validate(parse_strategy(name)), 2), name
    assert "second implementation" in platform.mode_caveats["multi-worker-mirrored-2-hosts"]


def test_preflight_names_the_requirements_file_when_its_libraries_are_missing(tmp_path, imdb_dir, bert_tiny_dir,
                                                                              monkeypatch):
    backend = tf_adapter.TensorFlowBackend()
    config = _config(tmp_path, imdb_dir, bert_tiny_dir)
    assert tf_adapter.missing_libraries() == [] and backend.preflight(config, [("default", 2)]) == []
    monkeypatch.setattr(tf_adapter.importlib.util, "find_spec", lambda name: None if name == "keras_hub" else 1)
    (reason,) = backend.preflight(config, [("default", 2)])
    assert "keras_hub not installed" in reason and "requirements-tensorflow.txt" in reason


def test_a_rank_is_told_the_cluster_by_tf_config():
    assert tf_config(["10.0.0.1:2222", "10.0.0.2:2222"], 1) == {
        "cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, "task": {"type": "worker", "index": 1}}


# --- real cells ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def beside_ddp(tmp_path_factory, imdb_dir, bert_tiny_dir):
    """One run, a DDP cell and a TensorFlow cell of 2 ranks each, trained once for the module's checks."""
    from pipelines.run.cells import run_cell

    config, paths = _run(tmp_path_factory.mktemp("tf"), "beside", imdb_dir, bert_tiny_dir)
    return SimpleNamespace(config=config, paths=paths, ddp=run_cell(config, paths, "ddp", 2),
                           tf=run_cell(config, paths, "tensorflow", 2))


@pytest.mark.slow
def test_a_cell_of_two_ranks_trains_the_recipe_and_its_phases_add_up(beside_ddp):
    from pipelines.training import phases

    result, ddp = beside_ddp.tf, beside_ddp.ddp
    assert result.status == "ok" and result.world_size == 2, result.error
    assert result.platform_mode == "multi-worker-mirrored" and result.global_batch_size == 32
    assert len(result.epochs) == 2 and result.steps_per_epoch == 96 // 2 // 16
    assert result.versions["tensorflow"].startswith("2.") and result.model_source == "random_init"
    assert result.test is not None and result.test_samples == ddp.test_samples
    assert abs(phases.unattributed(result.phases, result.total_seconds)) <= 0.02 * result.total_seconds
    assert result.phases["compute"] > 0 and result.phases["launch"] > 0
    assert result.resources.ranks == 2, result.resources  # both ranks' pid files: the split by process
    first_tf, first_ddp = result.epochs[0].train_loss, ddp.epochs[0].train_loss
    print(f"\ntrain loss by epoch: tensorflow {[round(e.train_loss, 4) for e in result.epochs]}, "
          f"ddp {[round(e.train_loss, 4) for e in ddp.epochs]}; test accuracy {result.test.accuracy:.3f} vs "
          f"{ddp.test.accuracy:.3f}; total {result.total_seconds:.1f}s vs {ddp.total_seconds:.1f}s")
    assert abs(first_tf - math.log(2)) < RECIPE_TOL and abs(first_ddp - math.log(2)) < RECIPE_TOL
    assert abs(result.epochs[-1].train_loss - ddp.epochs[-1].train_loss) < RECIPE_TOL
    assert Path(result.model_path).exists()


@pytest.mark.slow
def test_the_report_says_it_is_a_second_implementation(beside_ddp):
    from pipelines.evaluation import evaluate_run
    from pipelines.report import build_report

    summary = evaluate_run(beside_ddp.config, beside_ddp.paths)
    assert [a.backend for a in summary.aggregates] == ["ddp", "tensorflow"]
    md = Path(build_report(beside_ddp.config, beside_ddp.paths)["markdown"]).read_text()
    assert "second implementation of the same shape" in md


@pytest.mark.slow
def test_a_failed_attempt_resumes_from_its_checkpoint(beside_ddp, imdb_dir, bert_tiny_dir, monkeypatch):
    """Rank 0 fails at the end of epoch 1 on the first try; the retry reads the checkpoint of epoch 1 on
    every rank and trains epoch 2 only."""
    from pipelines.run import stages
    from pipelines.runfolder.results import CellResult

    monkeypatch.setenv("PIPELINES_EPOCH_END_HOOK", "tests.fault_injection:fail_first_tries")
    monkeypatch.setenv("FAULT_FAIL_TRIES", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
    _, paths = _run(beside_ddp.paths.root.parent, "resumed", imdb_dir, bert_tiny_dir, cell_retries=1)
    stages.train_cell(str(paths.root), "tensorflow", 2)
    cell = paths.cell("tensorflow", 2, 0)
    result = CellResult.read(cell.result)
    assert [a.outcome for a in result.attempts] == ["failed", "ok"] and result.resumed_from_epoch == 1
    assert "fault injection: try 1" in cell.log.read_text() and "resuming from" in cell.log.read_text()
    assert len(result.epochs) == 2
    assert result.epochs[0].train_loss == beside_ddp.tf.epochs[0].train_loss  # the first try's epoch, kept
    assert result.attempts[0].lost_seconds is not None and json.loads(cell.platform_checkpoint.read_text()) == {"epochs": 2}


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_a_cell_across_two_emulated_hosts(tmp_path, imdb_dir, bert_tiny_dir):
    from pipelines.cluster import EmulatedCluster
    from pipelines.run.cells import run_cell

    config, paths = _run(tmp_path, "across", imdb_dir, bert_tiny_dir, epochs=1)
    with EmulatedCluster("tfx", hosts=2, network="100mbit") as cluster:
        result = run_cell(config, paths, "tensorflow", 2, hosts=cluster.hosts)
        left = left_in_hosts(cluster.hosts)
        addresses = [h.address for h in cluster.hosts]
    assert left == {"h0": [], "h1": []}, left
    assert result.status == "ok" and result.platform_mode == "multi-worker-mirrored-2-hosts", result.error
    assert result.placements == [f"h{k} {addresses[k]}" for k in (0, 1)]
    moved = json.loads(paths.cell("tensorflow", 2, 0).link_bytes.read_text())
    for host, counts in moved.items():  # the gradients crossed the link, both ways
        assert counts["tx"] > MB and counts["rx"] > MB, (host, counts)
    # a ring all-reduce of 2: each host sends its half and receives the other's, twice (reduce, then gather)
    assert result.link_bytes_per_train_step >= 0.9 * 2 * result.comm_bytes_per_step, result.link_bytes_per_train_step
    print(f"\ntensorflow across 2 hosts @100mbit: total {result.total_seconds:.1f}s, phases {json.dumps(result.phases)}, "
          f"link bytes per step {result.link_bytes_per_step:.0f} (training steps alone "
          f"{result.link_bytes_per_train_step:.0f}), payload {result.comm_bytes_per_step:.0f}")
