"""The captured step: ``WholeStep`` and ``GraphEval``, one CUDA graph per batch size (eager off CUDA)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from pipelines.training.steps import build_optimizer, forward

WARMUP_STEPS = 3  # eager steps on a side stream before a capture (lazy state, cuBLAS, compile)
MASK_SKIPS = ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa")

def _never_skip(*args, **kwargs) -> bool:
    return False  # one function object: torch.compile guards on it, it never changes


@contextmanager
def graph_safe_masks():
    """While inside: transformers never skips building the SDPA attention mask (no host sync)."""
    from transformers import masking_utils

    saved = {name: getattr(masking_utils, name) for name in MASK_SKIPS if hasattr(masking_utils, name)}
    for name in saved:
        setattr(masking_utils, name, _never_skip)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(masking_utils, name, original)


def batch_sizes(rows: int, batch_size: int) -> list[int]:
    """The epoch's batch sizes as the loop's DataLoader (drop_last=False) yields them."""
    full, last = divmod(rows, batch_size)
    return [batch_size] * full + ([last] if last else [])


def schedule_table(optimizer, scheduler, total_steps: int) -> list[float]:
    """The lr of steps 0..total_steps as the project's LambdaLR sets it, shared by every group."""
    tables = {tuple(group["initial_lr"] * fn(step) for step in range(total_steps + 1))
              for group, fn in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True)}
    if len(tables) != 1:
        raise ValueError("the whole step needs one learning-rate schedule for every param group")
    return list(tables.pop())


def _zeros(device, dtype=torch.float64) -> torch.Tensor:
    return torch.zeros((), dtype=dtype, device=device)


@torch.no_grad()
def _load(params: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    for param, value in zip(params, values, strict=True):
        param.copy_(value)


class _Captured:
    """A function of a batch size (the subclass's ``_body``), replayed from a CUDA graph once
    ``_capture`` ran for that size; run eagerly otherwise."""

    def __init__(self, device: torch.device, use_graphs: bool) -> None:
        self.device, self.use_graphs = device, use_graphs and device.type == "cuda"
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.cursor = _zeros(device, torch.long)

    def _capture(self, sizes: list[int], warmup: int) -> float:
        """Warm-up runs on a side stream, then one graph per size (the cursor reset each time),
        the attention masks always built; -> seconds (0 and nothing done without graphs)."""
        if not self.use_graphs:
            return 0.0
        start, stream = time.perf_counter(), torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with graph_safe_masks():
            with torch.cuda.stream(stream):
                for size in sizes:
                    for _ in range(warmup):
                        self.cursor.zero_()
                        self._body(size)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            for size in sizes:
                self.cursor.zero_()
                self.graphs[size] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graphs[size]):
                    self._body(size)
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def _run(self, size: int) -> None:
        graph = self.graphs.get(size)
        if graph is not None:
            graph.replay()
        else:
            with graph_safe_masks():
                self._body(size)


