"""Receptive fields of discrete attention (Kinley 2020, appendix).

`s^l_ij` says whether token `i`'s representation at layer `l` depends on
token `j`'s embedding. With residual connections and attention `z^l`:

`s^0 = I`, `s^l_ij = min(s^{l-1}_ij + sum_k z^l_ik s^{l-1}_kj, 1)`.

With relaxed Gumbel samples `z` this is differentiable (soft receptive
fields); with one-hot argmax attention it is exact (hard receptive fields).
Heads are summed: attending `k` through any head makes `k`'s dependencies
yours.

About the size reduction: the thesis prints
`|U_i r(i, L)| = sum_i min(sum_j s^L_ij, 1)`, but every `s_ii = 1`, so each
`min(., 1)` is 1 and the sum is the constant `T`: no gradient. The union
of the receptive fields, `sum_j min(sum_i s^L_ij, 1)` (a token is in
the union if any position depends on it), is implemented as
`receptive_field_union_size` as the reference notes suggest, but it is
degenerate too: position `j` depends on itself (`s_jj = 1`), so every
valid token is in the union and the size is the number of valid tokens,
whatever the attention. The per-position mean size
`mean_i sum_j s^L_ij` (`receptive_field_mean_size`) is the useful
sparsity penalty; it is the default of the encoder's regularizer.

Saturation: summed over `N` heads, a row of soft samples holds mass `N`,
so a field can grow by a factor `N + 1` per layer, and an entry at the
`min(., 1)` cap passes no gradient. Measured on a fresh single-stream
encoder (4 layers, 2 heads, d_model 64, 2026-11-27): causal over 31
tokens (the appendix's language model), the mean size is 13.6 of at most
16 with 34% of the entries capped, and the penalty has a gradient;
bidirectional over 30 tokens every entry is capped and it has none. More
heads or layers, or attention without a causal mask, call for a check of
`receptive_fields` at initialization.
"""

from keras import ops

from keras_attnvariants.validation import check_broadcastable
from keras_attnvariants.validation import same_size
from keras_attnvariants.validation import static_shape


def _token_mask(mask, like):
    """float32 `(B, T)` valid-token mask (all ones when `mask` is None).

    `ValueError` for a mask of another shape (it failed later with the
    backend's own "Incompatible shapes")."""
    if mask is None:
        return ops.ones(ops.shape(like)[:2], "float32")
    expected = tuple(ops.shape(like)[:2])
    received = tuple(ops.shape(mask))
    known = all(isinstance(d, int) for d in expected + received)
    if len(received) != 2 or (known and received != expected):
        raise ValueError(
            "`mask` must be `(B, T)` booleans, "
            f"{expected} here. Received: mask with shape {received}"
        )
    return ops.cast(mask, "float32")


def unstack_layers(attentions):
    """A stacked `(L, B, N, T, T)` array or tensor as a list of its `L`
    layers (an accepted form, as a list of layers is); else unchanged."""
    if isinstance(attentions, (list, tuple)) or attentions is None:
        return attentions
    shape = getattr(attentions, "shape", None)
    if shape is not None and len(shape) == 5 and isinstance(shape[0], int):
        return [attentions[i] for i in range(shape[0])]
    return attentions


def layer_list(attentions, square=False):
    """Per-layer attention weights as a non-empty list, checked.

    The one check of `receptive_fields` and
    `analysis.attention_importance`: a single tensor was iterated over
    its batch, and layers of another batch (or another key length)
    broadcast into the sum.

    Args:
        attentions: list (or tuple) of per-layer weights `(B, N, T, S)` or
            `(B, T, S)`, or the layers stacked `(L, B, N, T, S)`.
        square: self-attention weights only (`T == S`).

    Returns:
        list of the layers' weights; array-likes without a `shape` become
        tensors.
    """
    form = (
        "`(B, N, T, T)` or `(B, T, T)`"
        if square
        else "`(B, N, T, S)` or `(B, T, S)`"
    )
    attentions = unstack_layers(attentions)
    if not isinstance(attentions, (list, tuple)) or not attentions:
        received = (
            f"attentions with shape {static_shape(attentions)}"
            if hasattr(attentions, "shape")
            else f"attentions={attentions!r}"
        )
        raise ValueError(
            "`attentions` must be a non-empty list (or tuple) of per-layer "
            f"weights {form}; for one layer pass `[weights]`. "
            f"Received: {received}"
        )
    if any(z is None for z in attentions):
        raise ValueError(
            f"Each of `attentions` must be weights {form}. "
            "Received: an element None"
        )
    attentions = [
        z if hasattr(z, "shape") else ops.convert_to_tensor(z)
        for z in attentions
    ]
    first = None
    for z in attentions:
        shape = static_shape(z)
        if shape is None:
            continue
        if len(shape) not in (3, 4) or (
            # One example's `(T, T)` weights or non-square `(B, 1, S)` ones
            # broadcast into a wrong field without a word.
            square and not same_size(shape[-1], shape[-2])
        ):
            kind = "self-attention " if square else ""
            raise ValueError(
                f"Each of `attentions` must be {kind}weights {form}. "
                f"Received: attentions with shape {shape}"
            )
        if first is None:
            first = shape
        elif not (
            same_size(shape[0], first[0]) and same_size(shape[-1], first[-1])
        ):
            raise ValueError(
                "`attentions` must all have the same batch B and keys S "
                f"as the first layer, shape {first}. Received: attentions "
                f"with shapes {[static_shape(a) for a in attentions]}"
            )
    return attentions


