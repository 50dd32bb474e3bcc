"""The shared loop's building blocks, per rank: the token splits and their loaders, the
optimizer, one forward, one training step, an evaluation pass and the final test.

The shared loop (``pipelines.training.loop``) and a platform's own trial both train with exactly
these; a training step's backward and optimizer work is its engine's
(``pipelines.training.engine``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

from pipelines.training.cell import CellSpec
from pipelines.config import BenchmarkConfig
from pipelines.data.tokens import read_token_split
from pipelines.training.metrics import classification_metrics
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import TestMetrics
from pipelines.training import strategies
from pipelines.training.distributed import DistEnv, autocast


# --- data ---------------------------------------------------------------------------------
def load_split(paths: RunPaths, split: str) -> TensorDataset:
    ids, mask, labels = read_token_split(paths.token_split(split))
    return TensorDataset(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(labels))


def train_loader(dataset: TensorDataset, config: BenchmarkConfig, env: DistEnv,
                 counts: list[int] | None = None) -> DataLoader:
    """Seeded shuffling identical under every launcher; call ``sampler.set_epoch`` per epoch.

    Strategy ``imbalance=weighted_sampler``: rows drawn with probability 1 / class count
    (``counts``: train rows per label, from the manifest), each rank its share."""
    sampler = strategies.train_sampler(config.strategy(), dataset, env.world_size, env.rank, config.training.seed, counts)
    return DataLoader(dataset, batch_size=config.training.batch_size, sampler=sampler)


def loss_weights(spec: CellSpec) -> torch.Tensor | None:
    """Strategy ``imbalance=weighted_loss``: class weights N / (K * count) from the manifest."""
    if spec.config.strategy().imbalance != "weighted_loss":
        return None
    return strategies.class_weights(train_class_counts(spec))


def train_class_counts(spec: CellSpec) -> list[int]:
    from pipelines.data.manifest import read_manifest

    return strategies.class_counts(read_manifest(spec.paths), spec.labels)


def eval_loader(dataset: TensorDataset, batch_size: int, env: DistEnv | None = None) -> DataLoader:
    """Rank r evaluates rows r, r+W, ... (no padding: every test row counted once)."""
    if env is not None and env.world_size > 1:
        dataset = Subset(dataset, range(env.rank, len(dataset), env.world_size))
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)


# --- model steps -----------------------------------------------------------------------------
def build_optimizer(model: torch.nn.Module, config: BenchmarkConfig, total_steps: int, **adamw_options):
    """AdamW (no decay on biases/LayerNorm) + linear warm-up then linear decay, per batch.

    AdamW runs torch's fused kernel (one pass over all parameters; CPU and CUDA) unless
    ``adamw_options`` choose otherwise (``foreach=True``, ``fused=False``): on CPU the default
    per-parameter loop is over half of a BERT-tiny step, the fused kernel a few percent
    (``python bench/optimizer_step.py``; figures in bench/RESULTS.md). Every backend trains with
    this one optimizer.
    """
    from transformers import get_linear_schedule_with_warmup

    if not adamw_options.get("foreach"):
        adamw_options = {"fused": True, **adamw_options}

    decay, no_decay = [], []
    for _, param in model.named_parameters():
        (no_decay if param.ndim < 2 else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.training.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.training.learning_rate, **adamw_options,
    )
    warmup = int(config.training.warmup_ratio * total_steps)
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, total_steps)


def forward(model, batch, device: torch.device, class_weights: torch.Tensor | None = None):
    """-> (mean loss, logits, labels) for one batch; the loss is computed in fp32
    (``class_weights``: the weighted_loss strategy's per-class weights, training only)."""
    ids, mask, labels = (t.to(device, non_blocking=True) for t in batch)
    with autocast(device):
        logits = model(input_ids=ids, attention_mask=mask).logits
    weight = None if class_weights is None else class_weights.to(device)
    return F.cross_entropy(logits.float(), labels, weight=weight), logits, labels


def train_step(engine, model, batch, device: torch.device, class_weights: torch.Tensor | None = None,
               after_step: Callable[[], None] | None = None):
    """One training step -> (loss, logits, labels): ``forward``, then the engine's zero_grad,
    backward and optimizer step, ``after_step`` (the strategy's: local SGD averaging) and the
    engine's scheduler step (``engine``: ``pipelines.training.engine.TorchEngine`` or one that
    replaces it). A model that runs its forward and backward as one schedule (a pipeline's stages:
    ``pipelines.training.pipeline.PipelineModel.forward_backward``) does both after zero_grad,
    instead of ``forward`` and the engine's backward."""
    fused = getattr(model, "forward_backward", None)
    if fused is not None:
        ids, mask, labels = (t.to(device, non_blocking=True) for t in batch)
        engine.zero_grad()
        with autocast(device):
            loss, logits = fused(ids, mask, labels, class_weights)
    else:
        loss, logits, labels = forward(model, batch, device, class_weights)
        engine.zero_grad()
        engine.backward(loss)
    engine.step()
    if after_step is not None:
        after_step()
    engine.scheduler_step()
    return loss, logits, labels


@torch.no_grad()
def evaluate(model, loader: DataLoader, device: torch.device, keep_predictions: bool = False,
             pad_to_batches: int | None = None):
    """-> (loss_sum, correct, count, predictions, labels) over one loader.

    ``pad_to_batches`` (FSDP): repeat uncounted forwards of the last batch up to that many,
    so every rank joins the same number of all-gathers even when its share is a batch shorter."""
    was_training = model.training
    model.eval()
    loss_sum, correct, count, preds, labels = 0.0, 0, 0, [], []
    batch = None
    for batch in loader:
        loss, logits, y = forward(model, batch, device)
        pred = logits.argmax(-1)
        loss_sum += loss.item() * len(y)
        correct += int((pred == y).sum())
        count += len(y)
        if keep_predictions:
            preds.append(pred.cpu())
            labels.append(y.cpu())
    for _ in range(max(0, (pad_to_batches or 0) - len(loader))):
        if batch is not None:
            forward(model, batch, device)
    model.train(was_training)
    if keep_predictions:
        return loss_sum, correct, count, torch.cat(preds).numpy(), torch.cat(labels).numpy()
    return loss_sum, correct, count, None, None


def final_test(model, test_set: TensorDataset, spec: CellSpec, device: torch.device) -> tuple[TestMetrics, float]:
    """Rank 0: every test row, predictions kept -> classification metrics and its wall time."""
    start = time.perf_counter()
    loss_sum, _, count, preds, labels = evaluate(
        model, eval_loader(test_set, spec.config.training.batch_size), device, keep_predictions=True)
    metrics = classification_metrics(labels, preds, loss_sum / count, spec.labels)
    return metrics, time.perf_counter() - start
