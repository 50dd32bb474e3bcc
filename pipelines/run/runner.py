"""The one step order of a run, and the one policy for what follows training, shared by the CLI
and the Airflow DAG.

    ingest -> validate_snapshot -> preprocess -> validate_tokens     (DATA_STEPS)
    train every cell
    evaluate -> report -> track (MLflow) -> check_regression         (FINISH_STEPS)

The data steps stop at the first failure (``data_stage``; one DAG task each, in this order).

Same order, same failure semantics everywhere: a step runs only if every step before it
succeeded (the DAG's default trigger rule; ``finish`` stops at the first failure), and a
failed step fails the run (CLI exit status 1, a failed DAG run). ``evaluate`` alone runs
when training cells failed, so their report comes out; ``check_regression`` then makes such
a run fail (``FailedCellsError``), after its report and MLflow logging. Every failure comes
with ``resume_hint``: what to run once the cause is fixed, since the run folder keeps
everything done so far.

    from pipelines.run import runner
    runner.data_stage(run_dir)                    # the CLI (python -m pipelines data|train|run)
    runner.finish(run_dir)                        # the CLI (python -m pipelines run|report)
    runner.run_step("report", run_dir)            # one DAG task per step, in DATA_STEPS / FINISH_STEPS order
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

DATA_STEPS: tuple[str, ...] = ("ingest", "validate_snapshot", "preprocess", "validate_tokens")
FINISH_STEPS: tuple[str, ...] = ("evaluate", "report", "track", "check_regression")
TRACKING_STEPS = frozenset({"track", "check_regression"})  # need an MLflow store


class StepFailed(RuntimeError):
    """A step after training failed; ``hint`` says how to continue from the run folder."""

    def __init__(self, step: str, cause: BaseException, hint: str):
        super().__init__(f"{step} failed: {type(cause).__name__}: {cause}")
        self.step, self.cause, self.hint = step, cause, hint


def _step(step: str) -> Callable[..., dict]:
    from pipelines.run import stages  # not at import time: the DAG file imports the step lists

    functions = {"ingest": stages.ingest, "validate_snapshot": stages.validate_snapshot,
                 "preprocess": stages.preprocess, "validate_tokens": stages.validate_tokens,
                 "evaluate": stages.evaluate, "report": stages.report, "track": stages.track,
                 "check_regression": stages.check_regression}
    if step not in functions:
        raise ValueError(f"unknown step {step!r} (steps: {', '.join(DATA_STEPS + FINISH_STEPS)})")
    return functions[step]


def run_step(step: str, run_dir: str, tracking_uri: str | None = None) -> dict:
    """Run one step on the run folder (what a DAG task calls)."""
    if step in TRACKING_STEPS:
        return _step(step)(run_dir, tracking_uri)
    return _step(step)(run_dir)


def data_stage(run_dir: str) -> dict[str, dict]:
    """The data steps in DATA_STEPS order; stops at the first failure (its exception)."""
    return {step: run_step(step, run_dir) for step in DATA_STEPS}


def resume_hint(step: str, run_dir: str) -> str:
    """What to run after a failure of ``step`` (or of training, step="train")."""
    resume = f"python -m pipelines run --run-dir {run_dir}"
    report = f"python -m pipelines report {run_dir}"
    return {
        "train": f"re-run to resume the unfinished cells from their last checkpoints: {resume}",
        "evaluate": f"fix the cause, then: {report}",
        "report": f"fix the cause, then: {report}",
        "track": (f"the run folder is complete; once MLflow is reachable re-log it with: {report} "
                  "[--tracking-uri URI]"),
        "check_regression": (f"the report and MLflow are written; failed cells resume with: {resume}; "
                             f"a regression is compared again with: {report}"),
    }[step]


def finish(run_dir: str, *, tracking_uri: str | None = None, with_mlflow: bool = True) -> dict[str, dict]:
    """Run the steps after training in order; StepFailed (with the hint) at the first failure."""
    done: dict[str, dict] = {}
    for step in FINISH_STEPS:
        if step in TRACKING_STEPS and not with_mlflow:
            continue
        try:
            done[step] = run_step(step, run_dir, tracking_uri)
        except Exception as err:
            raise StepFailed(step, err, resume_hint(step, run_dir)) from err
        log.info("%s: %s", step, done[step])
    return done
