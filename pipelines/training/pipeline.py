"""Pipeline parallelism, strategy ``pipeline-<microbatches>``: the model's layers split over the ranks.

Each rank holds one stage of BERT (``torch.distributed.pipelining``, in the pinned torch): the
embeddings and the first encoder layers on rank 0, the following layers on the following ranks,
the last layers and the classifier head (pooler, dropout, classifier) on the last rank; 2 stages
at 2 workers (the stages and the schedule: ``pipelines.training.pipeline_stages``; here the data,
the gathers and the runtime). The stages are built by hand, not traced: ``split_model`` prunes the
modules a rank does not hold out of the full model, in place, before the loop builds its optimizer
(each rank's AdamW holds its own stage only), and ``BertStage`` runs the ones it holds. Between two stages
travel the hidden states (rows x seq x hidden, float32) and the attention mask (rows x seq, the
loader's int64: a tensor, from which each stage builds the encoder's attention bias as
``BertModel`` does); backward sends the hidden states' gradients back. The stages are given their
shapes (static metadata), so no stage pickles its shapes to a peer (dynamic inference would,
with ``send_object_list``).

Schedule: GPipe (``ScheduleGPipe``): every microbatch forward, then every microbatch backward.
With 2 stages its bubble, (S - 1) / (m + S - 1) of a step, is 1F1B's; 1F1B's gain is memory (it
holds S microbatches' activations, GPipe m), which BERT-tiny does not need (m x rows x seq x
hidden floats: a few MB), and GPipe runs any microbatch count, also the fewer that an epoch's
last, short batch is split into (1F1B wants m >= S). Its sends are all-forward, then
all-backward: no mixed send/receive batches on gloo.

Data: the pipeline's global batch is DDP's at the same world size, row for row. Every rank loads
the concatenation of what each DDP rank's sampler gives that rank for the step
(``GlobalBatchSampler``: rank 0's batch, then rank 1's, ...), so the first stage has the ids and
masks of every row and the last stage their labels. The batch is split into
``pipeline_microbatches`` equal microbatches (the global batch must divide: refused otherwise; an
epoch's last, shorter batch takes the largest count not above it that divides its rows); the loss
is a mean per microbatch and the schedule divides the gradients by the count (``scale_grads``),
so a step's gradient is the mean over the global batch, as DDP's all-reduced one is.

Step: ``PipelineModel.forward_backward`` is the schedule's step, which ``steps.train_step`` runs
instead of the loop's forward and the engine's backward; the engine's zero_grad, optimizer step and
scheduler step are unchanged. The last stage then broadcasts the step's loss and logits to every
rank for the loop's train metrics (4 + rows x labels x 4 bytes, not counted below). Evaluation: ``PipelineModel.forward`` is collective: every
rank's evaluation batch is gathered to the first stage (padded to the largest), run through the
stages forward only, and the logits scattered back to the rank that holds those rows; the loop's
``evaluate`` runs unchanged, each rank padded to the same number of batches (as FSDP's).

Checkpoints and the final model: the stages' state dicts and AdamW states are gathered to rank 0
as one process would have them (``gather_to_rank0``: shapes as JSON, then the tensors into
buffers of those shapes; nothing a peer sends is unpickled), so they load like DDP's, and a
resume at any world size splits them again; the final model is rebuilt whole on rank 0 for its
test and export.

Bytes: ``comm_bytes_per_step`` = every byte one stage sent another during the training steps
(activations, masks and activation gradients, counted on the P2P operations the schedule
issues, summed over the ranks) / optimizer steps. No gradient is all-reduced: each parameter lives
on one rank. Time: the schedule's waits on its P2P operations are not split out (they count as
compute, as FSDP's collectives do).

Refused (``TrainingStrategy.pipeline_refusal``; before the run where the config says enough,
else here with the same words): FSDP, comm hooks, local SGD (the config); one worker (nothing to
split); more workers than encoder layers (one stage per worker, a layer at least per stage); a
global batch that does not divide into the microbatches; a launcher that replaced the loop's
loader (a platform whose feed gives each rank only its own rows refuses the strategy).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Sampler

from pipelines.config import TrainingStrategy
from pipelines.training import strategies
from pipelines.training.messages import all_gather_json
from pipelines.training.pipeline_stages import PipelineModel, split_model
from pipelines.training.record import TrainingRecord

if TYPE_CHECKING:  # the seam (distributed.py) picks this runtime: nothing of it imported here
    from pipelines.training.distributed import DistEnv

log = logging.getLogger("pipelines.training")
SCHEDULE = "GPipe"


# --- data -----------------------------------------------------------------------------------------
class GlobalBatchSampler(Sampler[int]):
    """The rows of every DDP rank's batch as one batch: for step i, rank 0's i-th batch of its
    sampler, then rank 1's, ... (a loader of ``batch_size`` x ranks rows cuts exactly there).
    ``set_epoch`` reseeds every rank's sampler; its length is every rank's rows together."""

    def __init__(self, samplers: list[Sampler[int]], batch_size: int) -> None:
        self.samplers, self.batch_size = samplers, batch_size

    def set_epoch(self, epoch: int) -> None:
        for sampler in self.samplers:
            sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        shares = [list(s) for s in self.samplers]
        b = self.batch_size
        for i in range(math.ceil(len(shares[0]) / b)):
            for share in shares:
                yield from share[i * b:(i + 1) * b]

    def __len__(self) -> int:
        return sum(len(s) for s in self.samplers)


# --- gathering the stages -------------------------------------------------------------------------
def gather_to_rank0(local: dict[str, torch.Tensor], env: DistEnv) -> dict[str, torch.Tensor]:
    """Every rank's named tensors, merged on rank 0 (on CPU); {} on the other ranks (a collective).
    Names, shapes and dtypes travel as JSON; the tensors are received into buffers of those shapes."""
    metas = all_gather_json({k: [list(t.shape), str(t.dtype).removeprefix("torch.")] for k, t in local.items()}, env)
    out = {k: t.detach().cpu().clone() for k, t in local.items()} if env.is_main else {}
    for src in range(1, env.world_size):
        for key, (shape, dtype_name) in metas[src].items():
            if env.rank == src:
                dist.send(local[key].detach().contiguous(), dst=0)
            elif env.is_main:
                dtype = getattr(torch, dtype_name, None)
                if not isinstance(dtype, torch.dtype) or key in out:
                    raise RuntimeError(f"gather_to_rank0: rank {src} announced {key!r} as {dtype_name} "
                                       "(not a dtype, or a name another rank holds)")
                buffer = torch.empty(shape, dtype=dtype, device=env.device)
                dist.recv(buffer, src=src)
                out[key] = buffer.cpu()
    return out


def _group_names(model: nn.Module, optimizer) -> list[list[str]]:
    """The parameter names of each of the optimizer's groups, in its order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]


