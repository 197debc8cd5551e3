"""Input shapes every attention layer of this package checks or reports."""

import keras
import numpy as np
from absl.testing import parameterized

import keras_attnvariants as kav
from keras_attnvariants.testing.test_case import TestCase

LAYERS = {
    "dnas": lambda: kav.DoublyNormalizedAttention(2, 4),
    "hnas": lambda: kav.HybridAttention(2, 4, hybrid_init=0.3),
    "gumbel_argmax": lambda: kav.GumbelDiscreteAttention(2, 4, seed=1),
    "gumbel_soft": lambda: kav.GumbelDiscreteAttention(
        2, 4, seed=1, inference_mode="soft"
    ),
}
CASES = [{"testcase_name": name, "name": name} for name in LAYERS]


def zeros(*shape):
    return np.zeros(shape, "float32")


class VariantAttentionInputsTest(TestCase, parameterized.TestCase):
    @parameterized.named_parameters(CASES)
    def test_symbolic_scores_are_query_by_key(self, name):
        # keras MHA's own `compute_output_spec` reports (B, N, T, T).
        query, value = keras.Input((3, 8)), keras.Input((5, 8))
        layer = LAYERS[name]()
        output, scores = layer(query, value, return_attention_scores=True)
        self.assertEqual(tuple(output.shape), (None, 3, 8))
        self.assertEqual(tuple(scores.shape), (None, 2, 3, 5))
        eager = layer(
            zeros(2, 3, 8), zeros(2, 5, 8), return_attention_scores=True
        )
        self.assertEqual(tuple(eager[1].shape), (2, 2, 3, 5))

    @parameterized.named_parameters(CASES)
    def test_mismatched_inputs_raise(self, name):
        layer = LAYERS[name]()
        layer(zeros(2, 3, 8), zeros(2, 3, 8))
        for training in (False, True):
            # Argmax inference gathers value rows: a key shorter than the
            # value read wrong rows, a smaller value batch gave NaN (JAX).
            with self.assertRaisesRegex(ValueError, "same length"):
                layer(
                    zeros(2, 3, 8),
                    zeros(2, 6, 8),
                    key=zeros(2, 4, 8),
                    training=training,
                )
            with self.assertRaisesRegex(ValueError, "same batch size"):
                layer(zeros(2, 3, 8), zeros(1, 3, 8), training=training)
        with self.assertRaisesRegex(ValueError, "same batch size"):
            layer(
                keras.Input((3, 8), batch_size=2),
                keras.Input((3, 8), batch_size=1),
            )
        with self.assertRaisesRegex(ValueError, r"\(batch, length, dim\)"):
            layer(zeros(2, 3, 8), zeros(2, 3, 2, 4))


class MaskArgumentsTest(TestCase, parameterized.TestCase):
    @parameterized.named_parameters(CASES)
    def test_query_mask_keyword_keeps_real_tokens_padding_free(self, name):
        # keras MHA replaces `query_mask` by the Keras mask of `query`; a
        # mask passed by keyword was dropped, and DNAS's column step then
        # normalized over padded queries too.
        rng = np.random.default_rng(22)
        x = rng.normal(size=(2, 4, 8)).astype("float32")
        padded = np.concatenate([x, rng.normal(size=(2, 3, 8))], axis=1)
        padded = padded.astype("float32")
        valid = np.arange(7)[None] < np.array([[4], [4]])
        layer = LAYERS[name]()
        want = layer(x, x)
        got = layer(padded, padded, query_mask=valid, value_mask=valid)
        got = keras.ops.convert_to_numpy(got)[:, :4]
        self.assertAllClose(got, keras.ops.convert_to_numpy(want), atol=1e-5)

    def test_large_negative_is_finite_in_float16_on_every_backend(self):
        from keras_attnvariants.ops.masking import large_negative

        # The backend's own dtype object, whose str() is not "float16" on
        # TensorFlow or torch.
        dtype = keras.ops.zeros((1,), "float16").dtype
        fill = keras.ops.cast(large_negative(dtype), "float16")
        self.assertTrue(np.isfinite(keras.ops.convert_to_numpy(fill)))

    @parameterized.named_parameters(
        ("dnas", kav.DoublyNormalizedAttention, {}),
        ("hnas", kav.HybridAttention, {"hybrid_init": 0.3}),
    )
    def test_fused_path_float16_gradients_finite_with_padding(self, cls, kw):
        if keras.config.backend() != "tensorflow":
            # Torch CPU kernels lack float16 matmuls, JAX's CPU dot_general
            # float16 training; the fill itself is checked above.
            self.skipTest("float16 training runs on TensorFlow here.")
        rng = np.random.default_rng(23)
        x = rng.normal(size=(2, 5, 8)).astype("float32")
        valid = np.arange(5)[None] < np.array([[5], [3]])
        inputs = keras.Input((5, 8))
        mask = keras.Input((5,), dtype="bool")
        layer = cls(
            2,
            4,
            attention_path="fused",
            self_attention_padding=True,
            dtype="mixed_float16",
            **kw,
        )
        out = layer(inputs, inputs, attention_mask=mask[:, None, :])
        model = keras.Model([inputs, mask], out)
        model.compile(keras.optimizers.SGD(0.1), "mse")
        model.train_on_batch([x, valid], np.zeros_like(x))
        for weight in layer.trainable_weights:
            values = keras.ops.convert_to_numpy(weight)
            self.assertTrue(np.all(np.isfinite(values)), weight.path)
