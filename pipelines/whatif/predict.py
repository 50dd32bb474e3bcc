"""Asking the what-if model: each platform's total on a stated cluster, device and job.

``predict(model, target)`` builds a cell of ``target.hosts`` x ``target.workers_per_host`` ranks
for every fitted platform (``pipelines.whatif.model``) and sums its terms:

    total = provision + launch + teardown + warm-up + other          (paid once)
          + epochs x steps x (compute + communication + data)      (per step)
          + epochs x (held-out evaluation + checkpoint)             (per epoch)
          + final test + export                                     (at the end)

with steps = ceil(train reviews / (ranks x per-rank batch)). The device: ``step_ms`` (the target's
training step for this model and per-rank batch) scales compute and evaluation against this run's
own (a device k times slower is the same model with a k times longer step); without it the run's
own device, at the cores each rank gets; the all-reduce's own work (not its wire time) scales with
the device too (on CPU it is gloo's copies and sums). ``cpu_share`` scales what runs on the hosts' CPUs
(data wait, checkpoints, warm-up and the fixed terms), assumed fully CPU-bound. The interval is
+-1.96 sd of the sum, each term's variance from its fit and the spread of the cells around it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipelines.config.sections import WhatIfConfig
from pipelines.whatif.model import (DEFAULT_STRATEGY, FIXED_TERMS, Model, PlatformTerms, fixed_x, key_of, local_x,
                                    net_x)
from pipelines.whatif.observe import rate_bps

Z95 = 1.96
# payload of a strategy the run has no cell of, as a share of the default strategy's
PAYLOAD_SHARE = {"fp16": 0.5, "bf16": 0.5}
PHASES = ("provision", "launch", "teardown", "warm-up", "compute", "communication", "data", "evaluation",
          "checkpoint", "other")


COLUMN_TEXT = {"multihost": "one host against several", "hosts-2": "the host count beyond 2", "wph-1": "the ranks per host", "reviews": "the reviews per rank",
               "ring_payload": "the all-reduce's bytes (payload x ring factor)", "wire": "the link rate",
               "1": "the device"}


class WhatIfError(ValueError):
    """A question the model cannot answer: the message names what is missing."""


@dataclass
class Prediction:
    """One platform's predicted cell on the target."""

    key: str
    platform: str
    strategy: str
    total: float
    sd: float
    phases: dict[str, float]
    steps_per_epoch: int
    notes: list[str] = field(default_factory=list)

    @property
    def low(self) -> float:
        return max(0.0, self.total - Z95 * self.sd)

    @property
    def high(self) -> float:
        return self.total + Z95 * self.sd

    @property
    def fixed(self) -> float:
        return sum(self.phases[p] for p in ("provision", "launch", "teardown"))

    def as_json(self) -> dict:
        return {"key": self.key, "platform": self.platform, "strategy": self.strategy, "total_seconds": self.total,
                "low_seconds": self.low, "high_seconds": self.high, "sd_seconds": self.sd,
                "fixed_seconds": self.fixed, "fixed_share": self.fixed / self.total if self.total else None,
                "steps_per_epoch": self.steps_per_epoch, "phases": self.phases, "notes": self.notes}


def payload(model: Model, platform: str, strategy: str) -> float | None:
    """Bytes per rank and step the strategy hands to the all-reduce: measured where a cell of it
    ran (any platform), else the default strategy's at the strategy's known share."""
    own = [p.payload_bytes for p in model.platforms.values() if p.strategy == strategy and p.payload_bytes]
    if own:
        mine = model.platforms.get(key_of(platform, strategy))
        return mine.payload_bytes if mine and mine.payload_bytes else own[0]
    base = [p.payload_bytes for p in model.platforms.values() if p.strategy == DEFAULT_STRATEGY and p.payload_bytes]
    share = PAYLOAD_SHARE.get(strategy.split("-")[0])
    return base[0] * share if base and share is not None else (base[0] if base else None)


def _terms(model: Model, platform: str, strategy: str) -> tuple[PlatformTerms, list[str]]:
    """The platform's terms for ``strategy``: its own, else its default strategy's (the payload then
    says what the strategy changes)."""
    own = model.platforms.get(key_of(platform, strategy))
    if own is not None:
        return own, []
    base = model.platforms.get(platform)
    if base is None:
        raise WhatIfError(f"no finished cell of platform {platform!r} to predict it from")
    return base, [f"{strategy}: the default strategy's terms with {strategy}'s payload"]


