import numpy as np
from absl.testing import parameterized

from keras_attnvariants.losses.attention_guidance import (
    AttentionGuidanceRegularizer,
)
from keras_attnvariants.losses.attention_guidance import guidance_alpha
from keras_attnvariants.losses.attention_guidance import guidance_attention_bias
from keras_attnvariants.testing.test_case import TestCase


class GuidanceReviewTest(TestCase):
    @parameterized.parameters("sum", "mean")
    def test_one_padding_mask_for_the_batch_equals_a_repeated_one(
        self, reduction
    ):
        # A (1, T) mask is accepted for (B, N, T, T) weights; "mean"
        # divided the squared errors of all B examples by one example's
        # valid pairs (B times the value of the repeated (B, T) mask).
        rng = np.random.default_rng(0)
        weights = rng.random((3, 2, 4, 4)).astype("float32")
        weights /= weights.sum(-1, keepdims=True)
        mask = np.array([[True, True, True, False]])
        term = AttentionGuidanceRegularizer(
            {0: "next", 1: "first"},
            alpha=1.0,
            reduction=reduction,
            track_metric=False,
        )
        self.assertAllClose(
            term(weights, padding_mask=mask),
            term(weights, padding_mask=np.repeat(mask, 3, axis=0)),
        )

    @parameterized.parameters(
        ({"decay_steps": 0}, "decay_steps=0"),
        ({"decay_steps": -5}, "decay_steps=-5"),
        ({"decay_steps": 2.5}, "decay_steps=2.5"),
        ({"warm_steps": -3}, "warm_steps=-3"),
        ({"alpha": float("nan")}, "alpha=nan"),
    )
    def test_guidance_alpha_rejects_bad_schedules(self, kwargs, message):
        # decay_steps=0 gave NaN at t = warm_steps, -5 a constant alpha,
        # warm_steps=-3 a decay started three steps early.
        kwargs = {"alpha": 1.0, **kwargs}
        with self.assertRaisesRegex(ValueError, message):
            guidance_alpha(0, **kwargs)

    def test_head_named_twice_is_refused(self):
        # 0 and "0" (a config's key) were merged: "next" was dropped.
        with self.assertRaisesRegex(
            ValueError,
            r"name each head once.*\{0: 'next', '0': 'prev'\}.*head 0 twice",
        ):
            AttentionGuidanceRegularizer({0: "next", "0": "prev"}, alpha=1.0)

    @parameterized.parameters("sum", "mean")
    def test_empty_sequence_gives_zero(self, reduction):
        # The valid-token mask sliced `weights[:, 0, 0, :]`, which failed
        # for T = 0 (an empty batch gave 0, as KQAlignment does for both).
        term = AttentionGuidanceRegularizer(
            {0: "next"}, alpha=1.0, reduction=reduction, track_metric=False
        )
        for shape in ((1, 2, 0, 0), (0, 2, 3, 3)):
            self.assertAllClose(term(np.zeros(shape, "float32")), 0.0)

    def test_bias_message_offers_only_its_own_form(self):
        # It listed "a list of such dicts (one per layer)", then refused one.
        with self.assertRaisesRegex(ValueError, r"pattern_name\}\. Received"):
            guidance_attention_bias([{0: "next"}], 2, np.ones((1, 3), bool))

    def test_guidance_alpha_numpy_scalars(self):
        self.assertAllClose(
            guidance_alpha(
                2, np.float32(2.0), np.int64(4), warm_steps=np.int64(1)
            ),
            1.5,
        )


class MaskedInputTest(TestCase):
    def test_a_term_called_on_masked_scores_does_not_warn(self):
        # keras MHA's scores carry a Keras mask inside a traced `fit` step;
        # Keras warned on every trace that the term "does not support
        # masking and will therefore destroy the mask information".
        import warnings

        import keras
        from keras.src.backend.common.masking import set_keras_mask

        from keras_attnvariants.losses.attention_guidance import (
            default_head_patterns,
        )

        term = AttentionGuidanceRegularizer(default_head_patterns(2), alpha=1.0)
        weights = keras.ops.softmax(
            keras.ops.convert_to_tensor(
                np.random.default_rng(0).normal(size=(1, 2, 3, 3)), "float32"
            )
        )
        set_keras_mask(weights, keras.ops.ones((1, 2, 3), "bool"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            value = term(weights)
        self.assertTrue(np.isfinite(keras.ops.convert_to_numpy(value)))
        self.assertIsNone(getattr(value, "_keras_mask", None))


class KQProjectionsTest(TestCase):
    def test_unbuilt_cross_attention_with_a_wider_value(self):
        # The unbuilt MHA was built with the key's shape as the value's, so
        # calling it on a value of another width failed.
        import keras

        from keras_attnvariants.losses.kq_alignment import kq_projections

        mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
        rng = np.random.default_rng(0)
        query = rng.normal(size=(2, 4, 5)).astype("float32")
        key = rng.normal(size=(2, 6, 7)).astype("float32")
        value = rng.normal(size=(2, 6, 9)).astype("float32")
        q, k = kq_projections(mha, query, key, value)
        self.assertEqual(tuple(q.shape), (2, 4, 2, 3))
        self.assertEqual(tuple(k.shape), (2, 6, 2, 3))
        out = mha(query, value, key)
        self.assertEqual(tuple(out.shape), (2, 4, 5))
