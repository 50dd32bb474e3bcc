"""A pipeline's stages (``pipelines.training.pipeline``): BERT split by hand into one stage per rank,
and ``PipelineModel``, what a rank's training steps and evaluation call: its stage run by GPipe
schedules of ``torch.distributed.pipelining`` (static shapes: no stage pickles its shapes to a
peer), the bytes its stages send counted on the P2P operations the schedule issues."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:  # the seam (distributed.py) picks the pipeline runtime: nothing of it imported here
    from pipelines.training.distributed import DistEnv


def stage_layers(layers: int, stages: int) -> list[range]:
    """The encoder layers of each stage: contiguous, as even as they go, the extra ones to the
    last stages (the first stage also holds the embeddings, whose dense gradient and AdamW
    update are most of the model's)."""
    if not 1 <= stages <= layers:
        raise ValueError(f"{stages} stages of {layers} encoder layers: at least one layer a stage")
    base, extra = divmod(layers, stages)
    sizes = [base + (1 if k >= stages - extra else 0) for k in range(stages)]
    starts = [sum(sizes[:k]) for k in range(stages)]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


def stage_of(key: str, ranges: list[range]) -> int:
    """The stage that holds a parameter (or state-dict entry) of BertForSequenceClassification."""
    if key.startswith("bert.embeddings."):
        return 0
    if key.startswith(("bert.pooler.", "classifier.")):
        return len(ranges) - 1
    if key.startswith("bert.encoder.layer."):
        layer = int(key.split(".")[3])
        return next(k for k, r in enumerate(ranges) if layer in r)
    raise ValueError(f"pipeline: no stage holds {key!r} (the stages split BertForSequenceClassification: "
                     "bert.embeddings, bert.encoder.layer.<i>, bert.pooler, classifier)")


class BertStage(nn.Module):
    """One stage of a (pruned) BertForSequenceClassification: the first takes (input ids,
    attention mask), the others (hidden states, attention mask); all but the last return
    (hidden states, attention mask), the last the logits. ``model`` is registered, so this
    module's parameters are the ones the pruned model still holds."""

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.model, self.layers, self.first, self.last = model, layers, first, last

    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor):
        bert = self.model.bert
        hidden = bert.embeddings(input_ids=inputs) if self.first else inputs
        # the encoder's attention bias (or None: no padding), built as BertModel.forward builds it
        bias, _ = bert._create_attention_masks(attention_mask=attention_mask, encoder_attention_mask=None,
                                               embedding_output=hidden, encoder_hidden_states=None, cache=None)
        for i in self.layers:
            hidden = bert.encoder.layer[i](hidden, bias)
        if not self.last:
            return hidden.float().contiguous(), attention_mask
        return self.model.classifier(self.model.dropout(bert.pooler(hidden)))


def split_model(model: nn.Module, stage: int, stages: int) -> BertStage:
    """Prune ``model`` (in place) to what stage ``stage`` of ``stages`` holds; its state dict keeps
    the full model's keys for the part it holds (the stages' state dicts together are the full one)."""
    bert = getattr(model, "bert", None)
    if bert is None or not hasattr(bert, "encoder") or not hasattr(model, "classifier"):
        raise TypeError(f"pipeline: the stages split BertForSequenceClassification; this model is "
                        f"{type(model).__name__}")
    ranges = stage_layers(len(bert.encoder.layer), stages)
    for key in model.state_dict():
        stage_of(key, ranges)  # every entry has a stage, or refuse before pruning anything
    if stage != 0:
        bert.embeddings = None
    for i in range(len(bert.encoder.layer)):
        if i not in ranges[stage]:
            bert.encoder.layer._modules[str(i)] = None
    if stage != stages - 1:
        bert.pooler = None
        model.classifier = None
    return BertStage(model, ranges[stage], first=stage == 0, last=stage == stages - 1)


def microbatches_for(rows: int, microbatches: int) -> int:
    """The largest count not above ``microbatches`` that splits ``rows`` into equal microbatches."""
    return next(m for m in range(min(microbatches, rows), 0, -1) if rows % m == 0)


class _CountingStage:
    """Mixin: the bytes of every tensor the stage sends to another (activations, gradients)."""

    sent_bytes = 0

    def get_fwd_send_ops(self, fwd_chunk_id: int):
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        self.sent_bytes += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        return ops

    def get_bwd_send_ops(self, bwd_chunk_id: int):
        ops = super().get_bwd_send_ops(bwd_chunk_id)
        self.sent_bytes += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        return ops


