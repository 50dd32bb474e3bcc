"""SIGKILL of the process running a cell (``python -m pipelines train``, the driver) mid-training,
on every registered platform: no process of the cell (launchers, ranks, JVMs, Ray's nodes and
workers) may outlive it by more than ``OUTLIVE_S``. No handler runs on SIGKILL, so this is what the
project promises without one: the daemons it starts die with their starter (``PR_SET_PDEATHSIG``:
the embedded Spark cluster, the standing Ray head; pipelines.cluster.processes.start_session), the
rest with their launcher (Ray's workers with their raylet, Spark's executors with their worker,
the py4j JVM with its driver's pipe).

What each case measured on a loaded 2-core box is in its reason where the platform leaves
processes behind (strict xfail: the day it stops doing so, the test says it)."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.platforms.test_signals import (CASES, HEAVY, describe, kill_all, params, run_maker, running, start_training,
                                          training_tree)

pytestmark = pytest.mark.slow
OUTLIVE_S = 30.0  # after the driver's SIGKILL: the kernel's PDEATHSIG, JVM shutdown hooks, Ray's polls


@pytest.fixture(scope="module")
def runs(tmp_path_factory, imdb_dir, bert_tiny_dir):
    return run_maker(tmp_path_factory, imdb_dir, bert_tiny_dir)


def _of_the_run(root: str) -> list[psutil.Process]:
    """Processes whose command line names the run folder (ranks' --cell-dir, Spark workers' --work-dir)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if any(root in part for part in p.info["cmdline"] or []):
            out.append(p)
    return out


# tier by the measured run time on a loaded 2-core box (load average 1.5-9): slow only up to ~60 s; an
# xfail waits OUTLIVE_S
SIGKILL_MARKS = {
    # run_to_end starts the launcher with PR_SET_PDEATHSIG: torchrun gets SIGTERM and stops its ranks
    # (before: torchrun and both ranks trained on to the last epoch, beside the cell's retry)
    "ddp": (HEAVY,),  # 77-79 s; after the fix 30 s: 3 processes gone within 1.2 s
    "determined": (HEAVY,),  # 69-72 s; after the fix: 3 processes gone within 1.1 s
    "deepspeed": (HEAVY, pytest.mark.xfail(strict=True, reason=(
        "DeepSpeed's runner (deepspeed.launcher.runner) gets SIGTERM from the kernel (run_to_end's "
        "PR_SET_PDEATHSIG) and dies without passing it on: its child deepspeed.launcher.launch and the 2 ranks "
        "keep training. Measured: the runner gone in 0.2 s, the other 3 still running 30 s later"))),  # 83-95 s
    "spark": (HEAVY,),  # 56-58 s (heavy: CI under 45 minutes): all 5-6 processes gone within 1.4 s (pyspark's torch_run_process_wrapper, py4j's pipe)
    "spark_per_job": (HEAVY,),  # 167-180 s: 16-17 processes gone within 3.5 s (PDEATHSIG on the cell's own cluster)
    "spark_dataframe": (HEAVY,),  # 148-310 s: 16-19 processes gone within 3.4 s (PDEATHSIG on the run's cluster)
    "spark_dataframe_per_job": (HEAVY,),  # 144-182 s: 18 processes gone within 3.1 s
    "ray": (HEAVY,),  # 95-100 s: 17 processes gone within 3 s (PDEATHSIG on the standing head)
    # the cell's own Ray cluster, under its driver process (pipelines/platforms/driver.py), which gets SIGTERM from
    # the kernel and takes its whole tree down: 16 processes gone within 7.5 s (before, with ray.init in the CLI:
    # Ray's DashboardAgent and RuntimeEnvAgent ran on ~61 s after the SIGKILL)
    "ray_per_job": (HEAVY,),
    # the launcher (launcher.py) gets SIGTERM from the kernel (run_to_end's PR_SET_PDEATHSIG) and stops its
    # ranks, which die with it too (their own PR_SET_PDEATHSIG)
    "tensorflow": (HEAVY,),
}


def test_the_platforms_whose_sigkill_case_runs_here_are_counted_not_assumed(runs_here):
    """Every SIGKILL case is heavy (over a minute each): at a landing none runs, and this says so instead
    of counting them (issue 45: make them cheap); with the heavy tier, all do."""
    assert set(SIGKILL_MARKS) == set(CASES)
    ran = {b for b in SIGKILL_MARKS if runs_here(SIGKILL_MARKS[b])}
    assert ran in (set(), set(CASES)) and (ran == set(CASES)) == runs_here((HEAVY,))


@pytest.mark.parametrize("backend", params(SIGKILL_MARKS))
def test_sigkill_of_the_driver_leaves_no_process_of_the_cell(backend, runs, tmp_path):
    paths, _ = runs(CASES[backend].master)
    repeat = 60 + list(CASES).index(backend)
    proc, cell = start_training(paths, backend, repeat, tmp_path)
    watched: list[psutil.Process] = []
    try:
        tree = training_tree(proc, cell, backend)
        watched = list({p.pid: p for p in [*tree, *_of_the_run(str(paths.root))] if p.pid != proc.pid}.values())
        proc.kill()
        killed = time.time()
        proc.wait(60)
        gone_after: dict[int, float] = {}
        alive = watched
        while alive and time.time() - killed < OUTLIVE_S:
            now = running(alive)
            for p in alive:
                if p not in now:
                    gone_after[p.pid] = round(time.time() - killed, 1)
            alive = now
            time.sleep(0.1)
        late = running(list({p.pid: p for p in [*alive, *_of_the_run(str(paths.root))]}.values()))
        print(f"{backend}: {len(watched)} processes; gone after (s): {sorted(gone_after.values())}; "
              f"still running after {OUTLIVE_S:.0f} s: {describe(late)}")
        assert not late, (f"{backend}: {len(late)} of the cell's processes outlived its SIGKILLed driver by "
                          f"{OUTLIVE_S:.0f} s: {describe(late)}")
    finally:
        kill_all(proc, [*watched, *_of_the_run(str(paths.root))])
