"""The plain log-space normalizations, differentiated by the backend.

References for the analytic backward passes (`ops.normalization`,
`ops.combine`): the formulas as written, with autodiff's gradients.
"""

from keras import ops

FILL = -1e9


def autodiff_dnas(scores, mask):
    """The log-space formula, differentiated by the backend."""
    x = scores if mask is None else ops.where(mask, scores, FILL)
    c = ops.logsumexp(x, axis=-2, keepdims=True)
    c = ops.where(c < 0.5 * FILL, 0.0, c)
    weights = ops.softmax(x - c, axis=-1)
    return weights if mask is None else ops.where(mask, weights, 0.0)


def autodiff_softmax(scores, mask):
    x = scores if mask is None else ops.where(mask, scores, FILL)
    weights = ops.softmax(x, axis=-1)
    return weights if mask is None else ops.where(mask, weights, 0.0)


def autodiff_hybrid(scores, mix, mask):
    unas = autodiff_softmax(scores, mask)
    return unas + mix * (autodiff_dnas(scores, mask) - unas)


def edge_mask(rng):
    """(2, 1, 5, 7): padding, a query with no key, a key with no query."""
    mask = rng.random((2, 1, 5, 7)) < 0.7
    mask[0, 0, 1, :] = False
    mask[1, 0, :, 2] = False
    mask[1, 0, 4, :] = False
    return mask
