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
