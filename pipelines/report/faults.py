"""The report's "Losing a host" section: each platform's recovery from ``matrix.fault=host_loss``
and ``host_return`` side by side (``CellResult.fault``, written by
``pipelines.measure.faults.record``), then one line per cell: who keeps training, and at what cost."""

from __future__ import annotations

import re

from pipelines import platforms
from pipelines.report.tables import _md_table, _text
from pipelines.runfolder.results import CellResult

HEADER = ["cell", "platform", "lost", "at", "the platform", "recovered by", "world size", "recovery s",
          "work lost s", "epochs redone", "resumed from epoch", "test accuracy", "cell"]
OUTCOME = {"recovered": "recovered it", "failed": "failed", "timed_out": "no recovery before the deadline"}
ACTION = {"shrank": "went on with fewer ranks", "restarted": "started its ranks again"}


def _notes(field: str) -> str:
    """The registered platforms' notes of one kind (``Platform.coordinator_note``, ``.retries_note``),
    once each, in the registry's order."""
    notes = [getattr(p, field) for p in platforms.all_platforms() if getattr(p, field)]
    return ", ".join(dict.fromkeys(notes))


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _world_sizes(f: dict) -> str:
    """before → after the loss (-> after the return), e.g. ``2 → 1 → 2``."""
    sizes = [f.get("world_size_before"), f.get("world_size_after_loss")]
    if f.get("returned_at") is not None:
        sizes.append(f.get("world_size_after_return"))
    return "-" if sizes[0] is None else " → ".join("?" if s is None else str(s) for s in sizes)


def _accuracy(result: CellResult) -> str:
    return f"{result.test.accuracy:.3f}" if result.test else "-"


def _row(name: str, result: CellResult) -> list[str]:
    f = result.fault or {}
    outcome = OUTCOME.get(f.get("platform_outcome") or "", "-")
    if f.get("platform_outcome") == "timed_out":
        outcome += f" ({f['deadline_s']:.0f} s)"
    if f.get("platform_action"):
        outcome += f": {ACTION.get(f['platform_action'], f['platform_action'])}"
    lost = f"{f.get('host', '-')} ({f.get('victim', 'worker')})"
    if f.get("kind") == "host_return":
        lost += f", back after {f.get('return_after_s') or 0:.0f} s"
    return [_text(name), _text(result.backend), _text(lost),
            f"epoch {f.get('epoch')} step {f.get('step')}/{f.get('steps')}", _text(outcome),
            _text(f.get("recovered_by", "-")), _text(_world_sizes(f)), _seconds(f.get("recovery_seconds")),
            f"{f.get('lost_seconds', 0.0):.1f}", _text(f.get("epochs_redone", "-")),
            _text(f.get("resumed_from_epoch", "-")), _accuracy(result), _text(result.status)]


def _verdict(name: str, result: CellResult) -> str:
    """One line: who keeps training after the loss, and at what cost."""
    f = result.fault or {}
    by, cost = f.get("recovered_by"), f"{f.get('lost_seconds', 0.0):.1f} s of work lost"
    if by == "platform":
        who = (f"{result.backend} itself keeps training: {_world_sizes(f)} ranks, training again "
               f"{_seconds(f.get('recovery_seconds'))} s after the loss")
    elif by == "project":
        who = (f"{result.backend} did not survive losing its {f.get('victim', 'worker')} host; the project's "
               f"retry relaunched it, training again {_seconds(f.get('recovery_seconds'))} s after the loss")
    else:
        who = f"nobody: the cell {result.status} after losing its {f.get('victim', 'worker')} host"
    if f.get("kind") == "host_return":
        if f.get("grew_back"):
            back = _seconds(f.get("seconds_return_to_full_size"))
            who += f"; back to {f.get('world_size_after_return')} ranks {back} s after the host returned"
        elif f.get("not_restarted"):
            who += "; nothing was started again on the returned host"
        elif f.get("returned_at") is not None:
            who += "; the returned host was not taken back in"
        else:
            who += "; the cell ended before the host came back"
    return f"- {_text(name)}: {_text(who)}; {cost}, test accuracy {_accuracy(result)}."


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
             "(`fault=host_loss`; `fault_victim`: `worker` = the last host, `coordinator` = the first, which holds "
             f"{_notes('coordinator_note')}). With `fault=host_return` the host comes back "
             "`return_after_s` later and its platform agent is started again as an operator's supervisor would "
             "(elastic torchrun: the same torchrun line, which rejoins the rendezvous), so an elastic platform can grow "
             "back to its full world size. \"The platform\" is what its own recovery did within the deadline "
             f"(`platform_retries`: {_notes('retries_note')}); \"recovered by\" `project` means the "
             "project's retry relaunched the cell on every host from its last checkpoint. World size: before → "
             "after the loss (-> after the return). Recovery s: from the loss to the first training step after it; "
             "work lost: training done after the last checkpoint, thrown away (on a return, also the survivors' "
             "epoch in progress when they were stopped to take the host in).", "",
             _md_table(HEADER, [_row(n, r) for n, r in lost.items()]), "",
             "Who keeps training, and at what cost:", ""]
    lines += [_verdict(n, r) for n, r in lost.items()]
    lines.append("")
    errors = [(n, r.fault.get("platform_error")) for n, r in lost.items() if r.fault.get("platform_error")]
    if errors:
        lines += ["What each platform reported when it did not recover:", ""]
        lines += [f"- {_text(n)}: {_text(_headline(str(e))[:300])}" for n, e in errors]
    return "\n".join(lines)
