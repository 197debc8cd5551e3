"""Mask helpers shared by the normalizations and the layers.

Masks are boolean, `True` = may attend, and broadcastable to the scores
`(..., T, S)` (queries on axis -2, keys on axis -1).
"""

import keras
from keras import ops

from keras_attnvariants.validation import check_int
from keras_attnvariants.validation import is_python_value
from keras_attnvariants.validation import static_shape

# Fill value for masked logits. The normalizations run in float32, where
# -1e9 is far below any real logit yet leaves headroom for subtracting a
# logsumexp of the same magnitude without overflowing.
MASK_FILL = -1e9


def large_negative(dtype):
    """A large negative number that is finite in `dtype`.

    The dtype is standardized first: TensorFlow's `str(dtype)` is
    `"<dtype: 'float16'>"` and torch's `"torch.float16"`, so comparing the
    raw string gave float16 `-1e9`, i.e. `-inf`, and NaN gradients on the
    fused path of padded rows.
    """
    if keras.backend.standardize_dtype(dtype) == "float16":
        return -3e4
    return MASK_FILL


def _check_compatible(shapes):
    """`ValueError` unless the static `shapes` broadcast together (sizes
    of 1 and unknown sizes match anything)."""
    known = [s for s in shapes if s is not None]
    # `max` without `default=`: torch.compile cannot trace that keyword.
    for axis in range(1, max([0, *(len(s) for s in known)]) + 1):
        sizes = {s[-axis] for s in known if len(s) >= axis} - {None, 1}
        if len(sizes) > 1:
            raise ValueError(
                "`masks` must have shapes that broadcast together. "
                f"Received: masks with shapes {shapes}"
            )


def merge_masks(*masks):
    """Logical AND of the masks that are not `None` (or `None`).

    `ValueError` for masks whose static shapes do not broadcast together.
    """
    _check_compatible([static_shape(m) for m in masks if m is not None])
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def valid_queries(mask):
    """`(..., T, 1)` booleans: queries that may attend at least one key."""
    return ops.any(mask, axis=-1, keepdims=True)


def valid_keys(mask):
    """`(..., 1, S)` booleans: keys that at least one query may attend."""
    return ops.any(mask, axis=-2, keepdims=True)


def self_attention_padding_mask(mask):
    """Adds query padding implied by key padding, for self-attention.

    keras-hub encoders pass a key-only mask `(B, 1, S)`: padded queries are
    not masked. In self-attention queries and keys are the same tokens, so a
    key that no query may attend marks a padded token. This returns
    `mask & valid_keys(mask)^T`, broadcast to `(..., S, S)`.
    """
    key_valid = valid_keys(mask)  # (..., 1, S)
    query_valid = ops.swapaxes(key_valid, -1, -2)  # (..., S, 1)
    return ops.logical_and(mask, query_valid)


def check_length(name, length):
    """`length` as a Python int >= 0 for Python and NumPy numbers (and
    `ValueError` for None, strings, booleans, floats, negatives); a tensor
    or a symbolic size (a dynamic length) passes, unless its static dtype
    is not an integer."""
    if is_python_value(length):
        return check_int(name, length, low=0)
    dtype = getattr(length, "dtype", None)
    if dtype is not None and "int" not in keras.backend.standardize_dtype(
        dtype
    ):
        raise ValueError(
            f"`{name}` must be an int >= 0 or an integer scalar tensor. "
            f"Received: {name}={length!r}"
        )
    return length


def causal_mask(query_length, key_length):
    """`(T, S)` lower-triangular mask: query `i` attends keys `j <= i`.

    Aligned at the start like Keras MHA's `use_causal_mask` (for `T != S`
    too: with `T < S` the last keys are attended by no query).

    Args:
        query_length: int >= 0 `T` (Python or NumPy), or an integer scalar
            tensor (a dynamic length).
        key_length: int >= 0 `S`, likewise.
    """
    query_length = check_length("query_length", query_length)
    key_length = check_length("key_length", key_length)
    row = ops.expand_dims(ops.arange(query_length), -1)
    col = ops.expand_dims(ops.arange(key_length), 0)
    return ops.greater_equal(row, col)
