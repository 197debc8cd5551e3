"""keras_attnvariants: attention variants from recent research for Keras 3."""

# First: it quiets TensorFlow before it starts, in `python -m` runs.
from keras_attnvariants import _startup as _startup  # noqa: I001
from keras_attnvariants import analysis as analysis
from keras_attnvariants import backbones as backbones
from keras_attnvariants import callbacks as callbacks
from keras_attnvariants import datasets as datasets
from keras_attnvariants import distribute as distribute
from keras_attnvariants import evaluation as evaluation
from keras_attnvariants import layers as layers
from keras_attnvariants import losses as losses
from keras_attnvariants import ops as ops
from keras_attnvariants.backbones import convert_backbone as convert_backbone
from keras_attnvariants.callbacks import (
    TemperatureSchedule as TemperatureSchedule,
)
from keras_attnvariants.layers import (
    DoublyNormalizedAttention as DoublyNormalizedAttention,
)
from keras_attnvariants.layers import (
    GumbelDiscreteAttention as GumbelDiscreteAttention,
)
from keras_attnvariants.layers import HybridAttention as HybridAttention
from keras_attnvariants.layers import TwoStreamBlock as TwoStreamBlock
from keras_attnvariants.layers import TwoStreamEncoder as TwoStreamEncoder
from keras_attnvariants.layers import VariantAttention as VariantAttention
from keras_attnvariants.losses import (
    AttentionGuidanceRegularizer as AttentionGuidanceRegularizer,
)
from keras_attnvariants.losses import AttentionLoss as AttentionLoss
from keras_attnvariants.losses import KQAlignment as KQAlignment
from keras_attnvariants.version import __version__ as __version__
