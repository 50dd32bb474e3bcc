"""Classification metrics for any number of classes: the one definition every stage uses.

Called by the training workers (rank 0, final test) and by anything that re-scores
predictions. ``labels`` is the task's label set from the manifest (``0..K-1``), so a class that
never occurs in a small test sample still gets its row and column in the confusion matrix.
Everything derives from that matrix, in numpy (scikit-learn's definitions, zero_division=0), so
a bare GPU image needs no scikit-learn (bench/gpu_check.py).
"""

from __future__ import annotations

import numpy as np

from pipelines.runfolder.results import ClassMetrics, TestMetrics


def classification_metrics(y_true, y_pred, loss: float, labels: list[int]) -> TestMetrics:
    """Accuracy, macro precision/recall/F1, per-class metrics and the K x K confusion matrix
    (rows = true class, columns = predicted class)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    matrix = confusion_matrix(y_true, y_pred, labels)
    tp, predicted, support = np.diag(matrix), matrix.sum(axis=0), matrix.sum(axis=1)
    precision = np.divide(tp, predicted, out=np.zeros(len(labels)), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros(len(labels)), where=support > 0)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros(len(labels)), where=both > 0)
    return TestMetrics(
        accuracy=float(np.mean(y_true == y_pred)) if len(y_true) else 0.0,
        f1=float(np.mean(f1)),
        precision=float(np.mean(precision)),
        recall=float(np.mean(recall)),
        loss=float(loss),
        confusion_matrix=matrix.tolist(),
        per_class=[ClassMetrics(label=int(label), precision=float(p), recall=float(r), f1=float(f),
                                support=int(s))
                   for label, p, r, f, s in zip(labels, precision, recall, f1, support)],
    )


def confusion_matrix(y_true, y_pred, labels: list[int]) -> np.ndarray:
    """K x K counts, rows = true class, columns = predicted class; pairs outside ``labels`` are
    left out (as scikit-learn does)."""
    index = {label: i for i, label in enumerate(labels)}
    matrix = np.zeros((len(labels), len(labels)), dtype=np.int64)
    for t, p in zip(np.asarray(y_true).tolist(), np.asarray(y_pred).tolist()):
        if t in index and p in index:
            matrix[index[t], index[p]] += 1
    return matrix
