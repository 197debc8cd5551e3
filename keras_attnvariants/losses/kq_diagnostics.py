"""Total key/query MMD of a model over a dataset, per layer and head.

The paper's diagnostic (Zhang et al. 2021, appendix): the squared
Gaussian-kernel MMD between each head's query cloud and key cloud, averaged
over examples, summed over heads and layers (MRPC: 0.057 without alignment,
0.0038 with).

How the projections are collected: during an eager inference forward pass
(`training=False`, so dropout is off and nothing is trained), every
`keras.layers.MultiHeadAttention` in the model (this package's layers, plain
Keras MHA and keras-hub's cached attention all subclass it) has its
`_compute_attention` wrapped by an instance attribute that records the
projected query `(B, T, N, H)`, key `(B, S, N, H)` and attention mask it is
called with, and then calls the original. The wrappers are removed in a
`finally` block. `_compute_attention` is the extension point Keras
documents and our contract test pins its signature
(`tests/layers/mha_contract_test.py`). Padding comes from the attention
mask exactly as `AttentionContext` derives it: a query is real if it may
attend some key, a key if some query may attend it; in layers known to be
self-attention (keras-hub blocks' self-attention, converted or not, and
layers with `self_attention_padding=True`) a query is real only if its
position is a real key too, so padding never enters a cloud.
"""

import itertools
from collections.abc import Iterable

import numpy as np
from keras import layers
from keras import ops

from keras_attnvariants.layers.recording import record_attention
from keras_attnvariants.losses.attention_loss import padding_masks
from keras_attnvariants.ops.transport import gaussian_mmd
from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_int


def _all_layers(model):
    """`model` and every layer nested in it, outermost first."""
    yield model
    for child in model._flatten_layers(include_self=False, recursive=False):
        yield from _all_layers(child)


def _check_model(model):
    """`ValueError` unless `model` is a Keras layer (a model is one)."""
    if not isinstance(model, layers.Layer):
        # None or a string failed with an AttributeError on
        # `_flatten_layers`.
        raise ValueError(
            "`model` must be a Keras model (or layer) containing "
            "`keras.layers.MultiHeadAttention` layers. "
            f"Received: model={model!r}"
        )


def attention_layers(model):
    """All `MultiHeadAttention` layers of `model`, outermost first.

    Raises `ValueError` if `model` is not a Keras model or layer.
    """
    _check_model(model)
    found = [
        layer
        for layer in _all_layers(model)
        if isinstance(layer, layers.MultiHeadAttention)
    ]
    return list(dict.fromkeys(found))


def _self_attention_ids(model):
    """`{id(layer)}` of the attention layers of `model` known to be
    self-attention: the `_self_attention_layer` of keras-hub transformer
    blocks (converted or not) and layers of this package with
    `self_attention_padding` or created by `convert_backbone`."""
    found = set()
    for layer in _all_layers(model):
        inner = getattr(layer, "_self_attention_layer", None)
        if isinstance(inner, layers.MultiHeadAttention):
            found.add(id(inner))
        if getattr(layer, "self_attention_padding", False) or getattr(
            layer, "_is_self_attention", False
        ):
            found.add(id(layer))
    return found


def layer_labels(targets):
    """`{id(layer): label}`: the layer name, `name_<i>` when names repeat
    (`i` counts the layers of that name, as the README says; it counted
    every attention layer, so one other layer first shifted them)."""
    names = [layer.name for layer in targets]
    seen = {}
    labels = {}
    for layer in targets:
        if names.count(layer.name) == 1:
            labels[id(layer)] = layer.name
            continue
        index = seen.get(layer.name, 0)
        seen[layer.name] = index + 1
        labels[id(layer)] = f"{layer.name}_{index}"
    return labels


def _batch_data(x):
    """Whether `x` is a batch's data (a dict, an array, a tensor), which
    iterated would give keys or rows, not batches."""
    return isinstance(x, (dict, np.ndarray)) or ops.is_tensor(x)


