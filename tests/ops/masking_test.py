import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.ops import masking
from keras_attnvariants.ops import noise
from keras_attnvariants.ops.masking import causal_mask
from keras_attnvariants.ops.masking import merge_masks
from keras_attnvariants.testing.test_case import TestCase


class MaskingTest(TestCase):
    @parameterized.parameters((3, 3), (2, 4), (4, 2))
    def test_causal_mask_matches_keras_mha(self, query_length, key_length):
        layer = keras.layers.MultiHeadAttention(num_heads=1, key_dim=2)
        query = np.zeros((1, query_length, 2), "float32")
        value = np.zeros((1, key_length, 2), "float32")
        want = ops.convert_to_numpy(layer._compute_causal_mask(query, value))
        got = ops.convert_to_numpy(causal_mask(query_length, key_length))
        self.assertAllEqual(got, want[0])

    def test_merge_masks_broadcasts_key_and_query_masks(self):
        key_mask = np.array([[[1, 1, 0]]], "int32")  # (B, 1, S)
        query_mask = np.array([[[True], [False]]])  # (B, T, 1)
        got = ops.convert_to_numpy(merge_masks(None, key_mask, query_mask))
        want = np.array([[[True, True, False], [False, False, False]]])
        self.assertAllEqual(got, want)
        self.assertIsNone(merge_masks(None, None))


class MaskingContractsTest(TestCase):
    # Contracts a mutation sweep found untested.
    def test_merge_masks_refuses_leading_axes_that_do_not_broadcast(self):
        with self.assertRaisesRegex(ValueError, "broadcast together"):
            masking.merge_masks(np.ones((2, 1, 4), bool), np.ones((3, 1, 4)))

    def test_merge_masks_returns_booleans_for_one_integer_mask(self):
        got = masking.merge_masks(None, np.array([[1, 0]], "int32"))
        self.assertEqual(keras.backend.standardize_dtype(got.dtype), "bool")
        self.assertAllEqual(got, [[True, False]])

    def test_valid_queries_and_keys(self):
        mask = np.array([[True, False], [True, False], [False, False]])
        queries = masking.valid_queries(mask)
        keys = masking.valid_keys(mask)
        self.assertEqual(tuple(queries.shape), (3, 1))
        self.assertAllEqual(queries, [[True], [True], [False]])
        self.assertEqual(tuple(keys.shape), (1, 2))
        self.assertAllEqual(keys, [[True, False]])

    def test_causal_mask_refuses_a_float_tensor_length(self):
        with self.assertRaisesRegex(ValueError, "`query_length` must be"):
            masking.causal_mask(ops.convert_to_tensor(3.0), 3)

    def test_dropout_multipliers_are_float32_at_rate_zero(self):
        got = noise.dropout_multipliers((2, 2), 0.0, None)
        self.assertEqual(keras.backend.standardize_dtype(got.dtype), "float32")
        self.assertAllClose(got, np.ones((2, 2)))
