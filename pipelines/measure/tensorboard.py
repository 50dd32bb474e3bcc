"""TensorBoard event files for every cell: ``cells/<cell>/tensorboard/``.

Written from the cell's finished ``CellResult`` by the adapter (``TrainingBackend.run``), after
the timed window, so every backend (torchrun's and every platform's) writes the same scalars
the same way and no rank's training loop pays for it. MLflow logs the folder as the cell run's
``tensorboard`` artifact. Browse a whole run with

    tensorboard --logdir runs/<run_id>/cells

Scalars (step = epoch): ``train/loss``, ``train/accuracy``, ``eval/loss``, ``eval/accuracy``,
``train/learning_rate``, ``throughput/samples_per_second``, ``time/epoch_seconds``; once, at
the last epoch: ``test/accuracy``, ``test/f1``, ``phases/<phase>_seconds`` and
``time/total_seconds``; what the cell's processes used (``pipelines.measure.resources``): ``resources/<figure>``
once, and its timeline as ``resources/{ranks,platform}_{cpu_percent,rss_mb}`` [, ``resources/gpu_*``]
with step = sample index and the wall time each sample was taken.
"""

from __future__ import annotations

import shutil

from pipelines.runfolder.paths import CellPaths
from pipelines.measure.resources import read_timeline
from pipelines.runfolder.results import CellResult

RESOURCE_FIGURES = ("cpu_seconds", "cpu_utilisation", "peak_rss_mb", "ranks_cpu_seconds", "ranks_peak_rss_mb",
                    "platform_cpu_seconds", "platform_peak_rss_mb", "bytes_sent", "bytes_received",
                    "gpu_utilisation_mean", "gpu_peak_memory_mb")


def scalars(result: CellResult) -> list[tuple[str, float, int]]:
    """(tag, value, step) for every scalar the cell's event files hold."""
    out: list[tuple[str, float, int]] = []
    for e in result.epochs:
        out += [("train/loss", e.train_loss, e.epoch), ("train/accuracy", e.train_accuracy, e.epoch),
                ("eval/loss", e.eval_loss, e.epoch), ("eval/accuracy", e.eval_accuracy, e.epoch),
                ("throughput/samples_per_second", e.samples_per_second, e.epoch),
                ("time/epoch_seconds", e.epoch_seconds, e.epoch)]
        if e.learning_rate is not None:
            out.append(("train/learning_rate", e.learning_rate, e.epoch))
    last = result.epochs[-1].epoch if result.epochs else 0
    if result.test is not None:
        out += [("test/accuracy", result.test.accuracy, last), ("test/f1", result.test.f1, last)]
    out += [(f"phases/{name}_seconds", seconds, last) for name, seconds in result.phases.items()]
    out.append(("time/total_seconds", result.total_seconds, last))
    usage = result.resources
    if usage is not None:
        out += [(f"resources/{k}", getattr(usage, k), last) for k in RESOURCE_FIGURES
                if getattr(usage, k) is not None]
    return out


def timeline_scalars(result: CellResult, cell: CellPaths) -> list[tuple[str, float, int, float]]:
    """(tag, value, step, wall time) of every sample of the cell's resource timeline."""
    started = result.resources.started if result.resources else 0.0
    return [(f"resources/{k}", float(v), step, started + row.get("t", 0.0))
            for step, row in enumerate(read_timeline(cell.root)) for k, v in row.items()
            if k != "t" and isinstance(v, int | float)]


def write_events(result: CellResult, cell: CellPaths) -> CellPaths:
    """Replace ``<cell>/tensorboard`` with the event files of ``result`` (a retried cell's
    earlier files go: one run per cell folder)."""
    # tensorboardX, not torch.utils.tensorboard: torch's imports TensorFlow whenever it is installed
    # (tensorboard.compat, for tf.io.gfile), which the TensorFlow platform's environment is: ~10 s of
    # every cell's finish on a loaded core, for files both write the same
    from tensorboardX import SummaryWriter

    shutil.rmtree(cell.tensorboard, ignore_errors=True)
    with SummaryWriter(str(cell.tensorboard)) as writer:
        for tag, value, step in scalars(result):
            writer.add_scalar(tag, float(value), global_step=step)
        for tag, value, step, walltime in timeline_scalars(result, cell):
            writer.add_scalar(tag, value, global_step=step, walltime=walltime)
        writer.add_text("cell", f"{str(result.backend)} x {result.world_size} workers, repeat {result.repeat}, "
                                f"mode {result.platform_mode or 'n/a'}, device {result.device}", global_step=0)
    return cell