class WholeStep(_Captured):
    """The loop's step over device-resident ``data`` (ids, mask, labels). ``model``: the
    parameters' owner; ``module``: what the step calls (the model or a wrapper with its
    parameters: autocast, ``torch.compile``)."""

    def __init__(self, model, module, config, total_steps: int, data: tuple[torch.Tensor, ...],
                 batch_size: int, device: torch.device, *, use_graphs: bool = True) -> None:
        super().__init__(device, use_graphs)
        self.model, self.module = model, module
        self.optimizer, self.scheduler = build_optimizer(model, config, total_steps, fused=True, capturable=True)
        self.lr_values = schedule_table(self.optimizer, self.scheduler, total_steps)
        self.lr_table = torch.tensor(self.lr_values, dtype=torch.float32, device=device)
        self.lr = self.lr_table[0].clone()
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr  # one device tensor, set inside the step
        self.data = tuple(t.to(device) for t in data)
        self.order = torch.zeros(len(self.data[0]), dtype=torch.long, device=device)
        self.offsets = torch.arange(batch_size, device=device)
        self.step_count = _zeros(device, torch.long)
        self.loss_sum, self.acc_sum, self.steps_done = _zeros(device), _zeros(device), 0

    def set_order(self, order: torch.Tensor) -> None:
        """The epoch's row order (the sampler's indices); the cursor back to its start."""
        if len(order) > len(self.order):  # a longer order (the check's): before any capture only
            if self.graphs:
                raise ValueError("the captured graphs read the order buffer: it cannot grow")
            self.order = torch.zeros(len(order), dtype=torch.long, device=self.device)
        self.order[:len(order)].copy_(order.to(self.device))
        self.cursor.zero_()

    def _body(self, size: int) -> None:
        rows = self.order.index_select(0, self.cursor + self.offsets[:size])
        batch = tuple(t.index_select(0, rows) for t in self.data)
        self.optimizer.zero_grad(set_to_none=True)  # at capture: the graph allocates the grads
        loss, logits, labels = forward(self.module, batch, self.device)
        loss.backward()
        index = self.step_count.clamp(max=len(self.lr_values) - 1).view(1)
        self.lr.copy_(self.lr_table.index_select(0, index).view(()))  # the scheduler's lr of this step
        self.optimizer.step()
        self.step_count += 1
        self.cursor += size
        self.loss_sum += loss.detach()
        self.acc_sum += (logits.argmax(-1) == labels).double().mean()

    def prepare(self, sizes: list[int], warmup: int = WARMUP_STEPS) -> float:
        """CUDA: capture one graph per batch size, then undo what the warm-up steps changed (the
        parameters, AdamW's state, the counters); elsewhere nothing. -> seconds taken."""
        if not self.use_graphs:
            return 0.0
        start, params = time.perf_counter(), list(self.model.parameters())
        initial = [p.detach().clone() for p in params]
        self._capture(sizes, warmup)
        _load(params, initial)
        state = [value for values in self.optimizer.state.values() for value in values.values()]
        for tensor in state + [self.step_count, self.cursor, self.loss_sum, self.acc_sum]:
            tensor.zero_()  # AdamW's state as its first step creates it: zeros
        self.lr.copy_(self.lr_table[0])
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def step(self, size: int) -> None:
        self._run(size)
        self.steps_done += 1

    def take_sums(self) -> tuple[float, float]:
        """(train loss sum, train accuracy sum) over the steps since the last call (one read)."""
        loss_sum, acc_sum = torch.stack([self.loss_sum, self.acc_sum]).tolist()
        self.loss_sum.zero_(), self.acc_sum.zero_()
        return loss_sum, acc_sum

    @property
    def learning_rate(self) -> float:
        """The lr of the next step (what the loop records: ``scheduler.get_last_lr()``)."""
        return self.lr_values[min(self.steps_done, len(self.lr_values) - 1)]

    def scheduler_state(self) -> dict:
        """The project's scheduler's state as if it had been stepped ``steps_done`` times."""
        return {**self.scheduler.state_dict(), "last_epoch": self.steps_done, "_step_count": self.steps_done + 1,
                "_last_lr": [self.learning_rate] * len(self.optimizer.param_groups)}


class GraphEval(_Captured):
    """``steps.evaluate`` (eval mode, no_grad, rows in order) over device-resident ``data``."""

    def __init__(self, module, data: tuple[torch.Tensor, ...], batch_size: int, device: torch.device,
                 *, use_graphs: bool = True) -> None:
        super().__init__(device, use_graphs)
        self.module, self.data = module, tuple(t.to(device) for t in data)
        self.sizes = batch_sizes(len(self.data[0]), batch_size)
        self.offsets = torch.arange(batch_size, device=device)
        self.loss_sum, self.correct = _zeros(device), _zeros(device, torch.long)

    def _body(self, size: int) -> None:
        batch = tuple(t.index_select(0, self.cursor + self.offsets[:size]) for t in self.data)
        loss, logits, labels = forward(self.module, batch, self.device)
        self.loss_sum += loss.double() * size
        self.correct += (logits.argmax(-1) == labels).sum()
        self.cursor += size

    @contextmanager
    def _eval_mode(self):
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.module.train(was_training)

    def prepare(self, warmup: int = 2) -> float:
        with self._eval_mode():
            return self._capture(sorted(set(self.sizes), reverse=True), warmup)

    def run(self) -> tuple[float, int, int]:
        """-> (loss sum, correct, count), as ``steps.evaluate`` returns them."""
        for tensor in (self.cursor, self.loss_sum, self.correct):
            tensor.zero_()
        with self._eval_mode():
            for size in self.sizes:
                self._run(size)
        return self.loss_sum.item(), int(self.correct.item()), sum(self.sizes)
