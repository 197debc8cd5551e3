"""The attention-loss mechanism's helpers, pinned after a mutation review
(2026-12-02) of `losses/attention_loss.py`: `batch_mean` of integers,
nested `token_ids_scope`, `padding_masks` for self- and cross-attention,
`build_context`'s broadcast mask and token ids, float32 term values.
"""

import keras
import numpy as np
from keras import ops

from keras_attnvariants.losses.attention_loss import AttentionLoss
from keras_attnvariants.losses.attention_loss import batch_mean
from keras_attnvariants.losses.attention_loss import build_context
from keras_attnvariants.losses.attention_loss import current_token_ids
from keras_attnvariants.losses.attention_loss import padding_masks
from keras_attnvariants.losses.attention_loss import token_ids_scope
from keras_attnvariants.testing.test_case import TestCase


class AttentionLossMechanismTest(TestCase):
    def test_batch_mean_of_ints_is_a_float_mean(self):
        got = batch_mean(np.array([[1, 2], [3, 5]], "int32"))
        self.assertTrue(keras.backend.is_float_dtype(got.dtype))
        self.assertAllClose(got, [2.0, 3.5])

    def test_token_ids_scope_restores_the_outer_ids(self):
        outer, inner = np.zeros((1, 2), "int32"), np.ones((1, 2), "int32")
        with token_ids_scope(outer):
            with token_ids_scope(inner):
                self.assertIs(current_token_ids(), inner)
            self.assertIs(current_token_ids(), outer)
        self.assertIsNone(current_token_ids())

    def test_padding_masks_self_attention_drops_padded_queries(self):
        # Causal decoder, right padding: query 2 still attends keys 0, 1.
        real = np.array([True, True, False, False])
        mask = (np.tril(np.ones((4, 4), bool)) & real[None, :])[None]
        query_mask, key_mask = padding_masks(ops.convert_to_tensor(mask), True)
        self.assertAllEqual(query_mask, real[None])
        self.assertAllEqual(key_mask, real[None])
        query_mask, key_mask = padding_masks(ops.convert_to_tensor(mask))
        self.assertAllEqual(query_mask, np.ones((1, 4), bool))
        self.assertAllEqual(key_mask, real[None])

    def test_padding_masks_cross_attention(self):
        mask = np.array([[[1, 1, 0], [0, 0, 0]]], bool)
        query_mask, key_mask = padding_masks(ops.convert_to_tensor(mask), True)
        self.assertAllEqual(query_mask, [[True, False]])
        self.assertAllEqual(key_mask, [[True, True, False]])

    def test_build_context_broadcasts_the_mask_and_reads_token_ids(self):
        query = np.zeros((2, 3, 2, 4), "float32")
        key = np.zeros((2, 5, 2, 4), "float32")
        keys = np.array([[[1, 1, 1, 0, 0]]], bool)  # (1, 1, S)
        ids = np.arange(6).reshape(2, 3)
        with token_ids_scope(ids):
            context = build_context(None, None, query, key, keys)
        self.assertEqual(tuple(context["attention_mask"].shape), (2, 3, 5))
        self.assertAllEqual(context["key_mask"], np.repeat(keys[0], 2, 0))
        self.assertIs(context["token_ids"], ids)
        self.assertIsNone(
            build_context(None, None, query, key, None)["query_mask"]
        )

    def test_term_value_is_float32_whatever_it_computes(self):
        class HalfTerm(AttentionLoss):
            needs_attention_weights = False

            def compute_loss_value(self, query):
                return ops.cast(ops.mean(query), "float16")

        value = HalfTerm()(np.ones((2, 3), "float32"))
        self.assertEqual(
            keras.backend.standardize_dtype(value.dtype), "float32"
        )
