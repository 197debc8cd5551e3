"""User-written attention loss terms for tests."""

import keras
from keras import ops

from keras_attnvariants.losses.attention_loss import AttentionLoss
from keras_attnvariants.losses.attention_loss import batch_mean


@keras.saving.register_keras_serializable(package="keras_attnvariants_testing")
class ProjectedQueryTerm(AttentionLoss):
    """A user term with a sublayer of its own, built at its first call: the
    mean square of a `Dense` projection of the queries."""

    needs_attention_weights = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.projection = keras.layers.Dense(1, name="projection")

    def compute_loss_value(self, query):
        squares = ops.square(self.projection(query))
        return batch_mean(ops.mean(squares, axis=(1, 2, 3)))

    def from_attention(self, context):
        return self(context["query"], training=True)
