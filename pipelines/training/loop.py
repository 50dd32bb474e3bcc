"""The shared training loop: every backend runs exactly this code in every rank.

Started through ``pipelines.training.worker`` (torchrun, TorchDistributor); the Determined
trial reuses its pieces (data, loaders, optimizer, evaluation, result). Reads the token shards
of the run folder, trains with DistributedSampler + AdamW + linear warm-up, all-reduces
per-epoch train loss/accuracy, evaluates on the held-out test split each epoch, checkpoints
every epoch to ``<cell>/checkpoints`` and resumes from the newest one when restarted.

Distributed contract: RANK / LOCAL_RANK / WORLD_SIZE (+ MASTER_ADDR/PORT) as torchrun sets
them; gloo on CPU, nccl on GPU (with bf16 autocast). Rank 0 alone logs, checkpoints and
writes ``<cell>/worker_result.json``. Timings are taken here, the same way for every backend:
training_seconds = forward/backward/step only (steady state), evaluation_seconds = held-out
evaluation each epoch + the final test evaluation, startup_seconds = launch -> first step.
Fault-injection for tests: PIPELINES_HOLD_AFTER_EPOCH=N makes rank 0 stall after saving
epoch N so a test can SIGKILL the process tree at a known point.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import resource
import socket
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from pipelines.config import BenchmarkConfig
from pipelines.data.tokens import read_token_split
from pipelines.evaluation import classification_metrics
from pipelines.results import CellResult, EpochMetrics, TestMetrics
from pipelines.training import checkpoint as ckpt
from pipelines.training.model import build_model
from pipelines.training.worker import WORKER_RESULT_FILE, CellSpec

log = logging.getLogger("pipelines.training")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> DistEnv:
    """Read the torchrun env; join the process group (nccl on GPU, gloo on CPU) if world > 1."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DistEnv(rank, world, local_rank, device)


def device_name(device: torch.device) -> str:
    return f"cuda:{torch.cuda.get_device_name(device)}" if device.type == "cuda" else "cpu"


