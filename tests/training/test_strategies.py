"""Training strategies on real gloo process groups (2 ranks) and through the real backends.

- comm hooks: fp16 and PowerSGD registered on DDP, training runs, fewer bytes per step than
  plain DDP's all-reduce;
- local SGD: every rank's parameters equal right after an averaging step, different between;
- FSDP2 at world size 2 trains a real cell on CPU (checkpoint, test, export through the full
  state dict);
- the weighted sampler raises the minority class's test recall on a train sample made
  imbalanced on purpose (``class_ratio``);
- Determined refuses comm strategies before the cell starts; 1-worker comm cells are refused.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipelines.config import TrainingStrategy
from pipelines.training.strategies import DistributedWeightedSampler, apply_strategy, row_weights


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toy_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same start on every rank, as build_model gives
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def _rank_main(rank: int, world: int, port: int, strategy_json: str, steps: int, out_dir: str) -> None:
    """One rank: DDP + the strategy's hooks, ``steps`` AdamW steps on rank-specific data; writes
    per step whether its parameters equal every other rank's, the losses and bytes per step."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        strategy = TrainingStrategy.model_validate_json(strategy_json)
        model = torch.nn.parallel.DistributedDataParallel(_toy_model())
        runtime = apply_strategy(model, strategy, world)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
        losses, in_sync = [], []
        for _ in range(steps):
            x = torch.randn(16, 64, generator=data)
            y = torch.randint(0, 2, (16,), generator=data)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            runtime.after_step()
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            gathered = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(gathered, flat)
            in_sync.append(all(torch.equal(gathered[0], g) for g in gathered[1:]))
            losses.append(loss.item())
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
            "losses": losses, "in_sync": in_sync, "bytes_per_step": runtime.comm_bytes_per_step,
            "hook_bytes": runtime.hook_bytes}))
    finally:
        dist.destroy_process_group()


def _train_two_ranks(tmp_path: Path, strategy: TrainingStrategy, steps: int) -> list[dict]:
    out = tmp_path / strategy.name
    out.mkdir()
    mp.spawn(_rank_main, args=(2, _free_port(), strategy.model_dump_json(), steps, str(out)), nprocs=2)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow  # two gloo ranks (mp.spawn) train a toy model, three times
def test_fp16_and_powersgd_hooks_train_and_send_fewer_bytes_than_plain_ddp(tmp_path):
    plain, fp16, powersgd = (
        _train_two_ranks(tmp_path, TrainingStrategy(**fields), steps=6)[0]
        for fields in ({}, {"comm_hook": "fp16"}, {"comm_hook": "powersgd", "powersgd_rank": 2}))
    for result in (plain, fp16, powersgd):
        assert all(map(lambda v: v == v and abs(v) < 1e3, result["losses"]))  # finite
        assert all(result["in_sync"])  # gradients still all-reduced: the replicas never drift
    params = 64 * 64 + 64 + 64 * 2 + 2
    assert plain["bytes_per_step"] == params * 4 and plain["hook_bytes"] == 0  # DDP's built-in all-reduce
    assert fp16["hook_bytes"] > 0 and fp16["bytes_per_step"] == params * 2  # the hook ran: half the bytes
    # PowerSGD: plain all-reduce for its first 2 steps, then rank-2 factors of the 64x64 weight
    assert powersgd["hook_bytes"] > 0 and powersgd["bytes_per_step"] < fp16["bytes_per_step"]


@pytest.mark.slow  # two gloo ranks (mp.spawn) train a toy model
def test_local_sgd_averages_parameters_every_n_steps_only(tmp_path):
    ranks = _train_two_ranks(tmp_path, TrainingStrategy(sync_every=3), steps=7)
    in_sync = ranks[0]["in_sync"]  # after steps 1..7
    assert in_sync == [False, False, True, False, False, True, False]
    assert ranks[0]["bytes_per_step"] == pytest.approx((64 * 64 + 64 + 64 * 2 + 2) * 4 * 2 / 7)


def test_weighted_sampler_gives_each_rank_its_share_of_a_balanced_draw():
    labels = torch.tensor([0] * 90 + [1] * 10)
    weights = row_weights(labels, [90, 10])
    shares = [DistributedWeightedSampler(weights, 2, rank, seed=3) for rank in range(2)]
    for s in shares:
        s.set_epoch(1)
    drawn = [list(s) for s in shares]
    assert [len(d) for d in drawn] == [50, 50] and drawn[0] != drawn[1]
    minority = sum(int(labels[i]) for d in drawn for i in d) / 100
    assert 0.35 < minority < 0.65  # ~half the draws from the class that is 10 % of the rows
    shares[0].set_epoch(2)
    assert list(shares[0]) != drawn[0]  # a new epoch, a new draw; the same epoch, the same draw
    shares[0].set_epoch(1)
    assert list(shares[0]) == drawn[0]


# --- the strategy's runtime in the shared loop (pipelines.training.runtime), without processes ---
def _runtime(strategy: TrainingStrategy, world: int, counts=(90, 10), distributed=None):
    from pipelines.training.distributed import DistEnv, TorchDistributed
    from pipelines.training.runtime import runtime_for

    asked = []
    env = DistEnv(0, world, 0, torch.device("cpu"))
    runtime = runtime_for(strategy, distributed or TorchDistributed(), env, lambda: asked.append(1) or list(counts))
    return runtime, asked


