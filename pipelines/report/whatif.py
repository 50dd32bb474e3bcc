"""The report's predictions (``pipelines.whatif``): "Your cluster" (``config.tracking.whatif``: the
cluster, device and job a team states; the study's by default) and the study's own cluster, its
reference platform's time given, every other platform's overhead predicted from this run's measured
platform costs.
Both are labelled as predictions, with their 95 % intervals; a platform is named faster only where
the intervals separate."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipelines import platforms
from pipelines.config import BenchmarkConfig
from pipelines.config.sections import ProjectedJob, WhatIfConfig
from pipelines.report.tables import _md_table, _text, study_overhead
from pipelines.runfolder.paths import RunPaths
from pipelines.whatif import load_model, model_path
from pipelines.whatif.answer import COLUMNS, Answer, _row, ask, cluster_text, leaning_on, ranking
from pipelines.whatif.model import Model
from pipelines.whatif.predict import WhatIfError

# The published study's cluster for its reference platform's figure: 2 GPU hosts of one rank, the IMDB job, 499 s.
# Its link is not stated: 10 Gbit/s assumed (the report says so).
STUDY_TARGET = WhatIfConfig(hosts=2, workers_per_host=1, network="10gbit", reference_seconds=499.0,
                            reference_workers=2, job=ProjectedJob())


@dataclass
class WhatIfSections:
    your_cluster: list[str]
    study: list[str]  # appended to "Beside the published study"


def _model(paths: RunPaths) -> Model | None:
    if not model_path(paths).exists():
        return None
    try:
        return load_model(paths.root)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        return None


def _notes(answer: Answer) -> list[str]:
    notes = leaning_on(answer.predictions)
    return ["Leaning on (where the cells did not vary what the question does):", "",
            *[f"- {_text(n)}" for n in notes], ""] if notes else []


def your_cluster_lines(model: Model, target: WhatIfConfig) -> list[str]:
    try:
        answer = ask(model, target, platforms.reference())
    except WhatIfError as err:
        return [f"No prediction for {cluster_text(target)}: {_text(err)}."]
    rows = [_row(p) for p in answer.predictions]
    lines = [f"**Predicted, not measured**: {_text(cluster_text(answer.target))} (`tracking.whatif`), "
             f"{_text(answer.device)}; link efficiency {_text(answer.link_efficiency)}.", "",
             _md_table(COLUMNS, rows), "", f"Ranking: {_text(ranking(answer.predictions))}.", ""]
    if answer.changes:
        lines += ["Where the order changes:", "", *[f"- {_text(c)}" for c in answer.changes], ""]
    lines += _notes(answer)
    lines.append("Each platform's fixed, per-step, per-epoch and final terms are fitted on this run's cells "
                 "(`pipelines/whatif`, saved in `report/whatif.json`); ask another cluster with "
                 "`python -m pipelines whatif <run folder> --hosts H --workers-per-host W --network 25gbit "
                 "--step-ms S`. Fixed costs (provision, launch, teardown) are as measured on this run's hosts.")
    return lines


def study_lines(model: Model, network: str) -> list[str]:
    """The study's cluster (2 hosts, the reference platform's 499 s given), every platform's predicted
    total and its overhead over the reference beside the study's."""
    reference = platforms.reference()
    target = STUDY_TARGET.model_copy(update={"network": network})
    try:
        answer = ask(model, target, reference)
    except WhatIfError as err:
        return ["", f"Predicted on the study's cluster: none ({_text(err)})."]
    ref = next((p for p in answer.predictions if p.platform == reference), None)
    if ref is None:
        return []
    rows = []
    for p in answer.predictions:
        study = study_overhead(p.platform)
        over = (f"{(p.total / ref.total - 1) * 100:+.0f} % ({(p.low / ref.total - 1) * 100:+.0f} to "
                f"{(p.high / ref.total - 1) * 100:+.0f} %)") if p is not ref else "reference (given: 499 s)"
        rows.append([p.key, f"{p.total:,.0f}", over, "n/a" if study is None else f"{study * 100:+.0f} %"])
    # what each predicted platform's own GPU-side work adds that the prediction leaves out (its record's words)
    left_out = dict.fromkeys(note for p in answer.predictions
                             if (platform := platforms.find(p.platform)) and (note := platform.prediction_note))
    return ["", f"**Predicted** on the study's cluster ({_text(cluster_text(answer.target))}; the study states no "
            f"link speed: {network} assumed), {_text(answer.device)}: this run's measured platform costs on a "
            "device as fast as the study's:", "",
            _md_table(["platform", "predicted total s", "predicted overhead vs reference (95 %)", "study's overhead"],
                      rows),
            "", "What the prediction does not hold: each platform's GPU-side work beyond the shared training loop"
            + (f" ({_text('; '.join(left_out))})" if left_out else "") + "; the fixed costs are this run's CPU hosts'."]


def whatif_sections(config: BenchmarkConfig, paths: RunPaths) -> WhatIfSections | None:
    """Both parts, or None when the run has no fitted model (no finished cell)."""
    model = _model(paths)
    if model is None:
        return None
    target = config.tracking.whatif
    return WhatIfSections(your_cluster=your_cluster_lines(model, target), study=study_lines(model, target.network))
