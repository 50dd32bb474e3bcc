"""The snapshot manifest (``snapshot/manifest.json``, written by ingest) and the task it defines.

The label set of the task comes from the data, not from code: the distinct labels of the
train snapshot, which must be the integers ``0..K-1`` (K >= 2) so they index the classifier's
outputs. Validation checks every split against it, the model gets K outputs, the metrics
report K classes. A 3-class dataset therefore runs by pointing ``dataset_source`` at it.
"""

from __future__ import annotations

import json
from typing import Any

from pipelines.runfolder.paths import RunPaths


# The snapshot's splits: validation is carved from train (per-epoch evaluation, time-to-target);
# test is evaluated once, at the end of training.
SNAPSHOT_SPLITS = ("train", "validation", "test")


class ManifestError(ValueError):
    """The manifest is missing or does not define a usable task; the message says which."""


def read_manifest(paths: RunPaths) -> dict[str, Any]:
    if not paths.manifest.exists():
        raise ManifestError(f"{paths.manifest} missing: run the ingest stage first")
    return json.loads(paths.manifest.read_text())


def observed_labels(rows_per_label: dict[str, int] | None) -> list[int] | None:
    """Integral labels of a ``rows_per_label`` mapping, sorted; None if any is not integral."""
    if not rows_per_label:
        return None
    out = []
    for key in rows_per_label:
        try:
            value = float(key)
        except ValueError:
            return None
        if value != int(value):
            return None
        out.append(int(value))
    return sorted(out)


def task_labels(manifest: dict[str, Any]) -> list[int]:
    """The task's label set ``[0, ..., K-1]`` from the train split, or ManifestError saying why."""
    train = manifest.get("splits", {}).get("train", {})
    labels = manifest.get("labels") or observed_labels(train.get("rows_per_label"))
    if not labels:
        raise ManifestError(f"the train snapshot has no integral labels (rows per label: "
                            f"{train.get('rows_per_label')}); labels must be integers 0..K-1")
    if labels != list(range(len(labels))) or len(labels) < 2:
        raise ManifestError(f"train labels are {labels}: a classification task needs the integers "
                            f"0..K-1 with K >= 2 (relabel the data set)")
    return labels