def receptive_fields(attentions, mask=None):
    """Soft receptive fields `s^L` from per-layer self-attention.

    Args:
        attentions: list (or tuple) of per-layer weights, each
            `(B, N, T, T)` or `(B, T, T)`, of one batch `B` and length `T`
            (or the layers stacked, `(L, B, N, T, T)`):
            relaxed samples (training) or one-hot (inference). `ValueError`
            for anything else (a single tensor was iterated over its batch;
            layers of batch 1 were broadcast to the others).
        mask: optional `(B, T)` booleans, `True` = real token.

    Returns:
        float32 `(B, T, T)` in `[0, 1]`; `[b, i, j]` is the dependence of
        position `i` on token `j`. Rows and columns of padded tokens are 0.
    """
    attentions = layer_list(attentions, square=True)
    first = ops.cast(attentions[0], "float32")
    length = ops.shape(first)[-1]
    valid = _token_mask(mask, first[:, 0] if len(first.shape) == 4 else first)
    pair = ops.expand_dims(valid, -1) * ops.expand_dims(valid, -2)
    s = ops.expand_dims(ops.eye(length, dtype="float32"), 0) * pair
    for z in attentions:
        z = ops.cast(z, "float32")
        if len(z.shape) == 4:
            z = ops.sum(z, axis=1)
        s = ops.minimum(s + ops.matmul(z * pair, s), 1.0)
    return s


def hard_receptive_fields(attentions, mask=None):
    """Boolean `(B, T, T)` receptive fields from one-hot attention."""
    return ops.greater(receptive_fields(attentions, mask), 0.5)


def _check_fields(fields):
    """`ValueError` unless `fields` is `(B, T, T)` (one example's `(T, T)`
    was read as T examples, a stack of layers broadcast in the backend)."""
    shape = static_shape(fields)
    if shape is not None and (
        len(shape) != 3 or not same_size(shape[-1], shape[-2])
    ):
        raise ValueError(
            "`fields` must be receptive fields `(B, T, T)` (from "
            "`receptive_fields`); for one example pass `fields[None]`. "
            f"Received: fields with shape {shape}"
        )


def receptive_field_union_size(fields):
    """`sum_j min(sum_i s_ij, 1)`: soft size of the union, `(B,)`.

    Equals the number of valid tokens for fields from `receptive_fields`
    (every `s_jj = 1`); see the module docstring. `ValueError` unless
    `fields` is `(B, T, T)`.
    """
    _check_fields(fields)
    return ops.sum(ops.minimum(ops.sum(fields, axis=-2), 1.0), axis=-1)


def receptive_field_mean_size(fields, mask=None):
    """`mean_i sum_j s_ij` over the valid positions, `(B,)`.

    `ValueError` unless `fields` is `(B, T, T)` and `mask` `(B, T)`."""
    _check_fields(fields)
    valid = _token_mask(mask, fields)
    sizes = ops.sum(fields, axis=-1) * valid
    return ops.sum(sizes, axis=-1) / ops.maximum(ops.sum(valid, axis=-1), 1.0)


def precision_recall(predicted, target, mask=None):
    """Micro-averaged precision and recall of dependency sets.

    Args:
        predicted: boolean `(B, T, T)` receptive fields.
        target: boolean `(B, T, T)` true dependencies.
        mask: optional boolean broadcastable to `(B, T, T)`: the entries
            to score, e.g. `valid[:, :, None]` for the rows of real
            positions. `ValueError` if its static shape is not, or for a
            rank-2 mask where a `(B, T)` padding mask (what the other
            receptive-field functions take) would broadcast over the wrong
            axes: when `B == T`, and a `(1, T)` mask when `B == 1`, which
            would select columns, not rows.

    Returns:
        `(precision, recall)` as float32 scalars; 0 where undefined.
    """
    predicted = ops.cast(predicted, "float32")
    target = ops.cast(target, "float32")
    shapes = tuple(predicted.shape), tuple(target.shape)
    if len(shapes[0]) != 3 or shapes[0] != shapes[1]:
        raise ValueError(
            "`predicted` and `target` must both be `(B, T, T)` booleans of "
            f"the same shape. Received: predicted.shape={shapes[0]}, "
            f"target.shape={shapes[1]}"
        )
    if mask is not None:
        mask_shape = static_shape(mask)
        batch, length = shapes[0][0], shapes[0][1]
        if (
            mask_shape is not None
            and len(mask_shape) == 2
            and batch is not None
            and (batch == length or tuple(mask_shape) == (1, length))
            and length != 1
        ):
            # Ambiguous: a `(B, T)` padding mask broadcast over the wrong
            # axes (it fails the broadcast check for other B).
            raise ValueError(
                "`mask` must be rank 3 when `B == T` or `B == 1`, e.g. "
                "`valid[:, :, None]` for a `(B, T)` padding mask or "
                "`mask[None]` for a `(T, T)` one. "
                f"Received: mask with shape {mask_shape} for `predicted` "
                f"of shape {shapes[0]}"
            )
        check_broadcastable("mask", mask_shape, shapes[0], "`predicted`")
        weight = ops.cast(mask, "float32")
        predicted = predicted * weight
        target = target * weight
    hits = ops.sum(predicted * target)
    precision = hits / ops.maximum(ops.sum(predicted), 1.0)
    recall = hits / ops.maximum(ops.sum(target), 1.0)
    return precision, recall