def _full_groups(full_names: list[str], group_names: list[list[list[str]]]) -> list[list[str]]:
    """Every rank's group names (``all_gather_json`` of ``_group_names``) as one process's
    optimizer has them: each group's parameters in the full model's order."""
    groups = [set().union(*(rank[g] for rank in group_names)) for g in range(len(group_names[0]))]
    return [[n for n in full_names if n in group] for group in groups]


# --- the runtime ----------------------------------------------------------------------------------
class Pipelined:
    """``pipeline_microbatches`` > 0 on several ranks: one stage of the model per rank, trained
    with a GPipe schedule; the shared loop calls it as it calls ``pipelines.training.runtime``'s
    runtimes (same methods, same order)."""

    sharded = True  # each rank holds a part of the parameters: checkpoints gather them

    def __init__(self, strategy: TrainingStrategy, distributed, env: DistEnv,
                 class_counts: Callable[[], list[int]]) -> None:
        if env.world_size < 2:
            raise ValueError(f"strategy {strategy.name!r}: pipeline parallelism splits the model over "
                             "at least 2 workers; this cell has 1")
        self.strategy, self.distributed, self.env = strategy, distributed, env
        self.counts = class_counts() if strategy.imbalance != "none" else None
        self.loss_weights = strategies.class_weights(self.counts) if strategy.imbalance == "weighted_loss" else None
        self.pipeline: PipelineModel | None = None  # set by ``wrap``
        self.steps = 0
        self._sent_all_ranks = 0.0  # training-step bytes every stage sent, as of the last epoch end

    # --- data -----------------------------------------------------------------------------
    def prepare_loader(self, loader: DataLoader) -> DataLoader:
        """The loop's per-rank loader -> one of global batches: every DDP rank's rows of a step."""
        rows = loader.batch_size * self.env.world_size
        refusal = self.strategy.pipeline_refusal(self.env.world_size, rows)
        if refusal:
            raise ValueError(refusal)
        seed = loader.sampler.seed
        samplers = [strategies.train_sampler(self.strategy, loader.dataset, self.env.world_size, r, seed,
                                             self.counts) for r in range(self.env.world_size)]
        sampler = GlobalBatchSampler(samplers, loader.batch_size)
        prepared = self.distributed.prepare_loader(DataLoader(loader.dataset, batch_size=rows, sampler=sampler),
                                                   self.env)
        if prepared.sampler is not sampler:
            raise RuntimeError(f"strategy {self.strategy.name!r}: {type(self.distributed).__name__}.prepare_loader "
                               f"replaced the loader (its sampler is {type(prepared.sampler).__name__}); every "
                               "pipeline stage needs the rows of the whole global batch")
        return prepared

    def samples_per_epoch(self, loader: DataLoader) -> int:
        return len(loader.sampler)  # every rank loads every rank's rows

    def eval_batches(self, rows: int, batch_size: int) -> int | None:
        # every forward is collective: every rank runs as many as the rank with the largest share
        return math.ceil(math.ceil(rows / self.env.world_size) / batch_size)

    # --- model ----------------------------------------------------------------------------
    def shard(self, model: nn.Module) -> None:
        """Before the optimizer is built: prune the model to this rank's stage."""
        config = model.config
        self._full_names = [n for n, _ in model.named_parameters()]
        self._full_keys = list(model.state_dict())
        layers = len(model.bert.encoder.layer) if hasattr(model, "bert") else None  # None: split_model says
        refusal = self.strategy.pipeline_refusal(self.env.world_size, layers=layers)
        if refusal:
            raise ValueError(refusal)
        self._stage = split_model(model, self.env.rank, self.env.world_size)
        self._shape = (config.hidden_size, config.num_labels)

    def wrap(self, model: nn.Module, steps_done: int) -> PipelineModel:
        self.pipeline = PipelineModel(self._stage, self.env, self.strategy.pipeline_microbatches, *self._shape)
        held = all_gather_json([sum(p.numel() for p in model.parameters()), list(self._stage.layers)], self.env)
        if self.env.is_main:
            log.info("strategy %s: %d stages (%s, %d microbatches a batch): %s", self.strategy.name,
                     self.env.world_size, SCHEDULE, self.strategy.pipeline_microbatches,
                     "; ".join(f"rank {r}: layers {ls}, {n} parameters" for r, (n, ls) in enumerate(held)))
        return self.pipeline

    def load_optimizer_state(self, model: nn.Module, optimizer, state: dict) -> None:
        """Resume: this stage's part of a full optimizer state dict (as ``checkpoint_state`` wrote
        it, or one process's). A collective: every rank's group names travel as JSON."""
        groups = _full_groups(self._full_names, all_gather_json(_group_names(model, optimizer), self.env))
        full_id = {n: i for i, n in enumerate(n for group in groups for n in group)}
        local_groups, local_state, i = [], {}, 0
        for full_group, names in zip(state["param_groups"], _group_names(model, optimizer)):
            ids = []
            for name in names:
                if full_id[name] in state["state"]:
                    local_state[i] = state["state"][full_id[name]]
                ids.append(i)
                i += 1
            local_groups.append({**full_group, "params": ids})
        optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})

    # --- steps (``steps.train_step`` calls ``PipelineModel.forward_backward``) ---------------
    def after_step(self, record: TrainingRecord) -> None:
        self.steps += 1

    def at_epoch_end(self, record: TrainingRecord) -> None:
        """Every rank: the bytes every stage sent so far (for ``comm_bytes_per_step``)."""
        sent = torch.tensor([float(self.pipeline.sent_bytes(train=True))], dtype=torch.float64, device=self.env.device)
        dist.all_reduce(sent)
        self._sent_all_ranks = float(sent)

    # --- checkpoint and result ------------------------------------------------------------
    def checkpoint_state(self, model: nn.Module, optimizer) -> tuple[dict, dict]:
        """(model, optimizer) state dicts as one process would have them, on rank 0 ({} on the
        others; a collective): every stage's entries under the full model's keys and ids."""
        model_state = self.full_model_state(model)
        groups = _full_groups(self._full_names, all_gather_json(_group_names(model, optimizer), self.env))
        local = optimizer.state_dict()
        by_name = {name: local["state"][i] for i, name in
                   enumerate(n for names in _group_names(model, optimizer) for n in names) if i in local["state"]}
        flat = {f"{name}\t{k}": v for name, entry in by_name.items() for k, v in entry.items()}
        if any(not isinstance(v, torch.Tensor) for v in flat.values()):
            raise TypeError("pipeline: an optimizer state entry that is not a tensor cannot be gathered")
        gathered = gather_to_rank0(flat, self.env)
        if not self.env.is_main:
            return {}, {}
        ids = {n: i for i, n in enumerate(n for group in groups for n in group)}
        full_state: dict[int, dict] = {}
        for key, value in gathered.items():
            name, entry = key.split("\t")
            full_state.setdefault(ids[name], {})[entry] = value
        param_groups = [{**group, "params": [ids[n] for n in names]}
                        for group, names in zip(local["param_groups"], groups)]
        return model_state, {"state": dict(sorted(full_state.items())), "param_groups": param_groups}

    def full_model_state(self, model: nn.Module) -> dict:
        """The full model's state dict on rank 0, in its own key order ({} elsewhere; a collective)."""
        gathered = gather_to_rank0(model.state_dict(), self.env)
        if not self.env.is_main:
            return {}
        missing = [k for k in self._full_keys if k not in gathered]
        if missing:
            raise RuntimeError(f"pipeline: no stage held {missing[:3]}")
        return {k: gathered[k] for k in self._full_keys}

    def final_model(self, model: nn.Module, rebuild: Callable[[], nn.Module]) -> nn.Module:
        """The whole model on rank 0 (every stage's weights gathered; call on every rank)."""
        return strategies.whole_model_on_main(model, self.full_model_state(model), rebuild, self.env)

    @property
    def comm_bytes_per_step(self) -> float | None:
        """Bytes every stage sent another per optimizer step (activations, masks, their
        gradients; all ranks together), as of the last epoch end."""
        return self._sent_all_ranks / self.steps if self.steps else None
