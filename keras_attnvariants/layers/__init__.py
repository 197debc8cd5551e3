"""Attention layers: subclasses of `keras.layers.MultiHeadAttention`."""

from keras_attnvariants.layers.doubly_normalized_attention import (
    DoublyNormalizedAttention as DoublyNormalizedAttention,
)
from keras_attnvariants.layers.gumbel_discrete_attention import (
    GumbelDiscreteAttention as GumbelDiscreteAttention,
)
from keras_attnvariants.layers.hybrid_attention import (
    HybridAttention as HybridAttention,
)
from keras_attnvariants.layers.recording import AttentionCall as AttentionCall
from keras_attnvariants.layers.recording import (
    record_attention as record_attention,
)
from keras_attnvariants.layers.two_stream_block import (
    TwoStreamBlock as TwoStreamBlock,
)
from keras_attnvariants.layers.two_stream_encoder import (
    TwoStreamEncoder as TwoStreamEncoder,
)
from keras_attnvariants.layers.variant_attention import (
    VariantAttention as VariantAttention,
)