def test_runtime_for_picks_the_strategy_part_and_one_process_is_always_replicated():
    from pipelines.training.runtime import LocalSGD, Replicated, Sharded

    assert type(_runtime(TrainingStrategy(), 2)[0]) is Replicated
    assert type(_runtime(TrainingStrategy(comm_hook="fp16"), 2)[0]) is Replicated
    assert type(_runtime(TrainingStrategy(sync_every=3), 2)[0]) is LocalSGD
    assert type(_runtime(TrainingStrategy(sharding="fsdp"), 2)[0]) is Sharded
    for strategy in (TrainingStrategy(sync_every=3), TrainingStrategy(sharding="fsdp")):
        assert type(_runtime(strategy, 1)[0]) is Replicated  # nothing to average or shard


def test_runtime_reads_class_counts_only_for_imbalance_and_weights_only_the_loss_strategy():
    plain, asked = _runtime(TrainingStrategy(), 2)
    assert asked == [] and plain.counts is None and plain.loss_weights is None
    sampler, asked = _runtime(TrainingStrategy(imbalance="weighted_sampler"), 2)
    assert asked == [1] and sampler.counts == [90, 10] and sampler.loss_weights is None
    weighted, _ = _runtime(TrainingStrategy(imbalance="weighted_loss"), 2)
    assert torch.allclose(weighted.loss_weights, torch.tensor([100 / 180, 100 / 20]))


def test_train_sampler_follows_the_imbalance_strategy():
    from torch.utils.data import DistributedSampler, TensorDataset

    from pipelines.training.strategies import train_sampler

    data = TensorDataset(torch.zeros(8), torch.zeros(8), torch.tensor([0] * 6 + [1] * 2))
    assert type(train_sampler(TrainingStrategy(), data, 2, 1, seed=3)) is DistributedSampler
    weighted = train_sampler(TrainingStrategy(imbalance="weighted_sampler"), data, 2, 1, 3, counts=[6, 2])
    assert isinstance(weighted, DistributedWeightedSampler) and len(weighted) == 4
    with pytest.raises(ValueError, match="class counts"):
        train_sampler(TrainingStrategy(imbalance="weighted_sampler"), data, 2, 1, 3)


def test_runtime_refuses_a_seam_that_replaced_the_weighted_sampler():
    from torch.utils.data import DataLoader, SequentialSampler, TensorDataset

    from pipelines.training.distributed import TorchDistributed

    class Replacing(TorchDistributed):
        def prepare_loader(self, loader, env):
            return DataLoader(loader.dataset, sampler=SequentialSampler(loader.dataset))

    data = TensorDataset(torch.zeros(4), torch.zeros(4), torch.tensor([0, 0, 0, 1]))
    runtime, _ = _runtime(TrainingStrategy(imbalance="weighted_sampler"), 2, distributed=Replacing())
    with pytest.raises(RuntimeError, match="replaced the weighted sampler"):
        runtime.prepare_loader(DataLoader(data))
    plain, _ = _runtime(TrainingStrategy(), 2, distributed=Replacing())
    assert isinstance(plain.prepare_loader(DataLoader(data)).sampler, SequentialSampler)


def test_one_process_runtime_wraps_nothing_and_measures_no_bytes():
    runtime, _ = _runtime(TrainingStrategy(), 1)
    model = _toy_model()
    runtime.shard(model)
    assert runtime.wrap(model, steps_done=0) is model
    runtime.after_step(record=None)
    assert runtime.hooks.steps == 1 and runtime.comm_bytes_per_step is None
    assert runtime.eval_batches(rows=33, batch_size=4) is None
    assert runtime.final_model(model, rebuild=lambda: pytest.fail("no rebuild")) is model


def test_sharded_evaluation_runs_the_largest_share_of_batches_on_every_rank():
    runtime, _ = _runtime(TrainingStrategy(sharding="fsdp"), 2)
    assert runtime.eval_batches(rows=33, batch_size=4) == 5  # rank 0: 17 rows -> 5 batches


def test_local_sgd_averaging_is_timed_as_communication():
    from pipelines.training.record import TrainingRecord

    class Hooks:  # stands in for StrategyRuntime: each collective takes 2 s of the fake clock
        def after_step(self):
            now[0] += 2.0

        def synchronise(self):
            now[0] += 2.0

    now = [0.0]
    record = TrainingRecord(samples_per_epoch=4, clock=lambda: now[0], wall=lambda: now[0])
    local, _ = _runtime(TrainingStrategy(sync_every=3), 2)
    local.hooks = Hooks()
    local.after_step(record)
    local.at_epoch_end(record)
    assert record.totals["communication"] == 4.0
    plain, _ = _runtime(TrainingStrategy(), 2)
    plain.hooks = Hooks()
    plain.after_step(record)  # DDP's all-reduce is timed by its comm hook, not here
    plain.at_epoch_end(record)
    assert record.totals["communication"] == 4.0 and now[0] == 6.0
