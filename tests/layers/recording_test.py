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


class RecordingContractsTest(TestCase):
    # Contracts a mutation sweep found untested.
    def test_a_layer_listed_twice_is_wrapped_once(self):
        layer = mha()
        with record_attention([layer, layer]) as calls:
            layer(X, X)
        self.assertLen(calls, 1)
        self.assertNotIn("_compute_attention", vars(layer))

    def test_a_mask_and_the_causal_mask_are_recorded_together(self):
        from keras_attnvariants.layers.doubly_normalized_attention import (
            DoublyNormalizedAttention,
        )

        layer = DoublyNormalizedAttention(2, 4)
        x = np.random.default_rng(0).normal(size=(1, 3, 8)).astype("float32")
        layer(x, x)
        q = layer._query_dense(x)
        k = layer._key_dense(x)
        v = layer._value_dense(x)
        padding = np.array([[[True, True, False]] * 3])
        with record_attention([layer]) as calls:
            layer._compute_attention(q, k, v, padding, use_causal_mask=True)
        mask = keras.ops.convert_to_numpy(calls[0].attention_mask)
        want = padding & np.tril(np.ones((3, 3), bool))[None]
        self.assertAllEqual(np.broadcast_to(mask, (1, 3, 3)), want)
