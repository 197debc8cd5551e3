"""Recording what the `_compute_attention` of attention layers sees.

For analysis, not training: within `record_attention(layers)`, every call
of a layer's `_compute_attention` (the extension point of
`keras.layers.MultiHeadAttention`, whose signature
`tests/layers/mha_contract_test.py` pins) is appended to a list of
`AttentionCall` records, in call order. The recorder is an instance
attribute that shadows the class method and is removed on exit, even if
the forward pass raises (an instance attribute that was there before, e.g.
the recorder of an enclosing `record_attention`, is put back, so recorders
nest). Run the forward pass eagerly: inside a traced function the records
would hold symbolic tensors.
"""

import contextlib
import functools
import inspect
from collections.abc import Iterable
from dataclasses import dataclass

from keras import layers as keras_layers
from keras import ops

from keras_attnvariants.validation import check_bool


@dataclass
class AttentionCall:
    """One call of an attention layer's `_compute_attention`.

    Attributes:
        layer: the `keras.layers.MultiHeadAttention` that was called.
        query: projected query `(B, T, N, H)`.
        key: projected key `(B, S, N, H)`.
        value: projected value `(B, S, N, H)`.
        attention_mask: bool mask broadcastable to `(B, T, S)` (or with a
            head axis), or `None`. A call made with `use_causal_mask=True`
            (Keras MHA's causal-only fused path) records the causal mask.
        weights: attention weights `(B, N, T, S)` before dropout, or `None`
            when the layer did not return them (see `with_weights`).
    """

    layer: object
    query: object
    key: object
    value: object
    attention_mask: object
    weights: object


@contextlib.contextmanager
def record_attention(layers, with_weights=False):
    """Records every `_compute_attention` call of `layers`.

    Args:
        layers: iterable of `keras.layers.MultiHeadAttention` (this
            package's layers, plain Keras MHA, keras-hub's cached
            attention). A layer listed twice is wrapped once.
        with_weights: bool. If `True`, each call is made with
            `return_attention_scores=True` so that `weights` is recorded
            (this turns off MHA's fused path; outputs are unchanged up to
            float rounding). Defaults to `False`.

    Yields:
        The list of `AttentionCall`, filled as the layers are called.

    Example:

    >>> import numpy as np
    >>> import keras
    >>> from keras_attnvariants.layers.recording import record_attention
    >>> mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = np.ones((1, 3, 8), "float32")
    >>> with record_attention([mha], with_weights=True) as calls:
    ...     _ = mha(x, x)
    >>> tuple(calls[0].weights.shape)
    (1, 2, 3, 3)
    """
    if isinstance(layers, keras_layers.Layer):
        raise ValueError(
            "`layers` must be an iterable of "
            "`keras.layers.MultiHeadAttention` (e.g. `[layer]`). "
            f"Received: a single {type(layers).__name__}"
        )
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        # None raised TypeError ("not iterable") from `dict.fromkeys`.
        raise ValueError(
            "`layers` must be an iterable of "
            "`keras.layers.MultiHeadAttention` (e.g. `[layer]`). "
            f"Received: layers={layers!r}"
        )
    layers = list(dict.fromkeys(layers))
    for layer in layers:
        if not isinstance(layer, keras_layers.MultiHeadAttention):
            raise ValueError(
                "`layers` must hold `keras.layers.MultiHeadAttention` "
                f"instances. Received: {type(layer).__name__}"
            )
    with_weights = check_bool("with_weights", with_weights)
    calls = []
    # (layer, the instance attribute it had before, if any), to restore.
    wrapped = []
    try:
        for layer in layers:
            previous = vars(layer).get("_compute_attention")
            layer._compute_attention = _recorder(layer, calls, with_weights)
            wrapped.append((layer, previous))
        yield calls
    finally:
        for layer, previous in reversed(wrapped):
            layer.__dict__.pop("_compute_attention", None)
            if previous is not None:
                layer._compute_attention = previous


def _recorder(layer, calls, with_weights):
    """`layer._compute_attention`, appending an `AttentionCall` per call."""
    compute = layer._compute_attention
    signature = inspect.signature(compute)

    # `wraps`: a nested recorder binds with the method's own signature.
    @functools.wraps(compute)
    def compute_and_record(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if with_weights:
            bound.arguments["return_attention_scores"] = True
        output, weights = compute(*bound.args, **bound.kwargs)
        arguments = bound.arguments
        mask = arguments.get("attention_mask")
        if arguments.get("use_causal_mask"):
            mask = _with_causal_mask(mask, arguments["query"], arguments["key"])
        calls.append(
            AttentionCall(
                layer=layer,
                query=arguments["query"],
                key=arguments["key"],
                value=arguments["value"],
                attention_mask=mask,
                weights=weights,
            )
        )
        return output, weights

    return compute_and_record


def _with_causal_mask(mask, query, key):
    """`mask` and the causal mask `(1, T, S)` (query `i` sees keys `<= i`)."""
    # Keras MHA passes `attention_mask=None, use_causal_mask=True` when the
    # causal mask is its only mask (its fused causal kernel builds none).
    ones = ops.ones((1, ops.shape(query)[1], ops.shape(key)[1]), "int32")
    causal = ops.greater_equal(ops.cumsum(ones, -2), ops.cumsum(ones, -1))
    if mask is None:
        return causal
    return ops.logical_and(ops.cast(mask, "bool"), causal)
