"""Attention-guidance target patterns (Deshpande and Narasimhan, 2020).

A pattern `P` is a `(B, T, T)` float32 tensor: row `p` is the distribution a
guided head's query `p` should put on the keys. Rows of padded queries and
columns of padded keys are zero, so padding never enters the guidance loss.
"""

import numpy as np
from keras import ops

from keras_attnvariants.validation import check_integer_dtype
from keras_attnvariants.validation import is_int
from keras_attnvariants.validation import same_size
from keras_attnvariants.validation import static_shape

PATTERN_NAMES = ("first", "next", "prev", "delimiter", "period")
EDGE_ROWS = ("uniform", "zero")
# The arguments of the guidance losses (`AttentionGuidanceRegularizer`,
# `guidance_attention_bias`) that reach `token_id` for each pattern.
LOSS_TOKEN_ID_ARGS = {"delimiter": "delimiter_ids", "period": "period_id"}


def _check_pattern_args(name, token_ids, token_id, edge_rows):
    if name not in PATTERN_NAMES:
        raise ValueError(
            f"`name` must be one of {PATTERN_NAMES}. Received: name={name!r}"
        )
    if edge_rows not in EDGE_ROWS:
        raise ValueError(
            f"`edge_rows` must be one of {EDGE_ROWS}. "
            f"Received: edge_rows={edge_rows!r}"
        )
    if name in ("delimiter", "period"):
        if token_ids is None:
            raise ValueError(
                f"The {name!r} pattern needs `token_ids` of shape (B, T). "
                "Received: token_ids=None"
            )
        # The ids of the guidance losses' `delimiter_ids` / `period_id`:
        # the message names both (it named `token_id` alone, which a loss
        # user never passed).
        normalize_token_id(
            token_id,
            note=f" (the {name!r} pattern's ids: `{LOSS_TOKEN_ID_ARGS[name]}` "
            "of the guidance losses)",
        )


def normalize_token_id(token_id, name="token_id", note=""):
    """`token_id` (an int >= 0 or a non-empty list of them) as a tuple of
    ints.

    Python and NumPy ints are accepted (not booleans), and 1-D NumPy
    arrays of them; a negative id, which no token has, is refused. The
    error names the argument `name`, followed by `note`.
    """
    ids = token_id
    if isinstance(ids, np.ndarray) and ids.ndim == 1:
        ids = list(ids)
    if not isinstance(ids, (list, tuple)):
        ids = [ids]
    if not ids or not all(is_int(i) and i >= 0 for i in ids):
        raise ValueError(
            f"`{name}`{note} must be an int >= 0 or a non-empty list of "
            f"them. Received: {name}={token_id!r}"
        )
    return tuple(int(i) for i in ids)


def _check_token_ids(token_ids, mask_shape):
    """`ValueError` unless `token_ids` are integer ids with the static
    shape `(B, T)` of the padding mask, or a batch of one `(1, T)` (which
    the guidance losses broadcast): `(T,)` ids were broadcast over the
    batch and float ids truncated without a word."""
    shape = static_shape(token_ids)
    check_integer_dtype("token_ids", token_ids, "ids `(B, T)`")
    if shape is not None and not (
        len(shape) == 2
        and (
            1 in (shape[0], mask_shape[0]) or same_size(shape[0], mask_shape[0])
        )
        and same_size(shape[1], mask_shape[1])
    ):
        raise ValueError(
            "`token_ids` must have the shape `(B, T)` of `padding_mask`, "
            f"{mask_shape} (or a batch of one). "
            f"Received: token_ids with shape {shape}"
        )