def _device_factor(model: Model, target: WhatIfConfig, workers_per_host: int) -> float:
    """Seconds per review on one target rank over this run's whole-rank seconds per review."""
    if target.step_ms is not None:
        return target.step_ms / 1000.0 / model.batch_per_worker / model.device_review_seconds
    cores = model.cores_per_host * (target.cpu_share or 1.0)
    return 1.0 / min(1.0, cores / workers_per_host) if model.device == "cpu" else 1.0


def predict_one(model: Model, platform: str, target: WhatIfConfig, strategy: str = DEFAULT_STRATEGY,
                batch_per_worker: int | None = None, payload_bytes: float | None = None) -> Prediction:
    """``platform`` (with ``strategy``) on ``target``'s cluster, device and job; ``payload_bytes``:
    what the strategy hands to the all-reduce per rank and step, where known (else ``payload``)."""
    pt, notes = _terms(model, platform, strategy)
    t = pt.terms
    hosts, wph = target.hosts, target.workers_per_host
    ranks, job = hosts * wph, target.job
    batch = batch_per_worker or model.batch_per_worker
    steps = max(1, math.ceil(job.train_samples / (ranks * batch)))
    units = job.epochs * steps
    device = _device_factor(model, target, wph)
    host_cpu = 1.0 / target.cpu_share if target.cpu_share else 1.0
    rate = rate_bps(target.network)
    values: dict[str, float] = {}
    variance = 0.0
    constant_along: dict[str, list[str]] = {}  # a column the cells did not vary -> the terms that needed it

    def add(phase: str, name: str, x: dict[str, float], scale: float = 1.0, independent: bool = False) -> None:
        nonlocal variance
        term = t.get(name) if name in t else None
        if term is None:
            notes.append(f"{name}: no cell measured it: taken as 0")
            return
        for col in term.missing(x) if any(term.coef) else []:
            constant_along.setdefault(col, []).append(name)
        values[phase] = values.get(phase, 0.0) + scale * term.value(x)
        variance += term.var(x, scale, independent)

    one = {"1": 1.0}
    for name in FIXED_TERMS:
        add(name, name, fixed_x(hosts, wph), host_cpu)
    add("warm-up", "warmup", one, host_cpu)
    add("other", "other", one, host_cpu)
    add("compute", "compute", one, units * batch * device)
    add("data", "data", one, units * host_cpu)
    if ranks > 1:
        bytes_ = payload_bytes or payload(model, platform, strategy)
        known = payload_bytes or strategy == DEFAULT_STRATEGY or strategy.split("-")[0] in PAYLOAD_SHARE or any(
            p.strategy == strategy and p.payload_bytes for p in model.platforms.values())
        if not known:
            notes.append(f"{strategy}'s payload: no cell of it measured one: the default strategy's taken (an upper bound)")
        if bytes_ is None:
            notes.append("communication: no cell measured a payload: taken as 0")
        elif hosts > 1 and model.network is not None and f"1@{platform}" in model.network.columns:
            x = net_x(platform, ranks, bytes_, rate, device)
            for col in model.network.missing(x):
                constant_along.setdefault(col, []).append("communication")
            values["communication"] = units * model.network.value(x)
            variance += model.network.var(x, units)
        else:
            if hosts > 1:
                notes.append(f"communication: no multi-host cell of {platform}: its one-host cost plus the wire time")
                values["communication"] = units * model.link_seconds(ranks, bytes_, rate)
            add("communication", "comm_local", local_x(ranks, bytes_, device), units)
    add("evaluation", "evaluation", {"reviews": job.train_samples / ranks * device, "1": 1.0}, job.epochs,
        independent=True)
    if job.test_samples:
        add("evaluation", "final_test", {"reviews": job.test_samples / ranks * device, "1": 1.0})
    add("checkpoint", "checkpoint", one, job.epochs * host_cpu, independent=True)
    add("checkpoint", "export", one, host_cpu)
    for col, names in constant_along.items():
        notes.append(f"{', '.join(names)}: the cells did not vary {COLUMN_TEXT.get(col.split('@')[0], col)}: "
                     "taken as constant along it")
    phases = {p: max(0.0, values.get(p, 0.0)) for p in PHASES}
    return Prediction(key=key_of(platform, strategy), platform=platform, strategy=strategy,
                      total=sum(phases.values()), sd=math.sqrt(variance), phases=phases, steps_per_epoch=steps,
                      notes=list(dict.fromkeys(notes)))


def predict(model: Model, target: WhatIfConfig) -> list[Prediction]:
    """Every fitted platform of the default strategy (else every key) on ``target``, fastest first."""
    keys = [p for p in model.platforms.values() if p.strategy == DEFAULT_STRATEGY] or list(model.platforms.values())
    return sorted((predict_one(model, p.platform, target, p.strategy) for p in keys), key=lambda p: p.total)


