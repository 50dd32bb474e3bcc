"""What if this run's platforms ran on another cluster, device or job? A model of every term of a
cell's wall time, fitted on the run's measured cells (``model``), asked for any cluster (``predict``),
answered in words (``answer``).

    python -m pipelines whatif runs/<run> --hosts 8 --workers-per-host 4 --network 25gbit --step-ms 12

The fit is saved with the run (``report/whatif.json``, written by evaluation), observations
included, so any run folder can be asked again later, and several can be fitted together
(``fit_runs``: bench/whatif_validate.py fits on some cells and predicts others).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import CellResult
from pipelines.whatif.model import Model, fit
from pipelines.whatif.observe import Observation, observe
from pipelines.whatif.predict import Prediction

MODEL_FILE = "whatif.json"  # under the run's report/


class NoFinishedCell(ValueError):
    """A run folder without one cell the model can learn from."""


def model_path(paths: RunPaths) -> Path:
    return paths.report / MODEL_FILE


def cpu_share_of(paths: RunPaths) -> float | None:
    """The emulated hosts' CPU quota the run had (``cluster.cpu_per_host``), from its config.json."""
    try:
        cluster = json.loads(paths.config.read_text()).get("cluster") or {}
    except (OSError, ValueError):
        return None
    return cluster.get("cpu_per_host") if cluster.get("kind") == "emulated" else None


def observations(run_dir: str | Path, results: dict[str, CellResult] | None = None) -> list[Observation]:
    """Every cell of the run that can teach the model (``observe``), in cell order; ``results``: the
    cells already read (cell name -> result), else their result.json files are read."""
    paths = RunPaths(Path(run_dir))
    if results is None:
        results = {}
        for path in paths.cell_results():
            try:
                results[path.parent.name] = CellResult.read(path)
            except (OSError, ValueError):
                continue  # a cell still writing, or a record of an older layout: nothing to learn
    share = cpu_share_of(paths)
    return [o for name, result in results.items() if (o := observe(name, result, share)) is not None]


def fit_runs(run_dirs: list[str | Path]) -> Model:
    """The model of every usable cell of these run folders; NoFinishedCell names them when none is."""
    found = [o for run in run_dirs for o in observations(run)]
    if not found:
        raise NoFinishedCell(f"{', '.join(map(str, run_dirs))}: no finished cell to fit (a cells/*/result.json "
                             "that finished with its phases and epochs recorded)")
    return fit(found)


def write_model(paths: RunPaths, results: dict[str, CellResult] | None = None) -> Model | None:
    """Fit the run's cells (``results``: already read, by cell name) and save the model beside
    summary.json; None (and no file) without a usable cell."""
    found = observations(paths.root, results)
    if not found:
        model_path(paths).unlink(missing_ok=True)
        return None
    model = fit(found)
    from pipelines.runfolder.fileio import atomic_write_text

    atomic_write_text(model_path(paths), json.dumps(model.as_json(), indent=1))
    return model


def load_model(run_dir: str | Path) -> Model:
    """The run's saved model, else fitted from its cells now."""
    paths = RunPaths(Path(run_dir))
    saved = model_path(paths)
    if saved.exists():
        try:
            return Model.from_json(json.loads(saved.read_text()))
        except (ValueError, KeyError, TypeError):
            pass  # an older layout: fit again from the cells
    return fit_runs([paths.root])


def own_cluster(model: Model, platform: str, strategy: str, workers: int, network: str,
                job=None) -> Prediction | None:
    """The model's prediction of the run's own cells of (platform, strategy, workers, network) for
    ``job`` (their hosts, link and device; None: their own job): what gives the report's measured
    totals and projections their interval from the fit."""
    from pipelines.config.sections import WhatIfConfig
    from pipelines.whatif.predict import WhatIfError, predict_one
    from pipelines.whatif.observe import rate_bps

    seen = [o for o in model.observations if (o.platform, o.strategy, o.workers, o.network)
            == (platform, strategy, workers, network)]
    if not seen:
        return None
    o = seen[0]
    if job is None:
        job = {"train_samples": o.train_samples, "epochs": o.epochs, "test_samples": o.test_samples}
    target = WhatIfConfig(hosts=o.hosts, workers_per_host=o.workers_per_host,
                          network=network if rate_bps(network) else "unshaped", step_ms=None,
                          reference_seconds=None, job=job.model_dump() if hasattr(job, "model_dump") else job)
    try:
        return predict_one(model, platform, target, strategy)
    except WhatIfError:
        return None
