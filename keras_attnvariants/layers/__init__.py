"""Attention layers: subclasses of `keras.layers.MultiHeadAttention`."""

from keras_attnvariants.layers.doubly_normalized_attention import (
    DoublyNormalizedAttention as DoublyNormalizedAttention,
)
from keras_attnvariants.layers.hybrid_attention import (
    HybridAttention as HybridAttention,
)
from keras_attnvariants.layers.variant_attention import (
    VariantAttention as VariantAttention,
)
