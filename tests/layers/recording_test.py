import keras
import numpy as np

from keras_attnvariants.layers.recording import record_attention
from keras_attnvariants.testing.test_case import TestCase


def mha():
    return keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)


X = np.ones((1, 3, 8), "float32")


class RecordAttentionTest(TestCase):
    def test_nested_recorders_both_record_and_restore(self):
        layer = mha()
        with record_attention([layer]) as outer:
            with record_attention([layer], with_weights=True) as inner:
                layer(X, X)
            layer(X, X)
            self.assertIn("_compute_attention", vars(layer))
        self.assertLen(inner, 1)
        self.assertEqual(tuple(inner[0].weights.shape), (1, 2, 3, 3))
        self.assertLen(outer, 2)
        self.assertNotIn("_compute_attention", vars(layer))

    def test_restores_a_previous_instance_attribute(self):
        layer = mha()
        layer(X, X)
        own = layer._compute_attention  # the bound class method
        layer._compute_attention = own
        with self.assertRaisesRegex(RuntimeError, "stop"):
            with record_attention([layer]) as calls:
                layer(X, X)
                raise RuntimeError("stop")
        self.assertLen(calls, 1)
        self.assertIs(vars(layer)["_compute_attention"], own)

    def test_single_layer_is_rejected(self):
        with self.assertRaisesRegex(ValueError, "`layers`.*iterable"):
            with record_attention(mha()):
                pass

    def test_with_weights_must_be_a_bool(self):
        # `"false"` recorded the weights (a truthy string).
        layer = mha()
        with self.assertRaisesRegex(
            ValueError,
            r"`with_weights` must be a bool\. Received: with_weights='false'",
        ):
            with record_attention([layer], with_weights="false"):
                pass
        self.assertNotIn("_compute_attention", vars(layer))
