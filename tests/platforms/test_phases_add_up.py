"""A cell's phases add up to its total, for every platform on this host.

``CellResult.phases`` splits a cell's wall time (``total_seconds``: adapter entry -> attempt end,
summed over attempts) into provision, launch, data, compute, communication, checkpoint,
evaluation and teardown (``pipelines.training.phases``). What no phase owns is
``phases.unattributed(...)``. Here every platform trains one tiny local cell at 2 workers and the
sum is checked against the total, with the cross-checks that tie each phase to the field it is
measured from. Cells come from the session's ``trained`` fixture where one exists (ddp, spark,
determined and ray_per_job are the very cells tests/platforms/test_backends.py and ray/test_ray.py
train, so here they cost nothing more in a full run).

Tolerance (``_bound``): what is unattributed are rank 0's few unmeasured moments between timed
sections: per epoch, closing the epoch record and its log line, the heartbeat and the epoch-end
hook; per cell, the step-link bytes, the device-label gather, and writing the result file (its
``work_end`` is taken just before; teardown starts there). Each is milliseconds. Measured on this
2-core host with other work on it (two runs each where two are given; totals 12-128 s):
ddp +0.008/+0.013 s, spark +0.009/+0.017, determined +0.030/+0.019, ray_per_job +0.012/+0.007,
deepspeed +0.023/+0.008, ray (standing) +0.005, spark_dataframe +0.016, spark_per_job +0.010:
at most 0.12 % of the total, and never negative. The bound is 1 % of the total, at least 0.25 s:
ten times the worst measured share, and the floor leaves room for a scheduler stall of a loaded
host between two sections. A phase left out of the sum fails it when it is larger than that:
launch, compute and teardown always, the checkpoint in every session cell measured (0.35-2.1 s
against bounds of 0.25-0.79 s); the data phase (~0.01 s) is too small for any sum to see
(test_backends checks it is measured). Below zero the phases overlap (time counted twice): only
clock noise is allowed there (``OVERLAP_S``: ``launch`` and ``teardown`` are wall-clock
differences, the rest ``perf_counter`` ones).
"""

from __future__ import annotations

import pytest

from pipelines import platforms
from pipelines.config import load_config
from pipelines.run import services
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import CellResult
from pipelines.training import phases
from tests.token_shards import write_token_shards

REL, FLOOR_S, OVERLAP_S = 0.01, 0.25, 0.05  # see the module docstring

# the session's cells (``trained``); deepspeed's is trained for this file alone (42-79 s here under
# load): heavy, to keep CI under 45 minutes (its ZeRO cells in tests/platforms/deepspeed/test_deepspeed.py
# run there)
SESSION_CELLS = [pytest.param(b, marks=pytest.mark.heavy) if b == "deepspeed" else pytest.param(b)
                 for b in ("ddp", "spark", "determined", "ray_per_job", "deepspeed", "tensorflow")]
STANDING_RAY = "ray"
EMBEDDED_SPARK = ("spark_dataframe", "spark_per_job")
# the registry's platforms with no cell here, and why
NOT_HERE = {
    # its per-job path (pipelines.platforms.spark.distributor.launch_on_this_host: an embedded cluster
    # of the cell's own, its provision phase) is spark_per_job's; its feed is spark_dataframe's
    "spark_dataframe_per_job": "spark_per_job + spark_dataframe cover its per-job cluster and its feed",
}


def _bound(result: CellResult) -> float:
    return max(REL * result.total_seconds, FLOOR_S)


def _report(result: CellResult) -> str:
    gap = phases.unattributed(result.phases, result.total_seconds)
    parts = ", ".join(f"{k} {v:.3f}" for k, v in result.phases.items())
    return (f"{result.backend}-w{result.world_size} ({result.platform_mode}): total {result.total_seconds:.3f} s = "
            f"{parts}; unattributed {gap:+.3f} s ({gap / result.total_seconds:+.2%}), allowed "
            f"[-{OVERLAP_S}, {_bound(result):.3f}] s")


