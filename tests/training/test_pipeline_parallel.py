"""Pipeline parallelism (``pipeline-<microbatches>``, pipelines/training/pipeline.py and
pipeline_stages.py): the model's layers split over two gloo ranks, against plain DDP on the same rows.

Without processes: the short name round-trips and the bad combinations are refused with the field
named (config, platforms, preflight); the hand-built stages compute exactly the whole model; the
global batch is DDP's rows.

On two gloo ranks (``mp.spawn``, the harness of tests/training/test_strategy_parity.py: the loop's
own pieces in the loop's order, ``steps.train_step`` as the loop calls it): DDP and ``pipeline-4``
from the same seeded model on the same 64 reviews (seq 32, 8 rows per DDP rank and step: global
batch 16, 4 microbatches of 4 rows), 48 optimizer steps, then

- the loss over every train row (the parity tests' measure), within ``PIPELINE_TOL`` of DDP's, and,
  with dropout off in both, within ``NO_DROPOUT_TOL`` (the same sums in another order);
- the bytes per step counted on the P2P operations = the shapes': 16 rows x 32 tokens x (128
  hidden x 4 bytes, forward and back, + the int64 mask forward);
- the checkpoint state as one process has it (DDP's keys, ids and shapes; loads into a
  one-process AdamW), a resume's split of it back into the stages, and the final model assembled on
  rank 0 giving the pipeline's own evaluation loss.

A real cell through the ddp platform (torchrun, the shared loop: evaluation, checkpoints, the
final test and export) closes it.

Measured on this 2-core host with this harness (seeds 0-14; the fixture runs seed 0), pipeline minus
DDP in the loss after the 48 steps:

- with dropout (DDP 0.0031-0.066 from ~0.693): seeds 0-4 -5.2e-3, +7.1e-4, +2.4e-4, -2.8e-3, +3.0e-3;
  seeds 5-14 -3.6e-5, -2.9e-3, -2.0e-3, +5.5e-3, +5.2e-4, -7.1e-3, +7.5e-3, +1.01e-2, -1.3e-4, +6.8e-4
  (worst 0.0101). Each stage draws its dropout masks on its own rank, so the masks are not DDP's and
  the trajectories part a little. ``PIPELINE_TOL`` = 0.03: 3x the worst of 15 seeds, within the
  tolerances tests/training/test_strategy_parity.py gives the strategies that change the
  trajectory (PowerSGD 0.2, local SGD 0.3), and under a twentieth of DDP's smallest drop;
- without dropout: bit-identical at 7 of the 15 seeds, else within 7.5e-6 (seed 8; the others under
  2e-6): the same arithmetic, but the global mean of 4-row microbatch means where DDP averages two
  8-row means, floats summed in another order. ``NO_DROPOUT_TOL`` = 1e-4: a pipeline that dropped a
  microbatch, scaled the gradients wrongly or trained other rows is off by far more.

The fixture trains the four runs in ~12 s here, the ranks' start-up included; the cell, twice, ~12 s.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipelines.config import STRATEGY_PATTERN, TrainingStrategy, parse_strategy
from tests.training.test_strategy_parity import _free_port, _train_loss  # the same two-rank harness

WORLD = 2
SEQ_LEN, TRAIN_PER_CLASS, BATCH = 32, 32, 8  # 64 rows; global batch 16, 4 steps an epoch
EPOCHS, LEARNING_RATE, MICROBATCHES = 12, 2e-3, 4
HIDDEN = 128  # BERT-tiny
PIPELINE_TOL, NO_DROPOUT_TOL = 0.03, 1e-4  # see the module docstring for the measured differences
MIN_DROP = 0.5


# --- the name and the refusals (no processes) ----------------------------------------------------
def test_the_short_name_round_trips_and_is_recorded():
    import re

    from pipelines.runfolder.results import CellResult

    for name in ("pipeline-4", "pipeline-1", "pipeline-4+weighted_loss"):
        strategy = TrainingStrategy(**parse_strategy(name))
        assert strategy.name == name and re.match(STRATEGY_PATTERN, name)
        assert TrainingStrategy(**parse_strategy(strategy.name)) == strategy
    strategy = TrainingStrategy(**parse_strategy("pipeline-4"))
    assert strategy.pipeline_microbatches == 4 and strategy.needs_process_group and not strategy.is_default
    fields = strategy.result_fields()
    assert fields["pipeline_microbatches"] == 4
    result = CellResult(backend="ddp", world_size=2, **fields)
    assert result.pipeline_microbatches == 4 and CellResult(backend="ddp", world_size=2).pipeline_microbatches == 0


@pytest.mark.parametrize("name", ["pipeline-4+fsdp", "pipeline-4+fp16", "pipeline-4+powersgd-r2", "pipeline-4+localsgd-4"])
def test_a_pipeline_with_sharding_a_hook_or_local_sgd_is_refused_with_the_field_named(name):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="pipeline_microbatches > 0 takes no sharding=fsdp, no comm_hook"):
        TrainingStrategy(**parse_strategy(name))


def test_pipeline_refusals_name_the_field_and_the_numbers():
    with pytest.raises(ValueError, match="pipeline-<microbatches> \\(at least 1\\)"):
        parse_strategy("pipeline-0")
    s = TrainingStrategy(pipeline_microbatches=4)
    assert "one worker has nothing to split" in s.pipeline_refusal(1)
    assert "4 stages, and the model has 2 encoder layers" in s.pipeline_refusal(4, layers=2)
    assert "pipeline_microbatches=4 does not split the global batch of 6 rows" in s.pipeline_refusal(2, 6)
    assert s.pipeline_refusal(2, 16, layers=2) is None and s.pipeline_refusal(4, 16) is None  # layers unknown
    assert TrainingStrategy().pipeline_refusal(1, 3, layers=1) is None


def test_platforms_that_cannot_split_the_model_refuse_it():
    from pipelines.platforms.deepspeed.adapter import DeepSpeedBackend
    from pipelines.platforms.determined.adapter import DeterminedBackend
    from pipelines.platforms.spark.dataframe import SparkDataFrameBackend

    s = TrainingStrategy(pipeline_microbatches=4)
    assert "pipeline_microbatches=4 cannot run there" in DeterminedBackend().strategy_refusal(s, 2)
    assert "deepspeed.pipe, is not wired in" in DeepSpeedBackend().strategy_refusal(s, 2)
    assert "dataframe feed gives each rank its own partition" in SparkDataFrameBackend().strategy_refusal(s, 2)


def test_preflight_refuses_more_workers_than_layers_and_an_indivisible_batch(tmp_path, imdb_dir, bert_tiny_dir):
    from pipelines.config import load_config
    from pipelines.run.cells import preflight_problems

    def config(**overrides):
        return load_config("smoke", dict(dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir),
                                         model_source=str(bert_tiny_dir), output_root=str(tmp_path),
                                         backends=["ddp"], batch_policy="per_worker", **overrides))

    ok = config(worker_counts=[1, 2], batch_size=8, strategies=["default", "pipeline-4"])
    assert preflight_problems(ok) == [] and ("pipeline-4", 1) in ok.not_applicable_cells()
    four = config(worker_counts=[2, 4], batch_size=8, strategies=["pipeline-4"])
    assert [p for p in preflight_problems(four) if "4 stages, and the model has 2 encoder layers" in p]
    odd = config(worker_counts=[2], batch_size=3, strategies=["pipeline-4"])
    assert any("global batch of 6 rows" in p for p in preflight_problems(odd))


# --- the stages and the rows (no processes) ------------------------------------------------------
def test_the_stages_compute_exactly_the_whole_model(bert_tiny_dir):
    import copy

    from pipelines.training.model import build_model
    from pipelines.training.pipeline_stages import split_model, stage_layers

    model, _ = build_model(str(bert_tiny_dir), 0, 2)
    model.eval()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 30000, (6, SEQ_LEN), generator=generator)
    mask = torch.ones(6, SEQ_LEN, dtype=torch.int64)
    mask[1:, 20:] = 0  # padding in all rows but the first
    first, last = copy.deepcopy(model), copy.deepcopy(model)
    stage0, stage1 = split_model(first, 0, 2), split_model(last, 1, 2)
    with torch.no_grad():
        hidden, sent_mask = stage0(ids, mask)
        assert hidden.shape == (6, SEQ_LEN, HIDDEN) and sent_mask is mask
        assert torch.equal(stage1(hidden, sent_mask), model(input_ids=ids, attention_mask=mask).logits)
    keys0, keys1 = set(first.state_dict()), set(last.state_dict())
    assert not keys0 & keys1 and keys0 | keys1 == set(model.state_dict())  # the stages hold the model once
    assert "bert.embeddings.word_embeddings.weight" in keys0 and "classifier.weight" in keys1
    assert stage_layers(2, 2) == [range(0, 1), range(1, 2)] and stage_layers(5, 2) == [range(0, 2), range(2, 5)]
    with pytest.raises(ValueError, match="3 stages of 2 encoder layers"):
        split_model(copy.deepcopy(model), 0, 3)


def test_the_global_batch_is_every_ddp_ranks_batch_of_the_step():
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from pipelines.training.pipeline import GlobalBatchSampler

    data = TensorDataset(torch.arange(21))  # 21 rows: padded to 22, 11 a rank, batches of 4, 4, 3
    samplers = [DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=5) for r in range(2)]
    pipelined = DataLoader(data, batch_size=8, sampler=GlobalBatchSampler(samplers, 4))
    per_rank = [DataLoader(data, batch_size=4, sampler=s) for s in samplers]
    for epoch in (0, 1):
        pipelined.sampler.set_epoch(epoch)
        expected = [torch.cat([a[0], b[0]]) for a, b in zip(*per_rank)]
        got = [batch[0] for batch in pipelined]
        assert len(got) == len(pipelined) == 3 and all(torch.equal(g, e) for g, e in zip(got, expected))
    assert len(pipelined.sampler) == 22  # every rank's rows: the loop's samples per epoch


def test_runtime_for_picks_the_pipeline_and_refuses_one_worker():
    from pipelines.training.distributed import DistEnv, TorchDistributed
    from pipelines.training.pipeline import Pipelined
    from pipelines.training.pipeline_stages import microbatches_for
    from pipelines.training.runtime import runtime_for

    strategy = TrainingStrategy(pipeline_microbatches=4)
    runtime = runtime_for(strategy, TorchDistributed(), DistEnv(0, 2, 0, torch.device("cpu")), list)
    assert type(runtime) is Pipelined and runtime.eval_batches(rows=33, batch_size=4) == 5
    with pytest.raises(ValueError, match="at least 2 workers; this cell has 1"):
        runtime_for(strategy, TorchDistributed(), DistEnv(0, 1, 0, torch.device("cpu")), list)
    assert [microbatches_for(rows, 4) for rows in (16, 12, 6, 5, 2)] == [4, 4, 3, 1, 2]  # an epoch's last batch


def test_the_report_says_which_cells_split_the_model():
    from pipelines.report.tables import model_split_lines, splits_model
    from pipelines.runfolder.summary import Aggregate

    config = _report_config()
    assert splits_model(config, "pipeline-4") and not splits_model(config, "default")
    assert splits_model(config, "pipeline-8+weighted_loss")  # an older run's name
    summary = type("Summary", (), {"aggregates": [_aggregate(Aggregate, "default"), _aggregate(Aggregate, "pipeline-4")]})
    line = model_split_lines(summary, config)[-1]
    assert line.startswith("Split the model (pipeline parallelism") and "ddp pipeline-4 at 2 workers" in line
    assert model_split_lines(type("Summary", (), {"aggregates": [_aggregate(Aggregate, "default")]}), config) == []


def _report_config():
    from pipelines.config import load_config

    return load_config("smoke", dict(strategies=["default", "pipeline-4"]))


def _aggregate(cls, strategy):
    return cls.model_construct(backend="ddp", strategy=strategy, workers=2)


# --- two gloo ranks against DDP ------------------------------------------------------------------
def _structure(model_state: dict, optimizer_state: dict) -> dict:
    """What a checkpoint looks like: model keys and shapes, optimizer ids, groups and state shapes."""
    return {"model": {k: list(v.shape) for k, v in model_state.items()},
            "groups": [g["params"] for g in optimizer_state["param_groups"]],
            "state": {str(i): {k: list(v.shape) for k, v in s.items()} for i, s in optimizer_state["state"].items()}}


def _build(cfg, dropout: bool):
    from pipelines.training.model import build_model

    model, _ = build_model(cfg.training.model_source, cfg.training.seed, 2)
    if not dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return model


def _train(cfg, name: str, dropout: bool, train_set, env, scratch: Path) -> dict:
    from functools import partial

    from pipelines.training.distributed import TorchDistributed
    from pipelines.training.engine import TorchEngine
    from pipelines.training.record import TrainingRecord
    from pipelines.training.steps import build_optimizer, eval_loader, evaluate, train_loader, train_step

    start = time.perf_counter()
    strategy = TrainingStrategy(**parse_strategy(name))
    runtime = TorchDistributed().runtime(strategy, env, lambda: [TRAIN_PER_CLASS, TRAIN_PER_CLASS])
    loader = runtime.prepare_loader(train_loader(train_set, cfg, env))
    model = _build(cfg, dropout)
    runtime.shard(model)
    optimizer, scheduler = build_optimizer(model, cfg, len(loader) * EPOCHS)
    torch.manual_seed(cfg.training.seed + env.rank)  # the loop's dropout stream
    wrapped = runtime.wrap(model, steps_done=0)
    engine = TorchEngine()
    wrapped = engine.attach(model, wrapped, optimizer, scheduler, runtime)
    initial = _train_loss(wrapped, runtime, train_set, env)
    wrapped.train()
    record = TrainingRecord(samples_per_epoch=runtime.samples_per_epoch(loader))
    train_losses = []
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            loss, logits, labels = train_step(engine, wrapped, batch, env.device, runtime.loss_weights,
                                              partial(runtime.after_step, record))
            train_losses.append(loss.item())
        runtime.at_epoch_end(record)
    loss = _train_loss(wrapped, runtime, train_set, env)
    seconds = time.perf_counter() - start
    model_state, optimizer_state = runtime.checkpoint_state(model, optimizer)
    out = {"initial": initial, "loss": loss, "runtime": type(runtime).__name__, "seconds": seconds,
           "bytes_per_step": runtime.comm_bytes_per_step, "samples_per_epoch": runtime.samples_per_epoch(loader),
           "steps": len(train_losses), "last_train_loss": train_losses[-1], "batch_rows": logits.shape[0]}
    if env.is_main:
        out["structure"] = _structure(model_state, optimizer_state)
    if type(runtime).__name__ != "Pipelined":
        return out
    # the checkpoint loads like DDP's: into one process's model and AdamW
    if env.is_main:
        whole = _build(cfg, dropout)
        whole.load_state_dict(model_state)
        one, _ = build_optimizer(whole, cfg, 1)
        one.load_state_dict(optimizer_state)
        torch.save({"model": model_state, "optimizer": optimizer_state}, scratch / "checkpoint.pt")
    dist.barrier()
    # a resume splits it back: every rank loads the file, prunes, loads its part of AdamW's state
    state = torch.load(scratch / "checkpoint.pt", weights_only=True)
    resumed = TorchDistributed().runtime(strategy, env, list)
    again = _build(cfg, dropout)
    again.load_state_dict(state["model"])
    resumed.shard(again)
    optimizer2, _ = build_optimizer(again, cfg, 1)
    resumed.load_optimizer_state(again, optimizer2, state["optimizer"])
    mine, theirs = optimizer.state_dict()["state"], optimizer2.state_dict()["state"]
    out["resume_equal"] = bool(mine.keys() == theirs.keys() and all(
        torch.equal(mine[i][k], theirs[i][k]) for i in mine for k in mine[i])) and all(
        torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    # the final model, whole on rank 0, evaluates as the pipeline did
    final = runtime.final_model(model, lambda: _build(cfg, dropout))
    if env.is_main:
        loss_sum, _, count, _, _ = evaluate(final, eval_loader(train_set, BATCH), env.device)
        out["final_model_loss"] = loss_sum / count
    return out


def _rank_main(rank: int, world: int, port: int, job_json: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from pipelines.config import BenchmarkConfig
        from pipelines.runfolder.paths import RunPaths
        from pipelines.training.distributed import DistEnv
        from pipelines.training.steps import load_split

        job = json.loads(job_json)
        cfg = BenchmarkConfig.model_validate_json(job["config"])
        train_set = load_split(RunPaths(Path(job["run"])), "train")
        env = DistEnv(rank, world, rank, torch.device("cpu"))
        out = {}
        for name, dropout in job["runs"]:
            scratch = Path(out_dir, f"{name}-{dropout}")
            scratch.mkdir(exist_ok=True)
            out[f"{name}/{'dropout' if dropout else 'no-dropout'}"] = _train(cfg, name, dropout, train_set, env, scratch)
        if rank == 0:
            Path(out_dir, "results.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def against_ddp(tmp_path_factory, imdb_dir, bert_tiny_dir):
    """DDP and pipeline-4 on the same rows, with and without dropout: ``{"<name>/<dropout>": {...}}``."""
    from pipelines.config import load_config
    from pipelines.runfolder.paths import RunPaths
    from tests.token_shards import write_token_shards

    root = tmp_path_factory.mktemp("pipeline")
    paths = write_token_shards(RunPaths(root / "run"), imdb_dir, bert_tiny_dir, train_per_class=TRAIN_PER_CLASS,
                               test_per_class=4, seq_len=SEQ_LEN, seed=7, validation_per_class=4)
    config = load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
        output_root=str(root), max_seq_len=SEQ_LEN, batch_size=BATCH, batch_policy="per_worker",
        learning_rate=LEARNING_RATE, seed=0, strategies=["default"]))
    out = root / "out"
    out.mkdir()
    runs = [("default", True), (f"pipeline-{MICROBATCHES}", True), ("default", False), (f"pipeline-{MICROBATCHES}", False)]
    job = json.dumps({"config": config.model_dump_json(), "run": str(paths.root), "runs": runs})
    mp.spawn(_rank_main, args=(WORLD, _free_port(), job, str(out)), nprocs=WORLD)
    results = json.loads((out / "results.json").read_text())
    for key, run in results.items():  # the figures of the report (pytest -s)
        ddp = results[f"default/{key.split('/')[1]}"]
        print(f"\n{key:24s}: loss {run['initial']:.4f} -> {run['loss']:.6f} (DDP {ddp['loss']:.6f}, "
              f"{run['loss'] - ddp['loss']:+.2e}); bytes/step {run['bytes_per_step']}; {run['seconds']:.1f} s")
    return results


@pytest.mark.slow  # two gloo ranks train BERT-tiny 48 steps, 4 times
def test_pipeline_trains_like_ddp(against_ddp):
    for dropout, tolerance in (("dropout", PIPELINE_TOL), ("no-dropout", NO_DROPOUT_TOL)):
        ddp, pipe = against_ddp[f"default/{dropout}"], against_ddp[f"pipeline-{MICROBATCHES}/{dropout}"]
        assert (ddp["runtime"], pipe["runtime"]) == ("Replicated", "Pipelined")
        assert pipe["initial"] == pytest.approx(ddp["initial"], abs=1e-6)  # the same start, evaluated in stages
        assert ddp["initial"] - ddp["loss"] > MIN_DROP, ddp  # DDP learned: the comparison says something
        assert pipe["loss"] == pytest.approx(ddp["loss"], abs=tolerance, rel=0), (dropout, pipe, ddp)
        # the same rows: the same steps, the same rows a step and an epoch
        assert pipe["steps"] == ddp["steps"] == EPOCHS * 4 and pipe["batch_rows"] == WORLD * BATCH
        assert pipe["samples_per_epoch"] == ddp["samples_per_epoch"] == 2 * TRAIN_PER_CLASS


@pytest.mark.slow
def test_pipeline_bytes_per_step_are_the_activations_shapes(against_ddp):
    pipe, ddp = against_ddp[f"pipeline-{MICROBATCHES}/dropout"], against_ddp["default/dropout"]
    rows = WORLD * BATCH  # every step's global batch, in 4 microbatches
    activations, mask = rows * SEQ_LEN * HIDDEN * 4, rows * SEQ_LEN * 8  # float32 states, int64 mask
    assert pipe["bytes_per_step"] == 2 * activations + mask  # forward and their gradients back; mask forward
    assert pipe["bytes_per_step"] < ddp["bytes_per_step"] / 30  # DDP all-reduces every fp32 gradient


@pytest.mark.slow
def test_pipeline_checkpoints_and_final_model_are_one_processes(against_ddp):
    pipe, ddp = against_ddp[f"pipeline-{MICROBATCHES}/dropout"], against_ddp["default/dropout"]
    assert pipe["structure"] == ddp["structure"]  # keys, shapes, AdamW ids, groups and state as DDP's
    assert pipe["resume_equal"]  # a resume gives every stage back its weights and AdamW state
    assert pipe["final_model_loss"] == pytest.approx(pipe["loss"], abs=1e-5)  # rank 0's whole model


# --- a real cell -----------------------------------------------------------------------------------
FAIL_ONCE_ENV = "PIPELINE_TEST_FAIL_ONCE"  # a file: rank 0 fails after epoch 1's checkpoint unless it exists


def fail_once(epoch: int, rank: int, **_) -> None:
    """The loop's epoch-end hook (``PIPELINES_EPOCH_END_HOOK``): the first attempt dies after the
    checkpoint of epoch 1, so the next one resumes from it."""
    marker = Path(os.environ[FAIL_ONCE_ENV])
    if epoch == 1 and rank == 0 and not marker.exists():
        marker.write_text("failed once")
        raise RuntimeError("test: the first attempt stops after epoch 1's checkpoint")


@pytest.mark.slow  # torchrun starts two ranks of the shared loop, twice
def test_a_pipeline_cell_trains_evaluates_checkpoints_resumes_and_exports(tmp_path_factory, imdb_dir, bert_tiny_dir,
                                                                          monkeypatch):
    from transformers import AutoModelForSequenceClassification

    from pipelines.config import load_config
    from pipelines.run.cells import run_cell
    from pipelines.runfolder.paths import RunPaths
    from pipelines.training.checkpoint import load_checkpoint
    from tests.token_shards import write_token_shards

    root = tmp_path_factory.mktemp("pipeline-cell")
    paths = write_token_shards(RunPaths(root / "run"), imdb_dir, bert_tiny_dir, train_per_class=16,
                               test_per_class=8, seq_len=SEQ_LEN, seed=7, validation_per_class=5)
    config = load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
        output_root=str(root), max_seq_len=SEQ_LEN, batch_size=BATCH, batch_policy="per_worker", epochs=2,
        learning_rate=LEARNING_RATE, seed=0, backends=["ddp"], worker_counts=[2], strategies=["pipeline-4"]))
    project = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PIPELINES_EPOCH_END_HOOK", "tests.training.test_pipeline_parallel:fail_once")
    monkeypatch.setenv(FAIL_ONCE_ENV, str(root / "failed-once"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")])))
    with pytest.raises(Exception):  # the first attempt: epoch 1 trained and checkpointed, then it stops
        run_cell(config, paths, "ddp", 2, 0, strategy="pipeline-4")
    assert (root / "failed-once").exists()
    result = run_cell(config, paths, "ddp", 2, 0, strategy="pipeline-4")  # resumes from epoch 1's checkpoint
    assert result.status == "ok" and result.strategy == "pipeline-4" and result.pipeline_microbatches == 4
    assert result.resumed_from_epoch == 1
    assert len(result.epochs) == 2 and all(e.eval_loss == e.eval_loss for e in result.epochs)  # evaluated
    assert result.test.accuracy >= 0 and sum(c.support for c in result.test.per_class) == 16  # rank 0, every row
    rows = WORLD * BATCH  # 32 train rows: 2 steps an epoch, each of 16 rows
    assert result.comm_bytes_per_step == rows * SEQ_LEN * (2 * HIDDEN * 4 + 8)
    model = AutoModelForSequenceClassification.from_pretrained(result.model_path)  # the whole model, exported
    state = load_checkpoint(Path(result.checkpoint_path))
    assert set(state["model"]) == set(model.state_dict()) and state["world_size"] == 2
