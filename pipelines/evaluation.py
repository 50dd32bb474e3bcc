"""Evaluation: classification metrics of a trained cell on the test split.

``classification_metrics`` is called by the shared training loop (rank 0) at the end of
training; the rest of this module (time-to-accuracy, aggregation over repeats) works on the
``cells/*/result.json`` files.
"""

from __future__ import annotations

import numpy as np

from pipelines.results import TestMetrics


def classification_metrics(labels: np.ndarray, predictions: np.ndarray, loss: float) -> TestMetrics:
    """Binary metrics with label 1 (positive review) as the positive class."""
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

    labels = np.asarray(labels)
    predictions = np.asarray(predictions)
    precision, recall, f1, _ = precision_recall_fscore_support(
        labels, predictions, average="binary", pos_label=1, zero_division=0
    )
    return TestMetrics(
        accuracy=float(accuracy_score(labels, predictions)),
        f1=float(f1),
        precision=float(precision),
        recall=float(recall),
        loss=float(loss),
        confusion_matrix=confusion_matrix(labels, predictions, labels=[0, 1]).tolist(),
    )