def assert_phases_add_up(result: CellResult, *, provision: bool) -> None:
    assert result.status == "ok", result.error
    print(f"\n{_report(result)}")  # the measured figures of the module docstring (pytest -s)
    expected = ((phases.PROVISION,) if provision else ()) + phases.PHASES
    assert tuple(result.phases) == expected, result.phases
    assert min(result.phases.values()) >= 0, result.phases
    if provision:
        assert result.phases[phases.PROVISION] > 0
    # the total is the attempt's window (one attempt: no retries phase)
    assert len(result.attempts) == 1 and phases.RETRIES not in result.phases
    window = result.attempts[0].end - result.attempts[0].start
    assert result.total_seconds == pytest.approx(window, abs=1e-3)
    gap = phases.unattributed(result.phases, result.total_seconds)
    assert -OVERLAP_S <= gap <= _bound(result), _report(result)
    # each phase is what its own field measured
    start_up = result.phases["launch"] + result.phases.get(phases.PROVISION, 0.0)
    assert start_up == pytest.approx(result.startup_seconds, abs=1e-3)
    train_parts = sum(result.phases[p] for p in ("data", "compute", "communication"))
    assert train_parts == pytest.approx(result.training_seconds, rel=1e-6)
    assert result.phases["evaluation"] == pytest.approx(result.evaluation_seconds, rel=1e-6)
    assert result.phases["checkpoint"] >= result.checkpoint_seconds  # + the trained model's export
    assert result.phases["communication"] > 0  # 2 workers: the gradient all-reduce, timed


@pytest.mark.slow
@pytest.mark.parametrize("backend", SESSION_CELLS)
def test_phases_add_up_on_this_host(trained, backend):
    result = trained(backend, 2)
    assert_phases_add_up(result, provision=platforms.get(backend).lifetime == "per_job")


@pytest.fixture(scope="module")
def standing_ray(trained, run_paths):
    """The session's standing Ray cell: the run's Ray cluster is started before its window
    (``services.before_cell``, by ``run_cell``) and stopped here after the module."""
    try:
        yield trained(STANDING_RAY, 2)
    finally:
        services.stop(run_paths)


@pytest.mark.slow
@pytest.mark.heavy  # ~2 min here (the standing cluster's start + the cell); ray_per_job above: the same worker
def test_phases_add_up_on_a_standing_ray_cluster(standing_ray):
    assert standing_ray.platform_mode == "local-standing"
    assert_phases_add_up(standing_ray, provision=False)  # its cluster's start is the run's, outside the cell


@pytest.fixture(scope="module")
def embedded_run(tmp_path_factory, imdb_dir, bert_tiny_dir):
    """A run on the embedded Spark cluster (master + one 1-core worker per core): the dataframe feed
    needs executors, which a local master has none of. Small: 64 train rows, seq 32, 2 epochs (the
    per-epoch gaps are what the sum checks; their size does not depend on the data)."""
    paths = write_token_shards(RunPaths(tmp_path_factory.mktemp("phases") / "run"), imdb_dir, bert_tiny_dir,
                               train_per_class=32, test_per_class=16, seq_len=32, seed=7)
    config = load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
        output_root=str(paths.root.parent), max_seq_len=32, epochs=2, batch_size=16, batch_policy="per_worker",
        learning_rate=5e-4, seed=42, spark_master="embedded"))
    try:
        yield config, paths
    finally:
        services.stop(paths)


@pytest.mark.slow
# ~2-3 min each here (the cluster's JVMs on 2 cores): heavy; tests/platforms/spark/test_spark_dataframe.py
# checks the sum of spark_dataframe's cell (and of spark's on that cluster) in CI; spark_per_job's
# provision split: only here
@pytest.mark.heavy
@pytest.mark.parametrize("backend", EMBEDDED_SPARK)
def test_phases_add_up_on_the_embedded_spark_cluster(embedded_run, backend):
    from pipelines.run.cells import run_cell

    config, paths = embedded_run
    result = run_cell(config, paths, backend, 2)  # standing: the run's cluster starts before the window
    assert result.platform_mode == "cluster"
    assert_phases_add_up(result, provision=platforms.get(backend).lifetime == "per_job")


# checked only by heavy tests (the heavy tier, bench/heavy_tier.sh), not at a landing: stated, not counted
PHASES_HEAVY_ONLY = {"deepspeed", STANDING_RAY, *EMBEDDED_SPARK}


def test_every_platform_of_the_project_is_checked_here(runs_here):
    """Counted from the cases this session runs: in CI (heavy left out) the platforms checked only by the
    heavy tier are exactly PHASES_HEAVY_ONLY."""
    heavy = (pytest.mark.heavy,)
    checked = {p.values[0] for p in SESSION_CELLS if runs_here(p.marks)}
    checked |= {STANDING_RAY, *EMBEDDED_SPARK} if runs_here(heavy) else set()
    builtin = {name for name in platforms.names() if platforms.get(name).package.startswith("pipelines.platforms.")}
    expected = set(NOT_HERE) | (set() if runs_here(heavy) else PHASES_HEAVY_ONLY)
    assert builtin - checked == expected, "a platform whose phases nobody checks add up: add its cell here"
