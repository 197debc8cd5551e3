"""keras_attnvariants: attention variants from recent research for Keras 3."""

from keras_attnvariants import layers as layers
from keras_attnvariants import losses as losses
from keras_attnvariants import ops as ops
from keras_attnvariants.layers import (
    DoublyNormalizedAttention as DoublyNormalizedAttention,
)
from keras_attnvariants.layers import HybridAttention as HybridAttention
from keras_attnvariants.layers import VariantAttention as VariantAttention
from keras_attnvariants.losses import AttentionLoss as AttentionLoss
from keras_attnvariants.version import __version__ as __version__
