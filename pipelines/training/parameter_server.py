"""Asynchronous training, strategy ``async`` (``async-<k>``): a parameter server, no barrier between steps.
The server and the messages to and from it; the loop's side is ``pipelines.training.runtime.Asynchronous``.

Every worker (each rank of the cell) trains on the weights it last pulled; after its backward it
pushes its gradient to the server and pulls the server's weights, and goes on with its next batch:
no worker waits for another, only for the server's answer to its own push. The server applies each
gradient with its own AdamW (a copy of the loop's optimizer: the same parameter groups and settings,
and its state in the cell's checkpoints) at the learning rate the worker's scheduler gives at that
step, one update per push, in the order the pushes arrive.

Staleness: each push carries the version (server updates so far) of the weights its gradient was
computed on; applied at version ``now``, its staleness is ``now - version``. A gradient staler than
``staleness_bound`` (``async``: 4, ``async-<k>``: k) is dropped and counted, and its worker gets the
current weights. The result's ``staleness``: updates, dropped, mean, p50, p95, max, bound and the
histogram of every push of the last attempt.

Where the server runs: a thread of rank 0's process. A rank of its own would take a core of the
cell's and change its world size, so its time would not compare with a synchronous cell at the same
worker count; torch RPC pickles its messages, which the project keeps off the wire between ranks
(``pipelines.training.messages``); an actor framework's actors exist only where that framework runs,
and this strategy runs on every platform whose shared loop steps its own optimizer. The server's work
(its AdamW steps, the copies) shares rank 0's core with rank 0's own training: that is its cost.
The workers reach it on a gloo process group of their own (``new_group``), so its point-to-point
traffic never interleaves with the loop's collectives, tensors only: a header [kind, version,
learning rate] and a flat float32 vector (the gradient up, the weights down); rank 0's own pushes
are calls in its process.

Epoch end: every worker tells the server it is done with the epoch and the ranks meet
(``at_epoch_end``): rank 0 stops the server's thread, broadcasts the server's weights, and every
rank evaluates and checkpoints the same model; the next epoch's first push starts the thread again.
``comm_bytes_per_step``: every byte between the server and the other ranks (headers, gradients,
weights) / server updates (every rank's pushes).
"""

from __future__ import annotations

import logging
import threading

import torch
import torch.distributed as dist

log = logging.getLogger("pipelines.training")
PUSH, DONE = 1.0, 2.0  # header kinds
HEADER_TAG, GRADIENT_TAG, REPLY_TAG, WEIGHTS_TAG = 11, 12, 13, 14
HEADER = 3  # [kind, version, learning rate]; a reply: [version, staleness, applied]


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to("cpu", torch.float32) for t in tensors])


def load_flat(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy a flat vector into ``params`` (in order, each its own numel)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p).to(p.device, p.dtype))
            offset += p.numel()


class ParameterServer:
    """The weights, their version and the optimizer that updates them (rank 0's process)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, bound: int) -> None:
        own = list(model.parameters())
        self.params = [torch.nn.Parameter(p.detach().to("cpu", torch.float32).clone()) for p in own]
        copy_of = {id(p): q for p, q in zip(own, self.params)}
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [copy_of[id(p)] for p in g["params"]]}
                  for g in optimizer.param_groups]
        self.optimizer = type(optimizer)(groups)  # each group carries its settings (lr, decay, fused, ...)
        self.bound, self.version, self.lock = bound, 0, threading.Lock()
        self.staleness: list[int] = []  # of every push, applied or dropped
        self.dropped = 0
        self.remote_bytes = 0

    def apply(self, gradient: torch.Tensor, version: int, learning_rate: float) -> tuple[torch.Tensor, int, int, bool]:
        """One push -> (weights now, their version, the push's staleness, applied)."""
        with self.lock:
            staleness = self.version - version
            self.staleness.append(staleness)
            applied = staleness <= self.bound
            if applied:
                offset = 0
                for p in self.params:
                    p.grad = gradient[offset:offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
                for group in self.optimizer.param_groups:
                    group["lr"] = learning_rate
                self.optimizer.step()
                self.version += 1
            else:
                self.dropped += 1
            return _flat(self.params), self.version, staleness, applied

    def weights(self) -> torch.Tensor:
        with self.lock:
            return _flat(self.params)

    def summary(self) -> dict:
        """Staleness of every push: {updates (applied), dropped, bound, mean, p50, p95, max (of every push),
        max_applied (never above the bound), histogram (staleness -> pushes)}."""
        seen = sorted(self.staleness)
        if not seen:
            return {"updates": 0, "dropped": 0, "bound": self.bound}
        histogram: dict[str, int] = {}
        for s in seen:
            histogram[str(s)] = histogram.get(str(s), 0) + 1
        return {"updates": len(seen) - self.dropped, "dropped": self.dropped, "bound": self.bound,
                "mean": round(sum(seen) / len(seen), 3), "p50": seen[len(seen) // 2],
                "p95": seen[min(len(seen) - 1, int(0.95 * len(seen)))], "max": seen[-1],
                "max_applied": max((s for s in seen if s <= self.bound), default=None), "histogram": histogram}

    def serve(self, group, remote_workers: int) -> None:
        """Answer the other ranks' pushes until each said it is done with the epoch (a thread)."""
        numel = sum(p.numel() for p in self.params)
        header = torch.zeros(HEADER)
        while remote_workers:
            sender = dist.recv(header, group=group, tag=HEADER_TAG)  # from any rank
            if header[0].item() == DONE:
                remote_workers -= 1
                continue
            gradient = torch.empty(numel)
            dist.recv(gradient, src=sender, group=group, tag=GRADIENT_TAG)
            weights, version, staleness, applied = self.apply(gradient, int(header[1].item()), header[2].item())
            dist.send(torch.tensor([float(version), float(staleness), float(applied)]), dst=sender, group=group,
                      tag=REPLY_TAG)
            dist.send(weights, dst=sender, group=group, tag=WEIGHTS_TAG)
            self.remote_bytes += 4 * (2 * HEADER + 2 * numel)


# --- a worker's side (every rank but 0) ------------------------------------------------------------
def push_and_pull(group, gradient: torch.Tensor, version: int, learning_rate: float) -> tuple[torch.Tensor, int]:
    """Push this step's gradient (computed on weights of ``version``) to rank 0's server -> (its weights
    now, their version)."""
    dist.send(torch.tensor([PUSH, float(version), learning_rate]), dst=0, group=group, tag=HEADER_TAG)
    dist.send(gradient, dst=0, group=group, tag=GRADIENT_TAG)
    reply, weights = torch.zeros(HEADER), torch.empty_like(gradient)
    dist.recv(reply, src=0, group=group, tag=REPLY_TAG)
    dist.recv(weights, src=0, group=group, tag=WEIGHTS_TAG)
    return weights, int(reply[0].item())


def done_with_epoch(group) -> None:
    """Tell the server this worker pushed its last gradient of the epoch."""
    dist.send(torch.tensor([DONE, 0.0, 0.0]), dst=0, group=group, tag=HEADER_TAG)


def flat_gradient(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return _flat(p.grad if p.grad is not None else torch.zeros_like(p) for p in params)
