"""The what-if model: every term of a cell's wall time fitted on measured cells (``observe``).

Per platform and strategy (a ``key``: "<platform>", "<platform>/fp16"), each term is a least-squares fit of
what the cells measured on what they varied, kept with its covariance and the residual spread of
one cell around it, so a prediction carries an interval (``Term.var``):

=================  ===================================  ============================================
term               fitted as                            from
=================  ===================================  ============================================
provision, launch  a + b [hosts > 1] + c (ranks/host-1) the phase of each cell (agents start on every
teardown             + d (hosts - 2)                    host at once: a step to several hosts, then
                                                        what grows with their number, where measured)
other, warm-up     a constant                           what no phase owns; first epoch - steady
compute            seconds per review on a whole rank   compute / steps / per-rank batch x rank share
data               seconds per step                     data / steps
communication      one host: a + l x ring x payload     communication / steps (ring = 2(N-1)/N);
                   hosts: a_p + l_p ring payload        a and l are the all-reduce's work on the
                   + g x ring x payload x 8 / rate      ranks' device (gloo's copies and sums on a
                                                        CPU): they scale with it, the wire does not;
                                                        one fit over every platform: g = 1 / link
                                                        efficiency (the prior 0.87 where no two
                                                        link rates separate it)
evaluation         a x reviews per rank (device) + b    each epoch's held-out evaluation
final test         a x test reviews per rank + b        evaluation beyond the epochs
checkpoint         a constant per epoch; the export     each epoch's; checkpoint beyond the epochs
=================  ===================================  ============================================

A column the cells do not vary (every cell on one host: no ``hosts - 1``) is left out of the fit and
its term taken as constant along it; ``notes`` say so for each prediction that leans on it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from pipelines.whatif.observe import Observation, ring_factor

MODEL_VERSION = 2  # 2: fixed terms step to several hosts (a saved model of another version is fitted again)
# What bench/RESULTS.md measured of a shaped emulated link: 87 % of 100 Mbit/s carried as payload;
# used where the cells do not separate the link efficiency from the per-step constant
LINK_EFFICIENCY_PRIOR = 0.87
# a term fitted on no more cells than it has parameters has no residual: its one-sd spread is
# taken as this share of its value (the report says so)
NO_RESIDUAL_SHARE = 0.10
FIXED_TERMS = ("provision", "launch", "teardown")
DEFAULT_STRATEGY = "default"


@dataclass
class Term:
    """One fitted linear term: value = sum of coef x column; ``cov`` the coefficients' covariance,
    ``sigma`` the spread of one observation around the fit (None: no residual to measure it)."""

    columns: list[str]
    coef: list[float]
    cov: list[list[float]] | None
    sigma: float | None
    n: int
    mean: float  # of the observations (the scale of NO_RESIDUAL_SHARE)

    def value(self, x: dict[str, float]) -> float:
        return float(sum(c * x.get(col, 0.0) for col, c in zip(self.columns, self.coef)))

    def var(self, x: dict[str, float], units: float = 1.0, independent: bool = False) -> float:
        """Variance of ``units`` x this term for a new cell: the fit's (coefficients' covariance) plus
        one cell's spread around it, relative (timing noise grows with what is timed: a term scaled to
        a faster device spreads less in seconds) (``independent``: each unit varies on its own, as epochs do)."""
        value = self.value(x)
        if self.sigma is None or self.cov is None:
            return (units * NO_RESIDUAL_SHARE * abs(value)) ** 2
        v = np.array([x.get(col, 0.0) for col in self.columns])
        fit_var = float(v @ np.array(self.cov) @ v)
        sd = self.sigma / abs(self.mean) * abs(value) if self.mean else self.sigma
        noise = units * sd ** 2 if independent else units ** 2 * sd ** 2
        return units ** 2 * fit_var + noise

    def missing(self, x: dict[str, float]) -> list[str]:
        """Columns ``x`` sets that the fit could not (kept out: the cells did not vary them)."""
        return [col for col, value in x.items() if value and col not in self.columns and col != "1"]

    def as_json(self) -> dict:
        return {"columns": self.columns, "coef": self.coef, "cov": self.cov, "sigma": self.sigma, "n": self.n,
                "mean": self.mean}


def fit_term(rows: list[dict[str, float]], y: list[float], columns: list[str]) -> Term | None:
    """Least squares of ``y`` on ``columns`` (in order of priority: a column that adds no rank to
    those before it is left out); None without rows."""
    if not rows:
        return None
    kept: list[str] = []
    for col in columns:
        trial = np.array([[r.get(c, 0.0) for c in kept + [col]] for r in rows], dtype=float)
        if np.linalg.matrix_rank(trial, tol=1e-9 * max(1.0, float(np.abs(trial).max()))) == len(kept) + 1:
            kept.append(col)
    X = np.array([[r.get(c, 0.0) for c in kept] for r in rows], dtype=float)
    Y = np.array(y, dtype=float)
    if not kept:
        return Term([], [], None, None, len(rows), float(Y.mean()))
    coef, *_ = np.linalg.lstsq(X, Y, rcond=None)
    dof = len(rows) - len(kept)
    if dof <= 0:
        return Term(kept, coef.tolist(), None, None, len(rows), float(Y.mean()))
    sigma2 = float(((Y - X @ coef) ** 2).sum()) / dof
    cov = (np.linalg.pinv(X.T @ X) * sigma2).tolist()
    return Term(kept, coef.tolist(), cov, math.sqrt(sigma2), len(rows), float(Y.mean()))


def term_from_json(data: dict | None) -> Term | None:
    return None if data is None else Term(**data)


def key_of(platform: str, strategy: str) -> str:
    return platform if strategy == DEFAULT_STRATEGY else f"{platform}/{strategy}"


def fixed_x(hosts: int, workers_per_host: int) -> dict[str, float]:
    """Columns of a fixed term: a platform's agents start on every host at once, so going from one host
    to several costs a step (cross-host rendezvous, a remote cluster), and each host beyond two what
    grows with their number; ranks per host start on their host."""
    return {"1": 1.0, "multihost": float(hosts > 1), "hosts-2": float(max(0, hosts - 2)),
            "wph-1": float(workers_per_host - 1)}


def wire_seconds(ranks: int, payload: float, rate_bps: float | None) -> float:
    """Seconds a ring all-reduce of ``payload`` bytes needs on a link of ``rate_bps`` at full efficiency."""
    return 0.0 if rate_bps is None else ring_factor(ranks) * payload * 8.0 / rate_bps


def net_x(platform: str, ranks: int, payload: float, rate_bps: float | None, device: float = 1.0) -> dict[str, float]:
    """The joint cross-host communication fit's columns for one cell of ``platform``: the per-step
    and per-byte work of the all-reduce runs on the ranks' device (``device``: seconds there per
    second on a whole rank of the fitted cells), the wire time on the link."""
    return {f"1@{platform}": device, f"ring_payload@{platform}": ring_factor(ranks) * payload / 1e6 * device,
            "wire": wire_seconds(ranks, payload, rate_bps)}


def local_x(ranks: int, payload: float, device: float = 1.0) -> dict[str, float]:
    """The one-host communication fit's columns (loopback: no wire, all device work)."""
    return {"1": device, "ring_payload": ring_factor(ranks) * payload / 1e6 * device}


