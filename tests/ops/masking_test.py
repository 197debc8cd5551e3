import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

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
