"""Gradient reversal: identity forward, gradient scaled by `-beta` backward.

Written with `stop_gradient` only, so it works unchanged on TensorFlow, JAX
and PyTorch, inside `jit`/XLA, and needs no custom-gradient registration:

`y = stop_gradient(x) - beta * (x - stop_gradient(x))`

Forward, the bracket is exactly 0, so `y = x` bit for bit; backward only
`-beta * x` carries a gradient, `dy/dx = -beta`. Non-finite entries (where
the bracket would be `inf - inf = nan`) pass through as they are, with a
zero gradient. This is the notes' form
`stop_gradient(x (1 + beta)) - x beta` rearranged: that one rounds in the
forward pass and overflows float16 for `|x| (1 + beta) > 65504`.
"""

import keras
from keras import ops

from keras_attnvariants.validation import check_float


def _check_beta(beta):
    """`beta` as a Python float: finite (`nan * 0` made the forward pass
    nan), NumPy scalars accepted."""
    return check_float("beta", beta, low=None)


def gradient_reversal(x, beta=1.0):
    """Identity in the forward pass; multiplies the gradient by `-beta`.

    Used to train an adversary and the features it looks at in one
    optimizer step (Ganin and Lempitsky, 2015): the adversary minimizes a
    loss, the features upstream of the reversal maximize it.

    Args:
        x: tensor of any floating dtype (`ValueError` for another).
        beta: float. Gradient scale; the backward pass multiplies the
            incoming gradient by `-beta`. Defaults to `1.0`.

    Returns:
        A tensor equal to `x` (exactly, in `x`'s dtype, `inf` and `nan`
        included), whose gradient with respect to `x` is `-beta` times the
        incoming one (0 at non-finite entries).

    Example:

    >>> from keras_attnvariants.ops.gradient_reversal import (
    ...     gradient_reversal,
    ... )
    >>> float(gradient_reversal(3.0))
    3.0
    """
    beta = _check_beta(beta)
    x = ops.convert_to_tensor(x)
    dtype = keras.backend.standardize_dtype(x.dtype)
    if "float" not in dtype:
        # An int tensor failed on TensorFlow with a `TypeError` about
        # `1.0`, and came back as float32 on JAX and PyTorch.
        raise ValueError(
            "`x` must be a floating-point tensor (it carries a gradient). "
            f"Received: x with dtype {dtype}"
        )
    frozen = ops.stop_gradient(x)
    reversed_ = frozen - beta * (x - frozen)
    # `inf - inf` is nan: non-finite entries stay as they are (gradient 0).
    return ops.where(ops.isfinite(x), reversed_, frozen)