def calibrated(model: Model, target: WhatIfConfig, reference: str) -> WhatIfConfig:
    """``target`` with ``step_ms`` set so that ``reference`` takes ``target.reference_seconds`` for
    the job on ``reference_workers`` hosts of one rank (the total is linear in the step); unchanged
    when it states its step or no reference time."""
    if target.step_ms is not None or target.reference_seconds is None:
        return target
    if reference not in model.platforms:
        raise WhatIfError(f"calibrating to {reference}'s {target.reference_seconds:g} s needs a finished "
                          f"{reference} cell in the run")
    at = dict(hosts=target.reference_workers, workers_per_host=1)
    low = predict_one(model, reference, target.model_copy(update={**at, "step_ms": 1.0})).total
    high = predict_one(model, reference, target.model_copy(update={**at, "step_ms": 2.0})).total
    step = 1.0 + (target.reference_seconds - low) / (high - low)
    if step <= 0:
        raise WhatIfError(f"{reference}'s costs that do not depend on the device already take {low:.0f} s, more "
                          f"than reference_seconds={target.reference_seconds:g}: no step fits")
    return target.model_copy(update={"step_ms": step})


def separated(a: Prediction, b: Prediction) -> bool:
    """Their 95 % intervals do not overlap: one is faster beyond what the fit and repeats allow."""
    return a.high < b.low or b.high < a.low


# --- where the order of two platforms changes ------------------------------------------------------------

RATES_BPS = [10 ** (6 + k / 8) for k in range(41)]  # 1 Mbit/s .. 100 Gbit/s
HOST_COUNTS = [*range(1, 17), 24, 32, 48, 64, 96, 128]


def _rate_text(bps: float) -> str:
    return f"{bps / 1e9:.3g} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:.3g} Mbit/s"


def _network(bps: float) -> str:
    return f"{bps / 1e6:.6g}mbit"


def _crossings(xs: list[float], diffs: list[float]) -> list[float]:
    """Every x where ``diffs`` changes sign (linearly interpolated between the grid's points)."""
    return [x0 + (x1 - x0) * d0 / (d0 - d1) for (x0, d0), (x1, d1) in zip(zip(xs, diffs), zip(xs[1:], diffs[1:]))
            if d0 * d1 < 0]


def order_changes(model: Model, target: WhatIfConfig, predictions: list[Prediction]) -> list[str]:
    """For each pair of platforms (the first the faster on ``target``): the job length (epochs), link
    rates and host counts at which their order flips, within 1-100,000 epochs, 1 Mbit/s-100 Gbit/s
    and 1-128 hosts (a host count beyond those measured is said so)."""
    lines = []
    measured = max((o.hosts for o in model.observations), default=1)
    for i, a in enumerate(predictions):
        for b in predictions[i + 1:]:
            found = []

            def total(pred: Prediction, **update) -> float:
                return predict_one(model, pred.platform, target.model_copy(update=update), pred.strategy).total

            e = target.job.epochs
            longer = target.job.model_copy(update={"epochs": 2 * e})
            slope_a = (total(a, job=longer) - a.total) / e
            slope_b = (total(b, job=longer) - b.total) / e
            if slope_a != slope_b:
                cross = e + (b.total - a.total) / (slope_a - slope_b)
                if 1 <= cross <= 100_000:
                    first, second = (a, b) if slope_a > slope_b else (b, a)  # faster below the crossing
                    found.append(f"{first.key} is faster below {cross:,.1f} epochs of this job, {second.key} above")
            rates = _crossings(RATES_BPS, [total(a, network=_network(x)) - total(b, network=_network(x))
                                           for x in RATES_BPS])
            if rates:
                found.append(f"the order flips at {', '.join(_rate_text(r) for r in rates)} links")
            hosts = [min(h for h in HOST_COUNTS if h > x)  # hosts come whole: the first count past it
                     for x in _crossings(HOST_COUNTS, [total(a, hosts=h) - total(b, hosts=h) for h in HOST_COUNTS])]
            if hosts:
                beyond = f" (beyond the {measured} hosts measured)" if max(hosts) > measured else ""
                found.append(f"the order flips from {', '.join(map(str, hosts))} hosts{beyond}")
            if found:
                noise = "" if separated(a, b) else " (within noise on this cluster)"
                lines.append(f"{a.key} faster than {b.key} here{noise}: " + "; ".join(found))
    return lines
