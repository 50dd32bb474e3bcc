"""Cases of several platforms run side by side, for the signal tests (SIGTERM, SIGKILL of a cell's driver).

Most of such a case is one process starting (imports, a JVM, Ray's head) or waiting (a launcher's grace, the
watch after a SIGKILL): a 2-core box is about half busy through one. So the cases run in two lanes at once,
each lane its platforms one after another, and a module's cases take about as long as its longer lane.
A lane holds every platform of one engine (Ray's clusters in one, Spark's JVMs in the other), so no two
clusters of an engine start at once; each case has its own run folder, so what one case watches (the
processes naming its run folder) is never another's.

A module runs its cases once, in a module-scoped fixture, and its parametrized tests assert on each
platform's outcome (``outcome_of``): the test ids, marks (heavy, xfail) and ``-k`` stay per platform, and
only the selected cases run. Each test records its case's own time (the junit property ``case_seconds``,
which bench/heavy_table.py reads): the fixture's time falls on whichever test comes first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

# by engine; within a lane the cheapest first (measured, serial, on a quiet 2-core box: bench/RESULTS.md)
# (the platforms without a cluster, ddp and determined, even the lanes out)
LANES = (
    ("ddp", "ray", "ray_per_job"),
    ("determined", "tensorflow", "spark", "deepspeed", "spark_dataframe", "spark_per_job", "spark_dataframe_per_job"),
)


def selected(request: pytest.FixtureRequest, test_name: str) -> list[str]:
    """The ``backend`` parameters of ``test_name``'s cases this session runs (after -m / -k deselection)."""
    return [item.callspec.params["backend"] for item in request.session.items
            if getattr(item, "originalname", None) == test_name and hasattr(item, "callspec")]


def run_side_by_side(backends: list[str], case: Callable[[str], object]) -> dict[str, tuple[object, float]]:
    """``case(backend)`` for each of ``backends``, the lanes at once; backend -> (its return value, or the
    exception (a pytest failure included) it raised, for its own test to raise; its seconds)."""
    lanes = [[b for b in lane if b in backends] for lane in LANES]
    unplaced = set(backends) - {b for lane in lanes for b in lane}
    assert not unplaced, f"platforms in no lane of tests/platforms/side_by_side.py: {sorted(unplaced)}"
    outcomes: dict[str, tuple[object, float]] = {}

    def run_lane(lane: list[str]) -> None:
        for backend in lane:
            start = time.monotonic()
            try:
                outcome = case(backend)
            except BaseException as err:  # pytest.fail raises a BaseException: kept for the platform's test
                outcome = err
            outcomes[backend] = (outcome, round(time.monotonic() - start, 1))

    threads = [threading.Thread(target=run_lane, args=(lane,), name=f"lane-{k}") for k, lane in enumerate(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def run_module_cases(request: pytest.FixtureRequest, test_name: str, runs: Callable[[str], object],
                     case: Callable[[Callable[[str], object], str], object]) -> dict[str, tuple[object, float]]:
    """A module fixture's body: ``case(runs, backend)`` for each of ``test_name``'s selected platforms, side
    by side; ``runs(backend)`` makes (and then returns) that platform's run folder, made here first, in this
    thread, so the lanes only run cases."""
    chosen = selected(request, test_name)
    for backend in chosen:
        runs(backend)
    return run_side_by_side(chosen, lambda backend: case(runs, backend))


def outcome_of(outcomes: dict[str, tuple[object, float]], backend: str, record_property: Callable) -> object:
    """The platform's outcome, its case's seconds recorded; raises what its case raised (a failed start, a
    timeout) in its own test."""
    outcome, seconds = outcomes[backend]
    record_property("case_seconds", seconds)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