def key_query_mmd(model, dataset, bandwidth=1.0, max_batches=None):
    """Mean key/query MMD per attention layer and head.

    Args:
        model: a Keras model (or layer) containing attention layers.
        dataset: iterable of batches: model inputs (a list is the inputs
            of a multi-input model), or `(inputs, ...)` tuples. Not one
            batch itself (`ValueError` for an array, a dict, a tensor or
            a tuple of them).
        bandwidth: float > 0. Gaussian kernel width. Defaults to `1.0`
            (the paper's standard kernel).
        max_batches: optional int >= 1, stop after this many batches.

    Returns:
        dict: `{"per_head": {layer_label: array (N,)}, "total": float}`
        (label: the layer name, `name_<i>` for the i-th of the attention
        layers that share that name, as in keras-hub backbones);
        `per_head` is averaged over the examples that have a real token
        (NaN for a layer with no such example: never called, or called
        only on padding), `total` sums it over heads and the measured
        layers (the paper's figure; NaN when no layer was measured).

    Raises:
        ValueError: for a `model` that is not a Keras model or layer, or
            has no attention layers, a `dataset` that is not an iterable of
            batches or yields none (rather than a total of 0, which reads
            as aligned).
    """
    # Checked before the loop: `max_batches=0` (or a negative count)
    # returned a total of 0, which reads as perfect alignment, and an
    # invalid `bandwidth` went unnoticed when no batch was run.
    bandwidth = check_float("bandwidth", bandwidth)
    _check_model(model)
    if (
        _batch_data(dataset)
        or isinstance(dataset, (str, bytes))
        or not isinstance(dataset, Iterable)
    ):
        # Iterated, a dict gave its keys and an array its rows as batches;
        # None or a number raised TypeError ("not iterable").
        received = (
            f"dataset of type {type(dataset).__name__}"
            if _batch_data(dataset)
            else f"dataset={dataset!r}"
        )
        raise ValueError(
            "`dataset` must be an iterable of batches (e.g. a list of "
            "input dicts or a `tf.data.Dataset`); for one batch of inputs "
            f"pass `[inputs]`. Received: {received}"
        )
    if isinstance(dataset, tuple) and any(map(_batch_data, dataset)):
        # One `(inputs, labels)` batch was iterated as two batches: the
        # labels went through the model and into the total.
        raise ValueError(
            "`dataset` must be an iterable of batches; a tuple of arrays "
            "reads as one `(inputs, labels)` batch: pass `[(inputs, "
            "labels)]` for it, or a list of batches. Received: a tuple of "
            f"{len(dataset)} {', '.join(type(i).__name__ for i in dataset)}"
        )
    if max_batches is not None:
        max_batches = check_int("max_batches", max_batches)
    targets = attention_layers(model)
    if not targets:
        # A total of 0 would read as keys and queries perfectly aligned.
        raise ValueError(
            "`model` must contain `keras.layers.MultiHeadAttention` layers "
            f"(or subclasses). Received: model={model.name!r} with none"
        )
    # keras-hub names every block's attention "self_attention_layer":
    # key the results by a unique label so that layers are not merged.
    labels = layer_labels(targets)
    self_attention = _self_attention_ids(model)
    sums = {label: 0.0 for label in labels.values()}
    counts = {label: 0.0 for label in labels.values()}
    batches = 0
    for batch in itertools.islice(dataset, max_batches):  # None: all
        batches += 1
        inputs = batch[0] if isinstance(batch, tuple) else batch
        with record_attention(targets) as calls:
            model(inputs, training=False)
        for call in calls:
            name = labels[id(call.layer)]
            if len(call.query.shape) != 4:
                # `attention_axes` over several axes (an image's rows and
                # columns): the backend's transpose failed on rank 5.
                raise ValueError(
                    "`model`'s attention layers must attend over one axis, "
                    "with projected queries (batch, length, heads, "
                    f"head_size). Received: layer {name!r} with "
                    f"attention_axes={call.layer._attention_axes} and "
                    f"projected queries of shape {tuple(call.query.shape)}"
                )
            value, present = _per_head_mmd(
                call.query,
                call.key,
                call.attention_mask,
                bandwidth,
                id(call.layer) in self_attention,
            )
            sums[name] = sums[name] + value
            counts[name] += present
    if not batches:
        raise ValueError(
            "`dataset` must yield at least one batch of model inputs. "
            f"Received: dataset={dataset!r}, which yielded none"
        )
    # A layer with no measured example (never called, or only on padding)
    # gets NaN heads, not 0 (which reads as aligned), and stays out of the
    # total; the total is NaN when no layer was measured.
    heads = {labels[id(layer)]: layer.num_heads for layer in targets}
    per_head = {
        name: (
            np.asarray(sums[name]) / counts[name]
            if counts[name]
            else np.full(heads[name], np.nan)
        )
        for name in sums
    }
    measured = [v for name, v in per_head.items() if counts[name]]
    total = float(sum(np.sum(v) for v in measured)) if measured else np.nan
    return {"per_head": per_head, "total": total}


def _per_head_mmd(query, key, mask, bandwidth, self_attention=False):
    """Sum over examples of the per-head MMD `(N,)`, and the example count.

    In self-attention (`T == S`), a query is real only if its own position
    is a real key, as in training: keras-hub encoders mask only padded keys
    and causal decoders let padded queries attend the real keys before them.
    """
    # clouds: (B, N, T, H) and (B, N, S, H)
    q = ops.transpose(ops.cast(query, "float32"), (0, 2, 1, 3))
    k = ops.transpose(ops.cast(key, "float32"), (0, 2, 1, 3))
    batch, _, q_len = ops.shape(q)[:3]
    k_len = ops.shape(k)[2]
    if mask is None:
        q_valid = ops.ones((batch, q_len), "bool")
        k_valid = ops.ones((batch, k_len), "bool")
    else:
        mask = ops.cast(mask, "bool")
        # Keras MHA masks may carry a head axis: (B, N, T, S).
        if len(mask.shape) == 4:
            mask = ops.any(mask, axis=1)
        mask = ops.broadcast_to(mask, (batch, q_len, k_len))
        q_valid, k_valid = padding_masks(mask, self_attention)
    mmd = gaussian_mmd(
        q, k, q_valid[:, None, :], k_valid[:, None, :], bandwidth
    )
    present = ops.logical_and(ops.any(q_valid, -1), ops.any(k_valid, -1))
    mmd = ops.convert_to_numpy(mmd)
    present = ops.convert_to_numpy(present)
    return mmd[present].sum(axis=0), float(present.sum())
