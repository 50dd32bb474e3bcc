"""The what-if model's fit and questions (pipelines.whatif), on cells whose costs are known.

Synthetic observations are made from stated parameters (launch grows by 2 s a host, a link
efficiency of 80 %, ...): the fit must recover them, predict a cell it never saw, and say which
terms it could not fit. The real cells are in test_whatif_hosts.py (2 emulated hosts -> a 3rd).
"""

from __future__ import annotations

import json
import math
import random

import pytest

from pipelines.config.sections import ProjectedJob, WhatIfConfig
from pipelines.run import cli
from pipelines.whatif import model as whatif_model
from pipelines.whatif.answer import ask, ranking, text
from pipelines.whatif.observe import Observation, ring_factor
from pipelines.whatif.predict import calibrated, order_changes, predict, predict_one

PAYLOAD = 17.6e6  # BERT-tiny's fp32 gradients, bytes per rank and step
TRUE = {"launch": (5.0, 2.0, 0.5, 0.25), "teardown": (1.0, 0.3, 0.0, 0.0), "compute": 0.004, "data": 0.001, "alpha": 0.01,
        "lambda": 0.002, "efficiency": 0.8, "eval": 0.001, "checkpoint": 0.2, "local_comm": (0.005, 0.001)}


def true_communication(hosts: int, workers: int, rate: float | None, payload: float = PAYLOAD) -> float:
    if workers == 1:
        return 0.0
    ring = ring_factor(workers) * payload
    if hosts == 1:
        return TRUE["local_comm"][0] + TRUE["local_comm"][1] * ring / 1e6
    wire = ring * 8 / rate / TRUE["efficiency"] if rate else 0.0
    return TRUE["alpha"] + TRUE["lambda"] * ring / 1e6 + wire


