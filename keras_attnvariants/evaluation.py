"""Evaluation measures used by the examples, the demo and the benchmarks.

NumPy functions on concrete arrays (not part of a model graph).
"""

import numpy as np


def expected_calibration_error(probabilities, labels, num_bins=15):
    """Expected calibration error of a classifier (equal-width bins).

    `sum_b |B_b| / n * |accuracy(B_b) - confidence(B_b)|` over bins of the
    top-class confidence.

    Args:
        probabilities: `(n, classes)` predicted probabilities.
        labels: `(n,)` integer labels.
        num_bins: int >= 1. Defaults to `15`.

    Returns:
        float in `[0, 1]`.
    """
    probabilities = np.asarray(probabilities, np.float64)
    labels = np.asarray(labels)
    if probabilities.ndim != 2 or len(probabilities) != len(labels):
        raise ValueError(
            "`probabilities` must be (n, classes) with n = len(labels). "
            f"Received: probabilities.shape={probabilities.shape}, "
            f"labels.shape={labels.shape}"
        )
    if num_bins < 1:
        raise ValueError(f"`num_bins` must be >= 1. Received: {num_bins}")
    confidence = probabilities.max(-1)
    correct = probabilities.argmax(-1) == labels
    bins = np.minimum((confidence * num_bins).astype(int), num_bins - 1)
    ece = 0.0
    for b in range(num_bins):
        members = bins == b
        if members.any():
            gap = abs(correct[members].mean() - confidence[members].mean())
            ece += members.mean() * gap
    return float(ece)


def key_attention_totals(weights, key_mask=None):
    """Total attention each key receives, `sum_i A_ij`: `(B, N, S)`.

    Args:
        weights: `(B, N, T, S)` attention weights.
        key_mask: optional `(B, S)` booleans, valid keys. Padded keys get NaN
            so that callers can drop them.
    """
    totals = np.asarray(weights, np.float64).sum(-2)
    if key_mask is not None:
        totals = np.where(
            np.asarray(key_mask, bool)[:, None, :], totals, np.nan
        )
    return totals


def explained_away_fraction(weights, key_mask=None, epsilon=1e-8):
    """Fraction of valid keys that are epsilon-explained-away (paper Def. 1).

    A key is epsilon-explained-away when the attention it receives over all
    queries, `sum_i A_ij`, is below `epsilon` (the paper uses 1e-8).

    Args:
        weights: `(B, N, T, S)` attention weights.
        key_mask: optional `(B, S)` booleans, valid keys.
        epsilon: float. Defaults to `1e-8`.

    Returns:
        float in `[0, 1]`, over every (example, head, valid key).
    """
    totals = key_attention_totals(weights, key_mask)
    valid = ~np.isnan(totals)
    return float((totals[valid] < epsilon).mean())
