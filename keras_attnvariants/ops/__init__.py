"""Pure functions on `keras.ops`: no layers, no variables, no hidden RNG."""

from keras_attnvariants.ops.masking import causal_mask as causal_mask
from keras_attnvariants.ops.masking import merge_masks as merge_masks
from keras_attnvariants.ops.normalization import (
    doubly_normalize as doubly_normalize,
)
from keras_attnvariants.ops.normalization import (
    doubly_normalized_bias as doubly_normalized_bias,
)
from keras_attnvariants.ops.normalization import (
    hybrid_normalize as hybrid_normalize,
)
from keras_attnvariants.ops.normalization import (
    masked_softmax as masked_softmax,
)
