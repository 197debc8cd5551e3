import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.analysis import interpretability as interp
from keras_attnvariants.losses.kq_diagnostics import key_query_mmd
from keras_attnvariants.testing.test_case import TestCase


def _attention_model():
    inputs = keras.Input((5, 8))
    out = keras.layers.MultiHeadAttention(2, 4, name="att")(inputs, inputs)
    return keras.Model(inputs, out)


class KeyQueryMMDArgumentsTest(TestCase):
    @parameterized.named_parameters(
        # `max_batches=0` or a negative count returned a total of 0.0 (as
        # if keys and queries were perfectly aligned).
        ("zero", {"max_batches": 0}, "max_batches"),
        ("negative", {"max_batches": -1}, "max_batches"),
        ("float", {"max_batches": 1.5}, "max_batches"),
        ("bool", {"max_batches": True}, "max_batches"),
        # Invalid bandwidths went unnoticed when no batch was run.
        ("bandwidth", {"bandwidth": -1.0, "max_batches": 0}, "bandwidth"),
    )
    def test_invalid_arguments(self, kwargs, name):
        x = np.ones((2, 5, 8), "float32")
        with self.assertRaisesRegex(
            ValueError, rf"`{name}` must be .*Received: {name}="
        ):
            key_query_mmd(_attention_model(), [x, x], **kwargs)

    def test_no_attention_layer_or_no_batch_is_an_error_not_zero(self):
        # Both returned a total of 0.0, which reads as perfect alignment.
        inputs = keras.Input((5, 8))
        dense = keras.Model(inputs, keras.layers.Dense(4)(inputs))
        x = np.ones((2, 5, 8), "float32")
        with self.assertRaisesRegex(ValueError, "`model` must contain"):
            key_query_mmd(dense, [x])
        with self.assertRaisesRegex(ValueError, "`dataset` must yield"):
            key_query_mmd(_attention_model(), [])
        with self.assertRaisesRegex(ValueError, "`dataset` must yield"):
            key_query_mmd(_attention_model(), iter([]))

    def test_a_layer_never_measured_is_nan_and_out_of_the_total(self):
        # A layer that never ran (or ran only on padding) reported MMD 0
        # (scalar, not per head), which reads as aligned.
        class OneUsed(keras.Model):
            def __init__(self):
                super().__init__()
                self.used = keras.layers.MultiHeadAttention(2, 4, name="used")
                self.idle = keras.layers.MultiHeadAttention(3, 4, name="idle")

            def call(self, x):
                return self.used(x, x)

        rng = np.random.default_rng(0)
        x = rng.normal(size=(2, 5, 8)).astype("float32")
        model = OneUsed()
        model(x)
        got = key_query_mmd(model, [x])
        self.assertEqual(got["per_head"]["idle"].shape, (3,))
        self.assertTrue(np.isnan(got["per_head"]["idle"]).all())
        used = got["per_head"]["used"]
        self.assertEqual(used.shape, (2,))
        self.assertTrue(np.isfinite(used).all())
        self.assertGreater(float(np.sum(used)), 0.0)
        self.assertAllClose(got["total"], float(np.sum(used)))
        # Only padding everywhere: nothing measured, total NaN.
        padding = np.zeros((2, 5), bool)
        inputs = keras.Input((5, 8))
        mask = keras.Input((5,), dtype="bool")
        attention = keras.layers.MultiHeadAttention(2, 4)
        out = attention(inputs, inputs, attention_mask=mask[:, None, :])
        masked = keras.Model([inputs, mask], out)
        got = key_query_mmd(masked, [[x, padding]])
        self.assertTrue(np.isnan(got["total"]))

    def test_bandwidth_checked_on_an_empty_dataset(self):
        with self.assertRaisesRegex(ValueError, "bandwidth"):
            key_query_mmd(_attention_model(), [], bandwidth=0.0)

    def test_max_batches_counts_batches(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(2, 5, 8)).astype("float32")
        model = _attention_model()
        first = key_query_mmd(model, [x], max_batches=np.int64(1))["total"]
        both = key_query_mmd(model, [x, 3.0 * x], max_batches=1)["total"]
        self.assertGreater(first, 0.0)
        self.assertAllClose(both, first)


class GradientImportanceTest(TestCase):
    def test_logits_independent_of_embeddings_give_zero_norms(self):
        # JAX returned zeros; TensorFlow failed with `'NoneType' object has
        # no attribute 'numpy'` and PyTorch with "element 0 of tensors does
        # not require grad".
        h0 = np.ones((2, 3, 4), "float32")
        logits = np.arange(6.0, dtype="float32").reshape(2, 3)
        for predict in (
            lambda h: ops.convert_to_tensor(logits),
            lambda h: ops.stop_gradient(ops.sum(h, axis=1)[:, :3]),
        ):
            got = interp.gradient_importance(predict, h0)
            self.assertEqual(got.dtype, np.float32)
            self.assertAllEqual(got, np.zeros((2, 3), "float32"))

    def test_partly_connected_logits_keep_their_gradients(self):
        # Only token 0 reaches the logits: the others get 0, token 0 the
        # norm of the top class's weight row.
        w = np.arange(1.0, 13.0, dtype="float32").reshape(4, 3)
        h0 = np.ones((2, 3, 4), "float32")
        got = interp.gradient_importance(lambda h: ops.matmul(h[:, 0], w), h0)
        want = np.zeros((2, 3), "float32")
        want[:, 0] = np.linalg.norm(w[:, 2])
        self.assertAllClose(got, want, rtol=1e-6)
