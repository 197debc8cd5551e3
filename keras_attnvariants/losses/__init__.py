"""Loss terms computed from attention internals."""

from keras_attnvariants.losses.attention_loss import (
    AttentionContext as AttentionContext,
)
from keras_attnvariants.losses.attention_loss import (
    AttentionLoss as AttentionLoss,
)
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
