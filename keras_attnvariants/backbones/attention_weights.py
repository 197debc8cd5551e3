"""Reading the attention weights of a (converted) keras-hub backbone."""

import numpy as np
from keras import ops

from keras_attnvariants.backbones.conversion import self_attention_layers
from keras_attnvariants.layers.recording import record_attention


def attention_weights(backbone, inputs, training=False):
    """Attention weights of every self-attention call, per layer and head.

    Runs one eager forward pass of `backbone` while each self-attention
    layer records the weights it uses (before dropout; for this package's
    variants, the normalized DNAS / HNAS weights). Works for converted and
    original backbones alike. A layer shared across depths (ALBERT) is
    recorded at each call, so the list has one entry per depth.

    Args:
        backbone: a keras-hub backbone built from `TransformerEncoder` or
            `TransformerDecoder` blocks.
        inputs: the backbone's input dict (`token_ids`, `padding_mask`,
            ...), NumPy arrays or tensors.
        training: bool. Passed to the forward pass. Defaults to `False`.

    Returns:
        A list, one item per layer in call order, of float32 NumPy arrays
        of shape `(B, N, T, S)`. Columns of padded keys are zero. Rows of
        padded queries are what the layer computed: keras-hub masks keys
        only, so with standard attention they are a softmax over the valid
        keys (zero for DNAS / HNAS, which mask padded queries); leave them
        out with the `padding_mask` when aggregating.

    Raises:
        ValueError: if `backbone` is not a Keras layer (e.g. None), holds
            no such block, or a block that keeps its self-attention
            elsewhere (Moonshine's).

    Example:

    >>> weights = attention_weights(backbone, inputs)  # doctest: +SKIP
    >>> weights[0].shape  # (batch, heads, queries, keys)  # doctest: +SKIP
    """
    layers = self_attention_layers(backbone)
    with record_attention(layers, with_weights=True) as calls:
        backbone(inputs, training=training)
    return [
        ops.convert_to_numpy(ops.cast(call.weights, "float32"))
        for call in calls
    ]


def hybrid_weights(backbone):
    """The HNAS mixing weights `u` of each layer, `(num_layers, N)`.

    Args:
        backbone: a backbone converted to `HybridAttention`.

    Returns:
        float32 NumPy array, one row per distinct attention layer.

    Raises:
        ValueError: if `backbone` is not a keras-hub backbone (e.g. None)
            or holds no `HybridAttention` layer.
    """
    rows = [
        np.asarray(layer.hybrid_weights, "float32")
        for layer in self_attention_layers(backbone)
        if hasattr(layer, "hybrid_weights")
    ]
    if not rows:
        names = sorted(
            {type(x).__name__ for x in self_attention_layers(backbone)}
        )
        raise ValueError(
            "`backbone` holds no HybridAttention layer. Received: backbone "
            f"with attention classes {names}"
        )
    return np.stack(rows)