def cell(platform: str, hosts: int, wph: int, rate: float | None, *, epochs: int = 2, train: int = 1000,
         batch: int = 16, noise: float = 0.0, rng: random.Random | None = None, strategy: str = "default",
         payload: float = PAYLOAD, launch_extra: float = 0.0) -> Observation:
    """One cell with TRUE's costs (``noise``: each measured phase off by that relative sd)."""
    rng = rng or random.Random(0)
    workers = hosts * wph
    steps_per_epoch = math.ceil(train / (workers * batch))
    steps = steps_per_epoch * epochs
    jit = (lambda v: v * (1 + rng.gauss(0, noise))) if noise else (lambda v: v)
    a, b, c, d = TRUE["launch"]  # one host, the step to several, per rank on a host, per host beyond 2
    ta, tb, _, _ = TRUE["teardown"]
    return Observation(
        cell=f"{platform}-{strategy}-h{hosts}-w{workers}-{rate}", platform=platform, strategy=strategy,
        workers=workers, hosts=hosts, network="x", rate_bps=rate, rank_share=1.0, host_cores=1.0,
        epochs=epochs, steps_per_epoch=steps_per_epoch, batch_per_worker=batch, train_samples=train,
        test_samples=train // 2, payload_bytes=payload if workers > 1 else None, provision=0.0,
        launch=jit(a + b * (hosts > 1) + d * max(0, hosts - 2) + c * (wph - 1) + launch_extra),
        teardown=jit(ta + tb * (hosts > 1)),
        warmup=jit(1.0) if epochs > 1 else None, other=0.1, compute=jit(TRUE["compute"] * batch * steps),
        communication=jit(true_communication(hosts, workers, rate, payload) * steps), data=jit(TRUE["data"] * steps),
        eval_epochs=tuple(jit(TRUE["eval"] * train / workers) for _ in range(epochs)),
        checkpoint_epochs=tuple(jit(TRUE["checkpoint"]) for _ in range(epochs)),
        final_test=jit(TRUE["eval"] * (train // 2) / workers), export=0.3, total=0.0)


def campaign(noise: float = 0.0, repeats: int = 1) -> list[Observation]:
    """Two platforms (spark's launch 20 s longer) on 1-3 hosts, unshaped and 1 Gbit/s, 2 ranks a host once."""
    rng = random.Random(7)
    out = []
    for platform, extra in (("ddp", 0.0), ("spark", 20.0)):
        for _ in range(repeats):
            out.append(cell(platform, 1, 1, None, noise=noise, rng=rng, launch_extra=extra))
            out.append(cell(platform, 1, 2, None, noise=noise, rng=rng, launch_extra=extra))
            for rate in (None, 1e9):
                out.append(cell(platform, 2, 1, rate, noise=noise, rng=rng, launch_extra=extra))
            out.append(cell(platform, 2, 2, 1e9, noise=noise, rng=rng, launch_extra=extra))
            out.append(cell(platform, 3, 1, 1e9, noise=noise, rng=rng, launch_extra=extra))
    return out


def test_the_fit_recovers_known_parameters():
    model = whatif_model.fit(campaign())
    ddp = model.platforms["ddp"].terms
    launch = dict(zip(ddp["launch"].columns, ddp["launch"].coef))
    assert launch == pytest.approx({"1": 5.0, "multihost": 2.0, "wph-1": 0.5, "hosts-2": 0.25})
    spark = dict(zip(model.platforms["spark"].terms["launch"].columns, model.platforms["spark"].terms["launch"].coef))
    assert spark["1"] == pytest.approx(25.0) and spark["multihost"] == pytest.approx(2.0)
    assert ddp["compute"].coef == pytest.approx([TRUE["compute"]])
    assert ddp["data"].coef == pytest.approx([TRUE["data"]])
    assert ddp["warmup"].coef == pytest.approx([1.0])
    assert ddp["checkpoint"].coef == pytest.approx([TRUE["checkpoint"]])
    assert dict(zip(ddp["evaluation"].columns, ddp["evaluation"].coef))["reviews"] == pytest.approx(TRUE["eval"])
    assert model.link_efficiency_fitted and model.link_efficiency == pytest.approx(TRUE["efficiency"])
    net = dict(zip(model.network.columns, model.network.coef))
    assert net["1@ddp"] == pytest.approx(TRUE["alpha"]) and net["ring_payload@ddp"] == pytest.approx(TRUE["lambda"])
    local = dict(zip(ddp["comm_local"].columns, ddp["comm_local"].coef))
    assert local["1"] + local.get("ring_payload", 0.0) * PAYLOAD / 1e6 == pytest.approx(sum(TRUE["local_comm"][:1])
                                                                                         + TRUE["local_comm"][1] * PAYLOAD / 1e6)
    # saved and read back: the same model
    again = whatif_model.Model.from_json(json.loads(json.dumps(model.as_json())))
    assert again.platforms["ddp"].terms["launch"].coef == ddp["launch"].coef and len(again.observations) == 12


def test_a_held_out_cluster_is_predicted_within_its_interval():
    """Fit on 1-3 hosts at unshaped and 1 Gbit/s, with 3 % noise and 3 repeats; predict 4 hosts at
    100 Mbit/s and 3 epochs: the true total lies inside the interval, within a few percent."""
    model = whatif_model.fit(campaign(noise=0.03, repeats=3))
    truth = cell("ddp", 4, 1, 1e8, epochs=3)
    true_total = (truth.launch + truth.teardown + truth.warmup + truth.other + truth.compute + truth.communication
                  + truth.data + sum(truth.eval_epochs) + sum(truth.checkpoint_epochs) + truth.final_test + truth.export)
    target = WhatIfConfig(hosts=4, workers_per_host=1, network="100mbit", reference_seconds=None,
                          job=ProjectedJob(train_samples=1000, epochs=3, test_samples=500))
    got = predict_one(model, "ddp", target)
    assert got.low <= true_total <= got.high, (got.low, true_total, got.high)
    assert got.total == pytest.approx(true_total, rel=0.05)
    assert got.phases["communication"] > 0.5 * got.total  # 100 Mbit/s: the link dominates
    assert not got.notes  # every column it asked for was varied by the fit's cells


def test_an_unvaried_column_is_named_and_taken_as_constant():
    one_host = [cell("ddp", 1, 1, None), cell("ddp", 1, 1, None, rng=random.Random(3), noise=0.02)]
    model = whatif_model.fit(one_host)
    got = predict_one(model, "ddp", WhatIfConfig(hosts=3, reference_seconds=None))
    assert any(n.startswith("launch, teardown: the cells did not vary one host against several") for n in got.notes), got.notes
    assert any("did not vary the host count beyond 2" in n for n in got.notes), got.notes
    assert any("no cell measured a payload" in n for n in got.notes), got.notes


def test_a_strategy_is_predicted_from_its_payload_alone():
    model = whatif_model.fit(campaign())
    target = WhatIfConfig(hosts=2, network="100mbit", reference_seconds=None, job=ProjectedJob(train_samples=1000,
                                                                                               epochs=2, test_samples=500))
    default = predict_one(model, "ddp", target)
    fp16 = predict_one(model, "ddp", target, strategy="fp16")
    expected = true_communication(2, 2, 1e8, PAYLOAD / 2) * default.steps_per_epoch * 2
    assert fp16.phases["communication"] == pytest.approx(expected, rel=1e-6)
    assert fp16.phases["communication"] < 0.6 * default.phases["communication"]
    assert any("fp16's payload" in n for n in fp16.notes)


def test_calibration_gives_the_reference_its_stated_time_and_the_rest_follow():
    model = whatif_model.fit(campaign(noise=0.02, repeats=2))
    target = WhatIfConfig(hosts=3, network="10gbit", reference_seconds=499.0, reference_workers=2)
    step = calibrated(model, target, "ddp")
    assert step.step_ms and step.step_ms > 0
    at_reference = predict_one(model, "ddp", step.model_copy(update={"hosts": 2}))
    assert at_reference.total == pytest.approx(499.0, rel=1e-6)
    answer = ask(model, target, "ddp")
    assert [p.platform for p in answer.predictions] == ["ddp", "spark"]  # spark's 20 s launch, nothing else
    assert "calibrat" not in answer.device and "takes 499 s" in answer.device
    with pytest.raises(ValueError, match="no step fits"):
        calibrated(model, target.model_copy(update={"reference_seconds": 1.0}), "ddp")


def test_rankings_only_where_intervals_separate_and_where_the_order_flips():
    model = whatif_model.fit(campaign(noise=0.03, repeats=3))
    short = WhatIfConfig(hosts=2, network="1gbit", reference_seconds=None,
                         job=ProjectedJob(train_samples=1000, epochs=2, test_samples=500))
    preds = predict(model, short)
    assert ranking(preds).startswith("ddp is fastest beyond noise")  # 20 s of launch on a ~30 s job
    huge = short.model_copy(update={"job": ProjectedJob(train_samples=10**6, epochs=50, test_samples=10**5)})
    assert "within noise" in ranking(predict(model, huge))  # the same 20 s in hours of work
    # a platform with a slower step but a quicker launch: the order flips with the job's length
    slow = [o.__class__(**{**o.as_json(), "platform": "ray", "compute": o.compute * 1.5,
                           "launch": max(0.5, o.launch - 4.0), "eval_epochs": o.eval_epochs,
                           "checkpoint_epochs": o.checkpoint_epochs}) for o in campaign() if o.platform == "ddp"]
    model = whatif_model.fit(campaign() + slow)
    changes = order_changes(model, short, [p for p in predict(model, short) if p.platform in ("ddp", "ray")])
    assert any("epochs of this job" in c for c in changes), changes
    assert "Where the order changes" in text(ask(model, short, "ddp"))


@pytest.mark.parametrize("argv, flag", [
    (["--hosts", "0"], "--hosts"),
    (["--hosts", "2", "--network", "0.5mbit"], "--network"),
    (["--hosts", "2", "--network", "900kbit"], "--network"),
    (["--hosts", "2", "--step-ms", "-3"], "--step-ms"),
    (["--hosts", "2", "--workers-per-host", "0"], "--workers-per-host"),
    (["--hosts", "2", "--job", "25000"], "--job"),
])
def test_bad_questions_are_refused_naming_the_flag_before_anything_is_read(argv, flag, capsys, tmp_path):
    missing = tmp_path / "no-such-run"  # checked after the question: the flag's error comes first
    assert cli.main(["whatif", str(missing), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}") and "no-such-run" not in err, err


def test_a_run_folder_without_a_finished_cell_is_refused(capsys, tmp_path):
    run = tmp_path / "run"
    (run / "cells" / "ddp-w2-r0").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    assert cli.main(["whatif", str(run), "--hosts", "2"]) == 2
    assert "no finished cell to fit" in capsys.readouterr().err
