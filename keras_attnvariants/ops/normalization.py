"""Attention normalizations: masked softmax, doubly-normalized, hybrid.

Pure functions on `keras.ops`. Scores are `(..., T, S)`: queries on axis -2,
keys on axis -1. Everything runs in float32 and is cast back to the scores'
dtype. Masked entries are exactly 0; fully masked rows or columns give zeros,
never NaN.
"""

from keras import ops

from keras_attnvariants.ops.masking import MASK_FILL


def _prepare(scores, mask):
    """Float32 scores with masked entries at `MASK_FILL`, plus the mask."""
    x = ops.cast(scores, "float32")
    if mask is None:
        return x, None
    mask = ops.broadcast_to(ops.cast(mask, "bool"), ops.shape(x))
    return ops.where(mask, x, MASK_FILL), mask


def _column_log_normalizer(x, masked):
    """`logsumexp` over queries (axis -2), 0 for columns with no valid query.

    Setting the normalizer of a fully masked column to 0 keeps its entries at
    `MASK_FILL`; subtracting its logsumexp would lift them back to about
    `-log T` and let a padded key receive attention again.
    """
    c = ops.logsumexp(x, axis=-2, keepdims=True)
    if masked:
        c = ops.where(c < 0.5 * MASK_FILL, 0.0, c)
    return c


def _apply_mask(weights, mask):
    return weights if mask is None else ops.where(mask, weights, 0.0)


def _softmax32(x, mask):
    return _apply_mask(ops.softmax(x, axis=-1), mask)


def _doubly_normalize32(x, mask, iterations):
    masked = mask is not None
    for step in range(iterations):
        # Column step: normalize each key over its valid queries.
        x = x - _column_log_normalizer(x, masked)
        if step + 1 < iterations:
            # Row step in log space; the last one is the softmax below.
            x = x - ops.logsumexp(x, axis=-1, keepdims=True)
            if masked:
                x = ops.where(mask, x, MASK_FILL)
    return _softmax32(x, mask)


def _check_iterations(iterations):
    if isinstance(iterations, bool) or not isinstance(iterations, int):
        raise ValueError(
            "`iterations` must be an int >= 1. "
            f"Received: iterations={iterations!r}"
        )
    if iterations < 1:
        raise ValueError(
            f"`iterations` must be >= 1. Received: iterations={iterations}"
        )


def masked_softmax(scores, mask=None):
    """Softmax over keys (axis -1) with a boolean mask.

    Args:
        scores: tensor of shape `(..., T, S)`.
        mask: optional boolean tensor broadcastable to `scores`, `True` =
            may attend.

    Returns:
        Weights of the shape and dtype of `scores`. Masked entries are 0 and
        a query row with no valid key is all zeros.
    """
    x, mask = _prepare(scores, mask)
    return ops.cast(_softmax32(x, mask), scores.dtype)


def doubly_normalize(scores, mask=None, iterations=1):
    """Doubly-normalized attention weights (DNAS, Algorithm 1).

    Each key is first normalized over its valid queries,
    `xi_ij = exp(s_ij) / sum_i exp(s_ij)`, then each query over its valid
    keys, `A_ij = xi_ij / sum_j xi_ij`. In log space this is
    `A = softmax_j(s_ij - logsumexp_i s_ij)`. With `iterations > 1` the two
    steps repeat (Sinkhorn, paper Eq. 10), approaching a doubly stochastic
    matrix.

    Args:
        scores: tensor of shape `(..., T, S)`.
        mask: optional boolean tensor broadcastable to `scores`, `True` =
            may attend. Padded queries must be masked here (their rows
            `False`) so they take no part in any key's normalization.
        iterations: int >= 1. Sinkhorn iterations; 1 is the paper's DNAS.

    Returns:
        Weights of the shape and dtype of `scores`: each valid row sums to 1
        and every valid key's column sums to at least `1 / S_valid`
        (Theorem 2). Masked entries, rows with no valid key and columns with
        no valid query are 0.
    """
    _check_iterations(iterations)
    x, mask = _prepare(scores, mask)
    return ops.cast(_doubly_normalize32(x, mask, iterations), scores.dtype)


def hybrid_normalize(scores, mix, mask=None, iterations=1):
    """Hybrid attention weights (HNAS, paper Eq. 12).

    `mix * doubly_normalize(scores) + (1 - mix) * masked_softmax(scores)`.

    Args:
        scores: tensor of shape `(..., T, S)`.
        mix: tensor broadcastable to `scores` with values in `[0, 1]`, e.g.
            one value per head shaped `(N, 1, 1)`.
        mask: optional boolean mask, as in `doubly_normalize`.
        iterations: Sinkhorn iterations of the doubly-normalized part.

    Returns:
        Weights of the shape and dtype of `scores`.
    """
    _check_iterations(iterations)
    x, mask = _prepare(scores, mask)
    mix = ops.cast(mix, "float32")
    dnas = _doubly_normalize32(x, mask, iterations)
    unas = _softmax32(x, mask)
    weights = unas + mix * (dnas - unas)
    return ops.cast(weights, scores.dtype)


def doubly_normalized_bias(scores, mask=None):
    """The per-key bias that turns softmax into DNAS: `-logsumexp_i s_ij`.

    `softmax_j(s_ij + b_j)` with `b = doubly_normalized_bias(s, mask)` equals
    `doubly_normalize(s, mask)` on valid entries, so DNAS can run through
    fused `keras.ops.dot_product_attention(..., bias=b)` kernels.

    Args:
        scores: tensor of shape `(..., T, S)`.
        mask: optional boolean mask broadcastable to `scores`.

    Returns:
        float32 tensor of shape `(..., 1, S)`; 0 for keys with no valid query.
    """
    x, mask = _prepare(scores, mask)
    return -_column_log_normalizer(x, mask is not None)