@dataclass
class PlatformTerms:
    """The fitted terms of one platform x strategy."""

    key: str
    platform: str
    strategy: str
    cells: int
    terms: dict[str, Term | None]
    payload_bytes: float | None  # median per rank and step over its multi-rank cells

    def as_json(self) -> dict:
        return {"key": self.key, "platform": self.platform, "strategy": self.strategy, "cells": self.cells,
                "payload_bytes": self.payload_bytes,
                "terms": {name: None if t is None else t.as_json() for name, t in self.terms.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "PlatformTerms":
        return cls(key=data["key"], platform=data["platform"], strategy=data["strategy"], cells=data["cells"],
                   payload_bytes=data["payload_bytes"],
                   terms={name: term_from_json(t) for name, t in data["terms"].items()})


def _fit_platform(key: str, obs: list[Observation]) -> PlatformTerms:
    terms: dict[str, Term | None] = {}
    for name in FIXED_TERMS:
        terms[name] = fit_term([fixed_x(o.hosts, o.workers_per_host) for o in obs], [getattr(o, name) for o in obs],
                               ["1", "multihost", "wph-1", "hosts-2"])
    terms["other"] = fit_term([{"1": 1.0}] * len(obs), [o.other for o in obs], ["1"])
    warm = [o for o in obs if o.warmup is not None]
    terms["warmup"] = fit_term([{"1": 1.0}] * len(warm), [o.warmup for o in warm], ["1"])
    # seconds per review on a whole rank (a rank with half a core computes twice as long)
    terms["compute"] = fit_term([{"1": 1.0}] * len(obs),
                                [o.compute / o.steps / o.batch_per_worker * o.rank_share for o in obs], ["1"])
    terms["data"] = fit_term([{"1": 1.0}] * len(obs), [o.data / o.steps for o in obs], ["1"])
    local = [o for o in obs if o.hosts == 1 and o.workers > 1 and o.payload_bytes]
    terms["comm_local"] = fit_term([local_x(o.workers, o.payload_bytes, 1.0 / o.rank_share) for o in local],
                                   [o.communication / o.steps for o in local], ["1", "ring_payload"])
    rows, y = [], []
    for o in obs:
        for seconds in o.eval_epochs:
            rows.append({"reviews": o.train_samples / o.workers / o.rank_share, "1": 1.0})
            y.append(seconds)
    terms["evaluation"] = fit_term(rows, y, ["reviews", "1"])
    terms["final_test"] = fit_term([{"reviews": o.test_samples / o.workers / o.rank_share, "1": 1.0} for o in obs],
                                   [o.final_test for o in obs], ["reviews", "1"])
    ck = [s for o in obs for s in o.checkpoint_epochs]
    terms["checkpoint"] = fit_term([{"1": 1.0}] * len(ck), ck, ["1"])
    terms["export"] = fit_term([{"1": 1.0}] * len(obs), [o.export for o in obs], ["1"])
    payloads = [o.payload_bytes for o in obs if o.payload_bytes and o.workers > 1]
    return PlatformTerms(key=key, platform=obs[0].platform, strategy=obs[0].strategy, cells=len(obs), terms=terms,
                         payload_bytes=statistics.median(payloads) if payloads else None)


@dataclass
class Model:
    """Every platform's terms, the joint cross-host communication term, and what they rest on."""

    platforms: dict[str, PlatformTerms]
    network: Term | None  # communication per step across hosts, every platform (net_x)
    link_efficiency: float
    link_efficiency_fitted: bool
    device: str  # the run's device kind ("cpu", "cuda")
    device_review_seconds: float  # seconds per review on a whole rank: the median over platforms
    batch_per_worker: int
    cores_per_host: float  # a host's cores x its CPU share, as the cells had them
    observations: list[Observation] = field(default_factory=list)

    def link_seconds(self, ranks: int, payload: float, rate_bps: float | None) -> float:
        """The wire time of one ring all-reduce at the model's link efficiency."""
        return wire_seconds(ranks, payload, rate_bps) / self.link_efficiency

    def as_json(self) -> dict:
        return {"version": MODEL_VERSION, "link_efficiency": self.link_efficiency,
                "link_efficiency_fitted": self.link_efficiency_fitted, "device": self.device,
                "device_review_seconds": self.device_review_seconds, "batch_per_worker": self.batch_per_worker,
                "cores_per_host": self.cores_per_host,
                "network": None if self.network is None else self.network.as_json(),
                "platforms": {k: p.as_json() for k, p in self.platforms.items()},
                "observations": [o.as_json() for o in self.observations]}

    @classmethod
    def from_json(cls, data: dict) -> "Model":
        if data.get("version") != MODEL_VERSION:
            raise ValueError(f"what-if model version {data.get('version')!r}; this code reads {MODEL_VERSION}")
        return cls(platforms={k: PlatformTerms.from_json(p) for k, p in data["platforms"].items()},
                   network=term_from_json(data["network"]), link_efficiency=data["link_efficiency"],
                   link_efficiency_fitted=data["link_efficiency_fitted"], device=data["device"],
                   device_review_seconds=data["device_review_seconds"], batch_per_worker=data["batch_per_worker"],
                   cores_per_host=data["cores_per_host"],
                   observations=[Observation.from_json(o) for o in data["observations"]])


def _fit_network(obs: list[Observation]) -> tuple[Term | None, float, bool]:
    """Cross-host communication per step, one fit over every platform's multi-host cells: a
    per-step constant and a per-payload-byte cost per platform, one link efficiency for all."""
    cells = [o for o in obs if o.hosts > 1 and o.payload_bytes]
    rows = [net_x(o.platform, o.workers, o.payload_bytes, o.rate_bps, 1.0 / o.rank_share) for o in cells]
    y = [o.communication / o.steps for o in cells]
    platforms = sorted({o.platform for o in cells})
    columns = [f"1@{p}" for p in platforms] + ["wire"] + [f"ring_payload@{p}" for p in platforms]
    term = fit_term(rows, y, columns)
    if term is not None and "wire" in term.columns and term.coef[term.columns.index("wire")] > 1.0:
        return term, 1.0 / term.coef[term.columns.index("wire")], True
    # the link's efficiency is not separated by these cells: the measured prior, its wire time
    # taken out before the rest is fitted (and put back as a fixed "wire" column)
    g = 1.0 / LINK_EFFICIENCY_PRIOR
    rest = fit_term(rows, [v - g * r["wire"] for v, r in zip(y, rows)], [c for c in columns if c != "wire"])
    if rest is None:
        return None, LINK_EFFICIENCY_PRIOR, False
    cov = rest.cov
    if cov is not None:  # the fixed column has no variance of its own
        cov = [row + [0.0] for row in cov] + [[0.0] * (len(rest.columns) + 1)]
    return Term(rest.columns + ["wire"], rest.coef + [g], cov, rest.sigma, rest.n, rest.mean), LINK_EFFICIENCY_PRIOR, False


def fit(observations: list[Observation]) -> Model:
    """The model of ``observations`` (at least one); ValueError when there is none."""
    if not observations:
        raise ValueError("no finished cell to fit (a cell that trained in one attempt and recorded its phases)")
    # a platform that does not report its all-reduce payload (its own engine reduces) moves the same
    # model's gradients: the default strategy's measured payload stands for it
    measured = [o.payload_bytes for o in observations if o.payload_bytes and o.strategy == DEFAULT_STRATEGY]
    if measured:
        observations = [dataclasses.replace(o, payload_bytes=statistics.median(measured))
                        if o.payload_bytes is None and o.workers > 1 and o.strategy == DEFAULT_STRATEGY else o
                        for o in observations]
    by_key: dict[str, list[Observation]] = {}
    for o in observations:
        by_key.setdefault(key_of(o.platform, o.strategy), []).append(o)
    platforms = {k: _fit_platform(k, obs) for k, obs in sorted(by_key.items())}
    network, efficiency, fitted = _fit_network(observations)
    per_review = [p.terms["compute"].coef[0] for p in platforms.values()
                  if p.strategy == DEFAULT_STRATEGY and p.terms["compute"] and p.terms["compute"].coef]
    if not per_review:
        per_review = [p.terms["compute"].coef[0] for p in platforms.values() if p.terms["compute"].coef]
    return Model(platforms=platforms, network=network, link_efficiency=efficiency, link_efficiency_fitted=fitted,
                 device=statistics.mode(o.device for o in observations),
                 device_review_seconds=float(statistics.median(per_review)),
                 batch_per_worker=int(statistics.median(o.batch_per_worker for o in observations)),
                 cores_per_host=float(statistics.median(o.host_cores for o in observations)), observations=list(observations))