class PipelineModel(nn.Module):
    """What the training steps and the evaluation call on each rank: this rank's stage, its
    GPipe schedules (one per batch shape: the stages are given static shapes) and the byte
    counters. ``forward_backward`` is one training step's forward and backward (``steps.train_step``
    calls it instead of the forward and the engine's backward), ``forward`` the collective
    forward-only pipeline the loop's evaluation calls (``.logits`` of this rank's rows). Under the
    caller's autocast (``steps``: bf16 on GPU), the stages send float32 hidden states."""

    def __init__(self, stage: BertStage, env: DistEnv, microbatches: int, hidden: int, labels: int) -> None:
        super().__init__()
        self.stage = stage
        self.env, self.microbatches, self.hidden, self.labels = env, microbatches, hidden, labels
        self.weights: torch.Tensor | None = None  # this step's class weights (weighted_loss)
        self._schedules: dict[tuple, tuple] = {}  # (rows, seq, dtypes, train) -> (stage, schedule)

    @property
    def last_rank(self) -> int:
        return self.env.world_size - 1

    def _loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), target, weight=self.weights)

    def _schedule(self, rows: int, seq: int, ids_dtype: torch.dtype, mask_dtype: torch.dtype, train: bool):
        key = (rows, seq, ids_dtype, mask_dtype, train)
        if key not in self._schedules:
            from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

            class CountingStage(_CountingStage, PipelineStage):
                pass

            count = microbatches_for(rows, self.microbatches)
            mb, device = rows // count, self.env.device
            mask = torch.zeros(mb, seq, dtype=mask_dtype, device=device)
            hidden = torch.zeros(mb, seq, self.hidden, device=device, requires_grad=True)
            inputs = (torch.zeros(mb, seq, dtype=ids_dtype, device=device), mask) if self.stage.first else (hidden, mask)
            outputs = (torch.zeros(mb, self.labels, device=device, requires_grad=True),) if self.stage.last \
                else (hidden, mask)
            stage = CountingStage(self.stage, self.env.rank, self.env.world_size, device,
                                  input_args=inputs, output_args=outputs)
            schedule = ScheduleGPipe(stage, count, loss_fn=self._loss if train else None, scale_grads=True)
            self._schedules[key] = (stage, schedule)
        return self._schedules[key]

    def sent_bytes(self, train: bool) -> int:
        """Bytes this rank's stages sent to another stage (training steps, or evaluation)."""
        return sum(stage.sent_bytes for key, (stage, _) in self._schedules.items() if key[-1] == train)

    def _run(self, schedule, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor | None = None,
             losses: list | None = None):
        """The schedule's step on this rank: inputs to the first stage, labels to the last."""
        if self.stage.first:
            return schedule.step(ids, mask)
        if self.stage.last:
            return schedule.step(target=labels, losses=losses) if labels is not None else schedule.step()
        return schedule.step()

    def forward_backward(self, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                         class_weights: torch.Tensor | None = None):
        """One training step's forward and backward of the global batch (every rank holds all of
        it) -> (mean loss, logits) on every rank; the gradients are in this stage's parameters
        (``class_weights``: the weighted_loss strategy's, in each microbatch's loss)."""
        self.weights = None if class_weights is None else class_weights.to(self.env.device)
        rows = len(ids)
        _, schedule = self._schedule(rows, ids.shape[1], ids.dtype, mask.dtype, train=True)
        losses: list[torch.Tensor] = []
        logits = self._run(schedule, ids, mask, labels, losses)
        packed = torch.empty(1 + rows * self.labels, device=self.env.device)
        if self.stage.last:  # equal microbatches: the mean of their means is the batch's mean
            packed = torch.cat([torch.stack(losses).mean().detach().float().reshape(1),
                                logits.detach().float().reshape(-1)])
        dist.broadcast(packed, src=self.last_rank)
        return packed[0], packed[1:].view(rows, self.labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Forward only, collective (every rank calls it once per evaluation batch): this rank's
        rows go through every stage; returns ``.logits`` of those rows."""
        if torch.is_grad_enabled():
            raise RuntimeError("PipelineModel.forward is the forward-only pipeline (evaluation, under "
                               "torch.no_grad()); a training step is forward_backward")
        env, world = self.env, self.env.world_size
        rows = torch.tensor([len(input_ids)], device=env.device)
        counts = [torch.zeros_like(rows) for _ in range(world)]
        dist.all_gather(counts, rows)
        pad = max(int(c) for c in counts)
        if len(input_ids) < pad:  # pad with the first row (forwarded, never returned)
            fill = pad - len(input_ids)
            input_ids = torch.cat([input_ids, input_ids[:1].expand(fill, -1)])
            attention_mask = torch.cat([attention_mask, attention_mask[:1].expand(fill, -1)])
        input_ids, attention_mask = input_ids.contiguous(), attention_mask.contiguous()
        ids_all = [torch.empty_like(input_ids) for _ in range(world)] if env.rank == 0 else None
        mask_all = [torch.empty_like(attention_mask) for _ in range(world)] if env.rank == 0 else None
        dist.gather(input_ids, ids_all, dst=0)
        dist.gather(attention_mask, mask_all, dst=0)
        _, schedule = self._schedule(pad * world, input_ids.shape[1], input_ids.dtype, attention_mask.dtype,
                                     train=False)
        logits = self._run(schedule, torch.cat(ids_all) if ids_all else None,
                           torch.cat(mask_all) if mask_all else None)
        mine = torch.empty(pad, self.labels, device=env.device)
        parts = list(logits.float().split(pad)) if self.stage.last else None
        dist.scatter(mine, parts, src=self.last_rank)
        return SimpleNamespace(logits=mine[:int(rows)])
