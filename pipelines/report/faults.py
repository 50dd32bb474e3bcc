"""The report's "Losing a host" section: each platform's recovery from ``matrix.fault=host_loss``
side by side (``CellResult.fault``, written by ``pipelines.measure.faults.record``)."""

from __future__ import annotations

import re

from pipelines.report.tables import _md_table, _text
from pipelines.runfolder.results import CellResult

HEADER = ["cell", "platform", "lost", "at", "the platform", "recovered by", "recovery s", "work lost s",
          "epochs redone", "resumed from epoch", "cell"]
OUTCOME = {"recovered": "recovered it", "failed": "failed", "timed_out": "no recovery before the deadline"}


def _row(name: str, result: CellResult) -> list[str]:
    f = result.fault or {}
    outcome = OUTCOME.get(f.get("platform_outcome") or "", "-")
    if f.get("platform_outcome") == "timed_out":
        outcome += f" ({f['deadline_s']:.0f} s)"
    recovery = f.get("recovery_seconds")
    return [_text(name), _text(result.backend), _text(f.get("host", "-")),
            f"epoch {f.get('epoch')} step {f.get('step')}/{f.get('steps')}", _text(outcome),
            _text(f.get("recovered_by", "-")), "-" if recovery is None else f"{recovery:.1f}",
            f"{f.get('lost_seconds', 0.0):.1f}", _text(f.get("epochs_redone", "-")),
            _text(f.get("resumed_from_epoch", "-")), _text(result.status)]


def _headline(error: str) -> str:
    """What failed: the first ``SomeError: ...`` line of an error (a launcher's message or a JVM's
    exception), not the log tail that follows it."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    found = next((line for line in lines if re.match(r"^[\w.$]+(Error|Exception)\b", line)), None)
    return found or (lines[0] if lines else "")


def faults_markdown(results: dict[str, CellResult]) -> str | None:
    """The section (with its own ``## `` title), or None when no cell lost a host."""
    lost = {name: r for name, r in sorted(results.items()) if r.fault}
    if not lost:
        return None
    lines = ["## Losing a host", "",
             "Each cell below lost every process of one host half-way through an epoch of its first attempt "
             "(`fault=host_loss`). \"The platform\" is what its own recovery did within the deadline "
             "(`platform_retries`: torchrun `--max-restarts`, Ray `FailureConfig(max_failures)`, Spark "
             "`spark.task.maxFailures`); \"recovered by\" `project` means the project's retry relaunched the cell on "
             "every host from its last checkpoint. Recovery s: from the loss to training again; work lost: "
             "training done after the last checkpoint, thrown away.", "",
             _md_table(HEADER, [_row(n, r) for n, r in lost.items()]), ""]
    errors = [(n, r.fault.get("platform_error")) for n, r in lost.items() if r.fault.get("platform_error")]
    if errors:
        lines += ["What each platform reported when it did not recover:", ""]
        lines += [f"- {_text(n)}: {_text(_headline(str(e))[:300])}" for n, e in errors]
    return "\n".join(lines)