def autocast(device: torch.device):
    """bf16 autocast on GPU; full fp32 on CPU (bf16 on CPU is slower here, not faster)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def all_reduce_sum(values: list[float], env: DistEnv) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=env.device)
    if env.world_size > 1:
        dist.all_reduce(tensor)
    return tensor.tolist()


# --- data ---------------------------------------------------------------------------------
def load_split(spec: CellSpec, split: str) -> TensorDataset:
    ids, mask, labels = read_token_split(spec.paths.token_split(split))
    return TensorDataset(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(labels))


def train_loader(dataset: TensorDataset, spec: CellSpec, env: DistEnv) -> DataLoader:
    """Seeded shuffling identical under every launcher; call ``sampler.set_epoch`` per epoch."""
    sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank,
                                 shuffle=True, seed=spec.config.seed)
    return DataLoader(dataset, batch_size=spec.config.batch_size, sampler=sampler)


def eval_loader(dataset: TensorDataset, batch_size: int, env: DistEnv | None = None) -> DataLoader:
    """Rank r evaluates rows r, r+W, ... (no padding: every test row counted once)."""
    if env is not None and env.world_size > 1:
        dataset = Subset(dataset, range(env.rank, len(dataset), env.world_size))
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)


# --- model steps -----------------------------------------------------------------------------
def build_optimizer(model: torch.nn.Module, spec: CellSpec, total_steps: int):
    """AdamW (no decay on biases/LayerNorm) + linear warm-up then linear decay, per batch."""
    from transformers import get_linear_schedule_with_warmup

    cfg = spec.config
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.learning_rate,
    )
    warmup = int(cfg.warmup_ratio * total_steps)
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, total_steps)


def forward(model, batch, device: torch.device):
    """-> (mean loss, logits, labels) for one batch; the loss is computed in fp32."""
    ids, mask, labels = (t.to(device, non_blocking=True) for t in batch)
    with autocast(device):
        logits = model(input_ids=ids, attention_mask=mask).logits
    return F.cross_entropy(logits.float(), labels), logits, labels


@torch.no_grad()
def evaluate(model, loader: DataLoader, device: torch.device, keep_predictions: bool = False):
    """-> (loss_sum, correct, count, predictions, labels) over one loader."""
    was_training = model.training
    model.eval()
    loss_sum, correct, count, preds, labels = 0.0, 0, 0, [], []
    for batch in loader:
        loss, logits, y = forward(model, batch, device)
        pred = logits.argmax(-1)
        loss_sum += loss.item() * len(y)
        correct += int((pred == y).sum())
        count += len(y)
        if keep_predictions:
            preds.append(pred.cpu())
            labels.append(y.cpu())
    model.train(was_training)
    if keep_predictions:
        return loss_sum, correct, count, torch.cat(preds).numpy(), torch.cat(labels).numpy()
    return loss_sum, correct, count, None, None


def final_test(model, test_set: TensorDataset, spec: CellSpec, device: torch.device) -> tuple[TestMetrics, float]:
    """Rank 0: every test row, predictions kept -> classification metrics and its wall time."""
    start = time.perf_counter()
    loss_sum, _, count, preds, labels = evaluate(
        model, eval_loader(test_set, spec.config.batch_size), device, keep_predictions=True)
    return classification_metrics(labels, preds, loss_sum / count), time.perf_counter() - start


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def versions() -> dict[str, str]:
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def export_model(model, spec: CellSpec) -> str:
    """Rank 0: the trained model in Hugging Face format (config + safetensors) -> <cell>/model.

    Loadable with ``AutoModelForSequenceClassification.from_pretrained``; written to a temporary
    folder first so a reader never sees half a model.
    """
    import shutil

    target, tmp = spec.cell_dir / "model", spec.cell_dir / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return str(target)


def worker_result(spec: CellSpec, env: DistEnv, *, model_source: str, epochs: list[EpochMetrics],
                  test: TestMetrics, train_samples: int, test_samples: int, startup: float,
                  training: float, evaluation: float, checkpoint_path: str | None,
                  resumed_from: int, model_path: str | None = None) -> CellResult:
    return CellResult(
        backend=spec.backend, world_size=env.world_size, repeat=spec.repeat,
        device=device_name(env.device), model_source=model_source,
        model_name=spec.config.model_source, train_samples=train_samples,
        test_samples=test_samples, max_seq_len=spec.config.max_seq_len,
        batch_size_per_worker=spec.config.batch_size, seed=spec.config.seed, epochs=epochs,
        test=test, startup_seconds=startup, training_seconds=training,
        evaluation_seconds=evaluation,
        samples_per_second=epochs[-1].samples_per_second if epochs else 0.0,
        peak_memory_mb=peak_memory_mb(env.device), checkpoint_path=checkpoint_path,
        model_path=model_path, resumed_from_epoch=resumed_from, versions=versions(), host=socket.gethostname(),
    )


def write_worker_result(result: CellResult, spec: CellSpec) -> None:
    result.write(spec.cell_dir / WORKER_RESULT_FILE)


# --- the loop ------------------------------------------------------------------------------
def run_training(spec: CellSpec, launch_time: float) -> None:
    """Train one cell in this rank; rank 0 writes worker_result.json at the end."""
    cfg = spec.config
    torch.set_num_threads(cfg.threads_per_worker)  # torchrun sets OMP threads only sometimes
    env = setup_distributed()
    try:
        _train(spec, env, launch_time)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(spec: CellSpec, env: DistEnv, launch_time: float) -> None:
    cfg = spec.config
    train_set, test_set = load_split(spec, "train"), load_split(spec, "test")
    model, model_source = build_model(cfg.model_source, cfg.seed)  # identical on every rank
    model.to(env.device)
    loader = train_loader(train_set, spec, env)
    held_out = eval_loader(test_set, cfg.batch_size, env)
    steps_per_epoch = len(loader)
    optimizer, scheduler = build_optimizer(model, spec, steps_per_epoch * cfg.epochs)
    torch.manual_seed(cfg.seed + env.rank)  # dropout stream: distinct per rank, reproducible

    # Resume: every rank reads the newest checkpoint rank 0 wrote.
    ckpt_dir = ckpt.checkpoint_dir(spec.cell_dir)
    start_epoch, history, train_time, eval_time, elapsed0 = 0, [], 0.0, 0.0, 0.0
    last = ckpt.latest_checkpoint(ckpt_dir)
    if last is not None:
        state = ckpt.load_checkpoint(last)
        written_by = BenchmarkConfig.model_validate_json(state["config"]).training_identity()
        if written_by != cfg.training_identity() or state["world_size"] != env.world_size:
            raise RuntimeError(f"{last} was written by a different training config or world size; "
                               f"delete {ckpt_dir} to start this cell over")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"][env.rank])
        start_epoch = int(state["epoch"])
        history = [EpochMetrics.model_validate(json.loads(h)) for h in state["history"]]
        train_time, eval_time, elapsed0 = state["train_seconds"], state["eval_seconds"], state["elapsed"]
        if env.is_main:
            log.info("resuming from %s at epoch %d", last, start_epoch + 1)

    ddp = model
    if env.world_size > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    ddp.train()
    samples_per_epoch = len(loader.sampler) * env.world_size  # padded rows included: they are trained
    total_steps = steps_per_epoch * (cfg.epochs - start_epoch)
    first_step = time.time()
    startup = first_step - launch_time
    hold = int(os.environ.get("PIPELINES_HOLD_AFTER_EPOCH", "0"))
    step_done = 0
    checkpoint_path = str(last) if last else None

    for epoch in range(start_epoch, cfg.epochs):
        loader.sampler.set_epoch(epoch)
        # --- train: forward/backward/step, timed as steady-state training ---
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
        acc_sum = torch.zeros((), dtype=torch.float64, device=env.device)
        for i, batch in enumerate(loader):
            loss, logits, labels = forward(ddp, batch, env.device)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            loss_sum += loss.detach()
            acc_sum += (logits.argmax(-1) == labels).double().mean()
            step_done += 1
            if env.is_main and (i + 1) % max(1, steps_per_epoch // 4) == 0:
                rate = (time.time() - first_step) / step_done
                log.info("epoch %d/%d step %d/%d loss %.4f lr %.2e eta %.0fs", epoch + 1,
                         cfg.epochs, i + 1, steps_per_epoch, loss.item(),
                         scheduler.get_last_lr()[0], rate * (total_steps - step_done))
        # train metrics = mean over batches of the global batch mean (as Determined reports)
        loss_total, acc_total = all_reduce_sum([loss_sum.item(), acc_sum.item()], env)
        epoch_train = time.perf_counter() - t0
        train_time += epoch_train
        # --- held-out evaluation on the test split, sharded over ranks ---
        t1 = time.perf_counter()
        e_loss, e_correct, e_count, _, _ = evaluate(ddp, held_out, env.device)
        e_loss, e_correct, e_count = all_reduce_sum([e_loss, e_correct, e_count], env)
        epoch_eval = time.perf_counter() - t1
        eval_time += epoch_eval
        denom = steps_per_epoch * env.world_size
        history.append(EpochMetrics(
            epoch=epoch + 1, train_loss=loss_total / denom, train_accuracy=acc_total / denom,
            eval_loss=e_loss / e_count, eval_accuracy=e_correct / e_count,
            epoch_seconds=epoch_train + epoch_eval,
            elapsed_seconds=elapsed0 + time.time() - first_step,
            samples_per_second=samples_per_epoch * (epoch + 1) / train_time,
        ))
        # --- checkpoint: RNG of every rank gathered to rank 0, which alone writes ---
        rngs = [None] * env.world_size
        if env.world_size > 1:
            dist.all_gather_object(rngs, ckpt.rng_state())
        else:
            rngs = [ckpt.rng_state()]
        if env.is_main:
            m = history[-1]
            log.info("epoch %d: train loss %.4f acc %.3f | eval loss %.4f acc %.3f | %.1f samples/s",
                     m.epoch, m.train_loss, m.train_accuracy, m.eval_loss, m.eval_accuracy,
                     m.samples_per_second)
            checkpoint_path = str(ckpt.save_checkpoint({
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch + 1, "rng": rngs,
                "config": cfg.to_json(), "world_size": env.world_size,
                "history": [h.model_dump_json() for h in history],
                "train_seconds": train_time, "eval_seconds": eval_time,
                "elapsed": history[-1].elapsed_seconds,
            }, ckpt_dir, epoch + 1))
            if hold == epoch + 1:
                log.warning("PIPELINES_HOLD_AFTER_EPOCH=%d: stalling for a test kill", hold)
                time.sleep(300)  # bounded: a missed kill cannot hang forever

    if not env.is_main:
        return
    test, test_seconds = final_test(model, test_set, spec, env.device)
    log.info("test: accuracy %.3f f1 %.3f loss %.4f", test.accuracy, test.f1, test.loss)
    write_worker_result(worker_result(
        spec, env, model_source=model_source, epochs=history, test=test,
        train_samples=len(train_set), test_samples=len(test_set), startup=startup,
        training=train_time, evaluation=eval_time + test_seconds,
        checkpoint_path=checkpoint_path, resumed_from=start_epoch,
        model_path=export_model(model, spec)), spec)
