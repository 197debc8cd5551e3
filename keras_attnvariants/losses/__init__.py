"""Loss terms computed from attention internals."""

from keras_attnvariants.losses.attention_guidance import (
    AttentionGuidanceRegularizer as AttentionGuidanceRegularizer,
)
from keras_attnvariants.losses.attention_guidance import (
    default_head_patterns as default_head_patterns,
)
from keras_attnvariants.losses.attention_guidance import (
    guidance_alpha as guidance_alpha,
)
from keras_attnvariants.losses.attention_guidance import (
    guidance_attention_bias as guidance_attention_bias,
)
from keras_attnvariants.losses.attention_loss import (
    AttentionContext as AttentionContext,
)
from keras_attnvariants.losses.attention_loss import (
    AttentionLoss as AttentionLoss,
)
from keras_attnvariants.losses.attention_loss import batch_mean as batch_mean
from keras_attnvariants.losses.attention_loss import (
    token_ids_scope as token_ids_scope,
)
from keras_attnvariants.losses.kq_alignment import KQAlignment as KQAlignment
from keras_attnvariants.losses.kq_alignment import (
    kq_projections as kq_projections,
)
from keras_attnvariants.losses.kq_diagnostics import (
    attention_layers as attention_layers,
)
from keras_attnvariants.losses.kq_diagnostics import (
    key_query_mmd as key_query_mmd,
)