def guidance_pattern(
    name, padding_mask, token_ids=None, token_id=None, edge_rows="uniform"
):
    """Target pattern `(B, T, T)` of attention guidance.

    Patterns (row = query `p`, column = key `q`, positions are indices):
    - `"first"`: all mass on the first valid token (column 0 with right
      padding).
    - `"next"`: `q = p + 1`. The last valid row has no next token.
    - `"prev"`: `q = p - 1`. The first row has no previous token.
    - `"delimiter"`: uniform over the positions whose id is in `token_id`
      (an int or a list, e.g. the ids of `[CLS]` and `[SEP]`).
    - `"period"`: likewise for the period id (`token_id`).

    Edge rows: a valid query row with no target (the last row of `"next"`,
    the first row of `"prev"`, every row of `"delimiter"` / `"period"` when
    the sequence holds no matching token) is uniform `1/n` over the `n` valid
    tokens with `edge_rows="uniform"` (the paper), or all zero with
    `edge_rows="zero"` (the reference code). Rows of padded queries and
    columns of padded keys are always zero.

    Args:
        name: str. One of `"first"`, `"next"`, `"prev"`, `"delimiter"`,
            `"period"`.
        padding_mask: boolean `(B, T)`, `True` = real token.
        token_ids: integer `(B, T)`, the shape of `padding_mask` (a batch
            of one broadcasts). Needed by `"delimiter"` and `"period"`;
            `ValueError` for other static shapes or a float dtype.
        token_id: int or list of ints. The ids `"delimiter"` / `"period"`
            attend to (`delimiter_ids` / `period_id` of the losses).
        edge_rows: `"uniform"` or `"zero"`. Defaults to `"uniform"`.

    Returns:
        float32 tensor `(B, T, T)`; each valid row sums to 1 (or to 0 for a
        zero edge row).

    Example:

    >>> import numpy as np
    >>> from keras_attnvariants.ops.patterns import guidance_pattern
    >>> mask = np.array([[True, True, True, False]])
    >>> p = np.asarray(guidance_pattern("next", mask))
    >>> p[0, 0].tolist(), p[0, 2].astype("float64").round(3).tolist()
    ([0.0, 1.0, 0.0, 0.0], [0.333, 0.333, 0.333, 0.0])
    """
    _check_pattern_args(name, token_ids, token_id, edge_rows)
    if padding_mask is None:
        # Casting None fails in the backend, with a message naming no
        # argument (each backend its own).
        raise ValueError(
            "`padding_mask` must be a boolean (B, T) mask, True = real "
            "token (all True when nothing is padded). Received: "
            "padding_mask=None"
        )
    valid = ops.cast(padding_mask, "float32")  # (B, T)
    if len(valid.shape) != 2:
        raise ValueError(
            "`padding_mask` must have shape (B, T). Received: padding_mask "
            f"with shape {tuple(valid.shape)}"
        )
    if name in LOSS_TOKEN_ID_ARGS:
        _check_token_ids(token_ids, static_shape(valid))
    length = ops.shape(valid)[1]
    # pair: (B, T, T), 1 where query and key are both real tokens.
    pair = ops.expand_dims(valid, -1) * ops.expand_dims(valid, -2)
    row = ops.expand_dims(ops.arange(length), -1)
    col = ops.expand_dims(ops.arange(length), 0)
    if name == "first":
        first = ops.argmax(valid, axis=-1)  # (B,)
        hits = ops.cast(
            ops.equal(col[None], ops.reshape(first, (-1, 1, 1))), "float32"
        )
        return hits * pair
    if name in ("next", "prev"):
        offset = 1 if name == "next" else -1
        step = ops.cast(ops.equal(col, row + offset), "float32")
        hits = step[None] * pair
    else:
        ids = normalize_token_id(token_id)
        tokens = ops.expand_dims(ops.cast(token_ids, "int32"), -1)
        wanted = ops.convert_to_tensor(ids, dtype="int32")
        # match: (B, T) real tokens whose id is one of `ids`.
        match = ops.cast(ops.any(ops.equal(tokens, wanted), -1), "float32")
        match = match * valid
        count = ops.maximum(ops.sum(match, axis=-1), 1.0)
        hits = ops.expand_dims(valid, -1) * ops.expand_dims(
            match / ops.expand_dims(count, -1), -2
        )
    if edge_rows == "zero":
        return hits
    # edge: (B, T, 1), real queries whose row has no target.
    has_target = ops.cast(ops.sum(hits, -1, keepdims=True) > 0, "float32")
    edge = ops.expand_dims(valid, -1) * (1.0 - has_target)
    n = ops.maximum(ops.sum(valid, axis=-1), 1.0)
    uniform = pair / ops.reshape(n, (-1, 1, 1))
    return hits + edge * uniform
