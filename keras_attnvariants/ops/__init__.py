"""Pure functions on `keras.ops`: no layers, no variables.

Random ops take a `seed` (None draws from Keras's global generator).
"""

from keras_attnvariants.ops.gradient_reversal import (
    gradient_reversal as gradient_reversal,
)
from keras_attnvariants.ops.gumbel import gather_values as gather_values
from keras_attnvariants.ops.gumbel import (
    gumbel_from_uniform as gumbel_from_uniform,
)
from keras_attnvariants.ops.gumbel import gumbel_noise as gumbel_noise
from keras_attnvariants.ops.gumbel import one_hot_argmax as one_hot_argmax
from keras_attnvariants.ops.gumbel import (
    positional_uniform as positional_uniform,
)
from keras_attnvariants.ops.gumbel import relaxed_sample as relaxed_sample
from keras_attnvariants.ops.gumbel import scatter_values as scatter_values
from keras_attnvariants.ops.gumbel import straight_through as straight_through
from keras_attnvariants.ops.masking import causal_mask as causal_mask
from keras_attnvariants.ops.masking import merge_masks as merge_masks
from keras_attnvariants.ops.noise import (
    positional_dropout as positional_dropout,
)
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
from keras_attnvariants.ops.patterns import guidance_pattern as guidance_pattern
from keras_attnvariants.ops.receptive_field import (
    hard_receptive_fields as hard_receptive_fields,
)
from keras_attnvariants.ops.receptive_field import (
    precision_recall as precision_recall,
)
from keras_attnvariants.ops.receptive_field import (
    receptive_field_mean_size as receptive_field_mean_size,
)
from keras_attnvariants.ops.receptive_field import (
    receptive_field_union_size as receptive_field_union_size,
)
from keras_attnvariants.ops.receptive_field import (
    receptive_fields as receptive_fields,
)
from keras_attnvariants.ops.transport import (
    conditional_transport_cost as conditional_transport_cost,
)
from keras_attnvariants.ops.transport import (
    conditional_transport_plans as conditional_transport_plans,
)
from keras_attnvariants.ops.transport import cosine_cost as cosine_cost
from keras_attnvariants.ops.transport import gaussian_mmd as gaussian_mmd
from keras_attnvariants.ops.transport import sinkhorn_cost as sinkhorn_cost
from keras_attnvariants.ops.transport import sinkhorn_plan as sinkhorn_plan
from keras_attnvariants.ops.transport import (
    squared_euclidean_cost as squared_euclidean_cost,
)
from keras_attnvariants.ops.transport import (
    uniform_marginal as uniform_marginal,
)
