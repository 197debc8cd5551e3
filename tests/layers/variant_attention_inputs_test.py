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
