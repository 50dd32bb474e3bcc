"""Classification metrics for any number of classes: the one definition every stage uses.

Called by the training workers (rank 0, final test) and by anything that re-scores
predictions. ``labels`` is the task's label set from the manifest (``0..K-1``), so a class that
never occurs in a small test sample still gets its row and column in the confusion matrix.
"""

from __future__ import annotations

import numpy as np

from pipelines.results import ClassMetrics, TestMetrics


def classification_metrics(y_true, y_pred, loss: float, labels: list[int]) -> TestMetrics:
    """Accuracy, macro precision/recall/F1, per-class metrics and the K x K confusion matrix
    (rows = true class, columns = predicted class)."""
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, average=None, zero_division=0)
    return TestMetrics(
        accuracy=float(accuracy_score(y_true, y_pred)),
        f1=float(np.mean(f1)),
        precision=float(np.mean(precision)),
        recall=float(np.mean(recall)),
        loss=float(loss),
        confusion_matrix=confusion_matrix(y_true, y_pred, labels=labels).tolist(),
        per_class=[ClassMetrics(label=int(label), precision=float(p), recall=float(r), f1=float(f),
                                support=int(s))
                   for label, p, r, f, s in zip(labels, precision, recall, f1, support)],
    )
