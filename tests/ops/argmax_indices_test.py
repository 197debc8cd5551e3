"""`ops.gumbel.argmax_indices`: the first maximal key of every row."""

import keras
import numpy as np
from keras import ops

from keras_attnvariants.ops.gumbel import argmax_indices
from keras_attnvariants.ops.masking import MASK_FILL
from keras_attnvariants.testing.test_case import TestCase


def _np(x):
    return np.asarray(ops.convert_to_numpy(x))


class ArgmaxIndicesTest(TestCase):
    def test_equals_numpy_argmax_with_many_ties(self):
        rng = np.random.default_rng(0)
        # Small integers: most rows have tied maxima; NumPy picks the first.
        logits = rng.integers(-3, 4, size=(3, 2, 7, 33)).astype("float32")
        got = _np(argmax_indices(logits))
        self.assertEqual(got.dtype, np.int32)
        self.assertAllEqual(got, logits.argmax(-1))
        continuous = rng.normal(size=(2, 3, 5, 130)).astype("float32")
        self.assertAllEqual(
            _np(argmax_indices(continuous)), continuous.argmax(-1)
        )

    def test_masked_and_infinite_rows(self):
        logits = np.array(
            [
                [MASK_FILL, MASK_FILL, 1.0, MASK_FILL],  # one valid key
                [MASK_FILL] * 4,  # no valid key: the first
                [-np.inf] * 4,
                [-np.inf, np.inf, 2.0, np.inf],  # first of the +inf
                [-1e30, -2e30, -1e30, -3e30],  # ties far below 0
            ],
            "float32",
        )
        self.assertAllEqual(_np(argmax_indices(logits)), [2, 0, 0, 1, 0])

    def test_nan_row_gives_an_index_in_range(self):
        logits = np.array([[0.0, np.nan, 1.0], [np.nan] * 3], "float32")
        got = _np(argmax_indices(logits))
        self.assertTrue(((got >= 0) & (got < 3)).all(), got)

    def test_unknown_key_length_when_traced(self):
        if keras.backend.backend() != "tensorflow":
            self.skipTest("tf.function with an unknown dimension")
        import tensorflow as tf

        fn = tf.function(
            argmax_indices,
            input_signature=[tf.TensorSpec((None, None), "float32")],
            jit_compile=True,
        )
        logits = np.random.default_rng(1).normal(size=(4, 9))
        logits = logits.astype("float32")
        self.assertAllEqual(fn(logits).numpy(), logits.argmax(-1))
