"""The whole training step as one function, captured once in a CUDA graph on a GPU.

``WholeStep`` (``graph_capture``) is the loop's step (``steps.train_step``: ``steps.forward``, backward, AdamW and
the warm-up/decay schedule of ``steps.build_optimizer``) with everything on the device: the train
split (a device cursor picks the step's rows of the epoch's order, the loop's sampler's), AdamW
``fused=True, capturable=True`` with the learning rate a device tensor set inside the step from a
device step counter and a table of the project's scheduler's values, the epoch's metric sums. On
CUDA ``prepare`` warms up on a side stream, captures one ``torch.cuda.CUDAGraph`` per batch size
(full, and the epoch's last smaller batch) and undoes what the warm-up changed: an epoch is one
``replay()`` per step. Elsewhere (CPU) the same function runs eagerly. ``GraphEval``: the held-out
evaluation alike; ``run_whole_step``: a cell trained with them (the loop's record, checkpoints,
final test, ``worker_result.json``); ``verify_whole_step``: the step against the loop's.
``graph_capture.graph_safe_masks``: transformers' skip of an unpadded batch's attention mask (``mask.all()``, a
host sync, refused in a capture, and a branch a graph would freeze) off while these steps run.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager, nullcontext

import torch

from pipelines.training import checkpoint as ckpt
from pipelines.training.cell import CellSpec
from pipelines.training.distributed import DistEnv, TorchDistributed
from pipelines.training.engine import TorchEngine
from pipelines.training.graph_capture import GraphEval, WholeStep, _load, batch_sizes, graph_safe_masks
from pipelines.training.model import build_model
from pipelines.training.outcome import timed_export, worker_devices, worker_result, write_worker_result
from pipelines.training.record import TrainingRecord
from pipelines.training.steps import build_optimizer, final_test, load_split, train_loader, train_step

log = logging.getLogger("pipelines.training")
RESULT_FILE = "whole_step.json"


# --- checking the step against the loop's ------------------------------------------------------
@contextmanager
def dropout_off(model: torch.nn.Module, off: bool = True):
    """Every ``nn.Dropout`` at p=0 while inside (BERT's attention dropout reads the same p)."""
    saved = {m: m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} if off else {}
    for layer in saved:
        layer.p = 0.0
    try:
        yield
    finally:
        for layer, p in saved.items():
            layer.p = p


def loop_steps(model, module, config, batches: list[tuple], device: torch.device) -> list[float]:
    """The shared loop's step (``steps.train_step`` with the default engine, AdamW and LambdaLR)
    over ``batches``: forward, zero_grad, backward, optimizer step, scheduler step -> the losses."""
    optimizer, scheduler = build_optimizer(model, config, len(batches))
    engine = TorchEngine()
    engine.attach(model, module, optimizer, scheduler, runtime=None)
    losses = []
    for batch in batches:
        loss, _, _ = train_step(engine, module, batch, device)
        losses.append(loss.item())
    return losses


def verify_whole_step(model, eager, module, config, data: tuple[torch.Tensor, ...], order: torch.Tensor,
                      batch_size: int, device: torch.device, *, steps: int = 6, use_graphs: bool = True,
                      dropout: bool = False, same_masks: bool = True, seed: int = 0,
                      tolerance: float = 1e-5) -> dict:
    """From the model's state, ``steps`` steps of the loop's step (``eager``) and of ``WholeStep``
    (``module``; graphs on CUDA) on the first rows of ``order`` (a schedule of ``steps``, a third
    warm-up); the model put back. Dropout off unless ``dropout`` (a graph's or compiled dropout
    draws other numbers); ``same_masks``: the loop's step always builds the mask too."""
    check_config = config.model_copy(update={"training": config.training.model_copy(update={"warmup_ratio": 1 / 3})})
    params = list(model.parameters())
    initial = [p.detach().clone() for p in params]
    rows = order[torch.arange(steps * batch_size) % len(order)]  # round again when the split is short
    batches = [tuple(t[rows[i * batch_size:(i + 1) * batch_size]].to(device) for t in data) for i in range(steps)]
    with dropout_off(model, not dropout):
        torch.manual_seed(seed)
        with graph_safe_masks() if same_masks else nullcontext():
            reference = loop_steps(model, eager, check_config, batches, device)
        reference_params = [p.detach().clone() for p in params]
        _load(params, initial)
        whole = WholeStep(model, module, check_config, steps, data, batch_size, device, use_graphs=use_graphs)
        whole.set_order(rows)
        whole.prepare([batch_size])
        torch.manual_seed(seed)
        sums = [(whole.step(batch_size), whole.loss_sum.item())[1] for _ in range(steps)]  # running sums
    losses = [b - a for a, b in zip([0.0] + sums[:-1], sums)]
    param_diff = max((p.detach() - r).abs().max().item() for p, r in zip(params, reference_params, strict=True))
    _load(params, initial)
    model.zero_grad(set_to_none=True)
    loss_diff = max(abs(a - b) for a, b in zip(reference, losses, strict=True))
    return {"steps": steps, "dropout": dropout, "graphs": whole.use_graphs, "reference_losses": reference,
            "whole_step_losses": losses, "max_loss_diff": loss_diff, "max_param_diff": param_diff,
            "tolerance": tolerance, "match": loss_diff <= tolerance}


# --- a cell trained with the whole step ------------------------------------------------------------
def run_whole_step(spec: CellSpec, launch_time: float, distributed: TorchDistributed | None = None,
                   *, verify_steps: int = 6, use_graphs: bool = True) -> dict:
    """Train one cell (one process, default strategy) with ``WholeStep`` and the loop's data, model,
    sampler, record, checkpoints, final test, worker_result.json; -> <cell>/whole_step.json's dict."""
    cfg, distributed = spec.config, distributed or TorchDistributed()
    torch.set_num_threads(cfg.training.threads_per_worker)
    env = distributed.setup()
    try:
        if env.world_size != 1 or not cfg.strategy().is_default:
            raise ValueError("the whole-graph step trains one process with the default strategy")
        device, batch = env.device, cfg.training.batch_size
        train_set, test_set = load_split(spec.paths, "train"), load_split(spec.paths, "test")
        model, model_source = build_model(cfg.training.model_source, cfg.training.seed, spec.num_labels)
        model.to(device)
        module = distributed.wrap_model(model, env)  # the check's seam: autocast, torch.compile
        eager = getattr(module, "_orig_mod", module)
        sampler = train_loader(train_set, cfg, env).sampler  # the loop's row order, epoch by epoch
        sizes, data = batch_sizes(len(sampler), batch), tuple(t.to(device) for t in train_set.tensors)
        sampler.set_epoch(0)
        # compiled: other fusions, other bf16 roundings; else the same kernels (fused vs foreach AdamW)
        tolerance = 1e-2 if module is not eager else 1e-3 if device.type == "cuda" else 1e-5
        check = verify_whole_step(model, eager, module, cfg, data, torch.tensor(list(sampler)), batch, device,
                                  steps=verify_steps, use_graphs=use_graphs, tolerance=tolerance) if verify_steps else None
        if check:
            log.info("whole step vs the loop's step: max loss diff %.2e over %d steps (%s)",
                     check["max_loss_diff"], verify_steps, "ok" if check["match"] else "MISMATCH")
        step = WholeStep(model, module, cfg, len(sizes) * cfg.training.epochs, data, batch, device,
                         use_graphs=use_graphs)
        evaluator = GraphEval(module, load_split(spec.paths, "validation").tensors, batch, device,
                              use_graphs=use_graphs)
        torch.manual_seed(cfg.training.seed + env.rank)  # the loop's dropout stream seed
        module.train()
        record = TrainingRecord(samples_per_epoch=len(sampler))
        capture = _epochs(spec, step, evaluator, sampler, sizes, record)
        _finish(spec, env, record, model, test_set, launch_time, model_source, len(train_set), len(sizes))
        extra = {"verify": check, "capture_seconds": capture, "graphs": step.use_graphs,
                 "compiled": module is not eager, "batch_sizes": sorted(set(sizes), reverse=True)}
        (spec.cell_dir / RESULT_FILE).write_text(json.dumps(extra, indent=2))
        return extra
    finally:
        distributed.teardown()


def _epochs(spec: CellSpec, step: WholeStep, evaluator: GraphEval, sampler, sizes: list[int],
            record: TrainingRecord) -> float:
    """The loop's epochs and phases -> seconds capturing (in epoch 1's train and eval phases)."""
    cfg, capture = spec.config, 0.0
    spec.cell.checkpoints.mkdir(parents=True, exist_ok=True)
    for epoch in range(cfg.training.epochs):
        sampler.set_epoch(epoch)
        step.set_order(torch.tensor(list(sampler)))
        record.training_started()
        with record.phase("train"):
            if epoch == 0 and step.use_graphs:
                capture += step.prepare(sorted(set(sizes), reverse=True))
                torch.manual_seed(cfg.training.seed)  # the warm-up drew dropout numbers
            for size in sizes:
                step.step(size)
            loss_total, acc_total = step.take_sums()
        with record.phase("eval"):
            capture += evaluator.prepare() if epoch == 0 else 0.0
            e_loss, e_correct, e_count = evaluator.run()
        m = record.end_epoch(train_loss=loss_total / len(sizes), train_accuracy=acc_total / len(sizes),
                             eval_loss=e_loss / e_count, eval_accuracy=e_correct / e_count,
                             learning_rate=step.learning_rate)
        log.info("epoch %d: train loss %.4f acc %.3f | eval loss %.4f acc %.3f | %.1f samples/s (whole step)",
                 m.epoch, m.train_loss, m.train_accuracy, m.eval_loss, m.eval_accuracy, m.samples_per_second)
        with record.phase("checkpoint"):
            ckpt.save_checkpoint({
                "model": step.model.state_dict(), "optimizer": step.optimizer.state_dict(),
                "scheduler": step.scheduler_state(), "epoch": epoch + 1, "rng": [ckpt.rng_state()],
                "config": cfg.to_json(), "world_size": 1, "record": record.state(),
            }, spec.cell.checkpoints, epoch + 1)
    return capture


def _finish(spec: CellSpec, env: DistEnv, record: TrainingRecord, model, test_set, launch_time: float,
            model_source: str, train_samples: int, steps_per_epoch: int) -> None:
    """The loop's end: final test on every test row, export, worker_result.json."""
    devices, placements = worker_devices(env, spec.backend)
    test, test_seconds = final_test(model, test_set, spec, env.device)
    log.info("test: accuracy %.3f macro-F1 %.3f loss %.4f", test.accuracy, test.f1, test.loss)
    model_path, export_seconds = timed_export(model, spec.cell)
    last = ckpt.latest_checkpoint(spec.cell.checkpoints)
    write_worker_result(worker_result(
        spec, env, record, launch_time=launch_time, model_source=model_source, test=test,
        test_seconds=test_seconds, train_samples=train_samples, test_samples=len(test_set),
        checkpoint_path=str(last) if last else None, model_path=model_path, devices=devices,
        placements=placements, export_seconds=export_seconds, steps_per_epoch=steps_per_epoch), spec)
