"""Evaluation measures used by the examples, the demo and the benchmarks.

NumPy functions on concrete arrays (not part of a model graph).
"""

import numpy as np
from keras import ops

from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_int


def as_numpy(value, dtype=None):
    """`value` (a NumPy array, list, or any backend's tensor) as a NumPy
    array: PyTorch tensors that need a gradient or live on a GPU cannot go
    through `np.asarray`."""
    if not isinstance(value, np.ndarray) and ops.is_tensor(value):
        value = ops.convert_to_numpy(value)
    return np.asarray(value, dtype)


def expected_calibration_error(probabilities, labels, num_bins=15):
    """Expected calibration error of a classifier (equal-width bins).

    `sum_b |B_b| / n * |accuracy(B_b) - confidence(B_b)|` over bins of the
    top-class confidence. Bin `b` holds confidences in `[b / num_bins,
    (b + 1) / num_bins)`; the last bin also holds 1. Empty bins add 0.

    Args:
        probabilities: `(n, classes)` predicted probabilities in `[0, 1]`
            (NaN is rejected); `(n, 1)` is a binary classifier's
            probability of class 1 (a sigmoid).
        labels: `(n,)` integer labels in `[0, classes)` (`[0, 2)` for
            `(n, 1)` probabilities).
        num_bins: int >= 1. Defaults to `15`.

    Returns:
        float in `[0, 1]`; NaN when there are no examples (`n = 0`).
    """
    probabilities = as_numpy(probabilities, np.float64)
    labels = as_numpy(labels)
    if probabilities.ndim == 2 and probabilities.shape[1] == 1:
        probabilities = np.concatenate([1.0 - probabilities, probabilities], 1)
    if probabilities.ndim != 2 or labels.shape != probabilities.shape[:1]:
        raise ValueError(
            "`probabilities` must be (n, classes) and `labels` (n,) integers. "
            f"Received: probabilities.shape={probabilities.shape}, "
            f"labels.shape={labels.shape}"
        )
    # Written so that NaN fails too (every comparison with NaN is False).
    outside = ~((probabilities >= 0) & (probabilities <= 1))
    if outside.any():
        raise ValueError(
            "`probabilities` must be finite and lie in [0, 1] (not logits). "
            "Received: probabilities holding "
            f"{np.unique(probabilities[outside])[:5].tolist()}"
        )
    num_bins = check_int("num_bins", num_bins)
    classes = probabilities.shape[1]
    bad = labels
    if labels.dtype.kind in "biuf":
        bad = labels[
            (labels != np.floor(labels)) | (labels < 0) | (labels >= classes)
        ]
    if bad.size:
        raise ValueError(
            f"`labels` must be integers in [0, {classes}), the classes of "
            f"`probabilities`. Received: labels holding "
            f"{np.unique(bad)[:5].tolist()}"
        )
    if not len(labels):
        # The mean over no examples (0.0 would read as perfectly calibrated).
        return float("nan")
    confidence = probabilities.max(-1)
    correct = probabilities.argmax(-1) == labels
    # Compared with the edges themselves: `floor(confidence * num_bins)`
    # put e.g. 0.57 (56.99999999999999 with 100 bins) one bin too low.
    edges = np.arange(num_bins + 1) / num_bins
    bins = np.searchsorted(edges, confidence, side="right") - 1
    bins = np.clip(bins, 0, num_bins - 1)
    ece = 0.0
    for b in range(num_bins):
        members = bins == b
        if members.any():
            gap = abs(correct[members].mean() - confidence[members].mean())
            ece += members.mean() * gap
    return float(ece)


def key_attention_totals(weights, key_mask=None, query_mask=None):
    """Total attention each key receives, `sum_i A_ij`: `(B, N, S)`.

    Args:
        weights: `(B, N, T, S)` attention weights.
        key_mask: optional `(B, S)` booleans, valid keys. Padded keys get NaN
            so that callers can drop them.
        query_mask: optional `(B, T)` booleans, valid queries: the rows of
            padded queries are left out of the sum (in self-attention, pass
            the same padding mask as `key_mask`).
    """
    weights = as_numpy(weights, np.float64)
    if weights.ndim != 4:
        raise ValueError(
            "`weights` must be (batch, heads, queries, keys). "
            f"Received: weights.shape={weights.shape}"
        )
    batch, _, queries, keys = weights.shape
    for name, mask, length in (
        ("key_mask", key_mask, keys),
        ("query_mask", query_mask, queries),
    ):
        if mask is not None and np.shape(mask) != (batch, length):
            raise ValueError(
                f"`{name}` must be ({batch}, {length}) booleans for "
                f"weights.shape={weights.shape}. "
                f"Received: {name}.shape={np.shape(mask)}"
            )
    if query_mask is not None:
        weights = np.where(
            as_numpy(query_mask, bool)[:, None, :, None], weights, 0.0
        )
    totals = weights.sum(-2)
    if key_mask is not None:
        totals = np.where(as_numpy(key_mask, bool)[:, None, :], totals, np.nan)
    return totals


def explained_away_fraction(
    weights, key_mask=None, epsilon=1e-8, query_mask=None
):
    """Fraction of valid keys that are epsilon-explained-away (paper Def. 1).

    A key is epsilon-explained-away when the attention it receives over all
    queries, `sum_i A_ij`, is below `epsilon` (the paper uses 1e-8).

    Args:
        weights: `(B, N, T, S)` attention weights.
        key_mask: optional `(B, S)` booleans, valid keys.
        epsilon: float > 0. Defaults to `1e-8`.
        query_mask: optional `(B, T)` booleans, valid queries (see
            `key_attention_totals`).

    Returns:
        float in `[0, 1]`, over every (example, head, valid key); NaN when
        no key is valid, or when a valid key's total is NaN (NaN weights).
    """
    epsilon = check_float("epsilon", epsilon)
    totals = key_attention_totals(weights, key_mask, query_mask)
    # Valid keys from the mask: a NaN total is padding only where masked.
    valid = np.ones(totals.shape, bool)
    if key_mask is not None:
        valid &= as_numpy(key_mask, bool)[:, None, :]
    totals = totals[valid]
    if not totals.size or np.isnan(totals).any():
        return float("nan")
    return float((totals < epsilon).mean())
