import numpy as np
from absl.testing import parameterized
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_attnvariants import ops as kav_ops
from keras_attnvariants.datasets.toy import self_attention_steps
from keras_attnvariants.datasets.toy import two_gaussian_clusters
from keras_attnvariants.ops import normalization
from keras_attnvariants.testing import numpy_reference as ref
from keras_attnvariants.testing.test_case import TestCase


def random_padded_mask(rng, batch, t, s):
    """(B, T, S) mask with random query and key padding at the end."""
    q_len = rng.integers(1, t + 1, size=batch)
    k_len = rng.integers(1, s + 1, size=batch)
    q_valid = np.arange(t)[None, :] < q_len[:, None]
    k_valid = np.arange(s)[None, :] < k_len[:, None]
    return q_valid[:, :, None] & k_valid[:, None, :]


class NormalizationTest(TestCase):
    @parameterized.parameters(1, 2, 5)
    def test_doubly_normalize_matches_numpy(self, iterations):
        rng = np.random.default_rng(iterations)
        scores = rng.normal(size=(3, 2, 5, 7)).astype("float32") * 3
        mask = random_padded_mask(rng, 3, 5, 7)[:, None]
        got = kav_ops.doubly_normalize(scores, mask, iterations=iterations)
        want = ref.doubly_normalized_attention(scores, mask, iterations)
        self.assertAllClose(got, want, atol=1e-5)

    def test_integer_scores_give_float32_weights(self):
        # The float32 weights were cast back to the scores' int32: all 0.
        scores = np.array([[[0, 1, 2], [2, 1, 0]]], "int32")
        floats = scores.astype("float32")
        cases = [
            (kav_ops.masked_softmax, ref.softmax_attention, ()),
            (kav_ops.doubly_normalize, ref.doubly_normalized_attention, ()),
            (kav_ops.hybrid_normalize, ref.hybrid_attention, (0.5,)),
        ]
        for op, reference, args in cases:
            got = op(scores, *args)
            self.assertEqual(ops.dtype(got), "float32")
            self.assertAllClose(got, reference(floats, *args), atol=1e-6)
        self.assertEqual(
            ops.dtype(kav_ops.masked_softmax(scores > 0)), "float32"
        )

    def test_keys_far_below_the_rest_match_the_reference(self):
        # Key 2's logits sit ~1000 below the others: DNAS still gives it
        # its share (Theorem 2), and so must the reference (its one global
        # shift underflowed the column to 0).
        rng = np.random.default_rng(3)
        scores = rng.normal(size=(2, 4, 5)) * 2
        scores[..., 2] -= 1000.0
        mask = random_padded_mask(rng, 2, 4, 5)
        want = ref.doubly_normalized_attention(scores, mask, 2)
        got = kav_ops.doubly_normalize(scores.astype("float32"), mask, 2)
        self.assertAllClose(got, want, atol=1e-5)
        key_valid = mask[..., 2].any(-1)
        self.assertTrue(key_valid.any())
        self.assertTrue(np.all(want[..., 2].sum(-1)[key_valid] > 0.1))
        self.assertAllClose(
            ref.softmax_attention(scores, mask).sum(-1),
            mask.any(-1).astype(float),
        )

    def test_doubly_normalize_without_mask(self):
        scores = np.random.default_rng(0).normal(size=(2, 5, 7)) * 2
        got = kav_ops.doubly_normalize(scores.astype("float32"))
        self.assertAllClose(got, ref.doubly_normalized_attention(scores))

    def test_sinkhorn_iterations_approach_doubly_stochastic(self):
        scores = np.random.default_rng(1).normal(size=(6, 6)).astype("float32")
        weights = ops.convert_to_numpy(
            kav_ops.doubly_normalize(scores, iterations=200)
        )
        self.assertAllClose(weights.sum(-1), np.ones(6), atol=1e-5)
        self.assertAllClose(weights.sum(-2), np.ones(6), atol=1e-3)

    def test_masked_softmax_matches_numpy(self):
        rng = np.random.default_rng(3)
        scores = rng.normal(size=(3, 5, 7)).astype("float32")
        mask = random_padded_mask(rng, 3, 5, 7)
        got = kav_ops.masked_softmax(scores, mask)
        self.assertAllClose(got, ref.softmax_attention(scores, mask))

    def test_hybrid_matches_numpy_per_head_mix(self):
        rng = np.random.default_rng(4)
        scores = rng.normal(size=(2, 3, 5, 7)).astype("float32")
        mask = random_padded_mask(rng, 2, 5, 7)[:, None]
        mix = np.array([0.0, 0.3, 1.0], "float32").reshape(3, 1, 1)
        got = kav_ops.hybrid_normalize(scores, mix, mask)
        self.assertAllClose(got, ref.hybrid_attention(scores, mix, mask))

    @parameterized.parameters(2, 4)
    def test_hybrid_with_sinkhorn_iterations_matches_numpy(self, iterations):
        # Paper Eq. 12 with the DNAS part of Eq. 10 (`iterations` steps).
        rng = np.random.default_rng(10 + iterations)
        scores = (rng.normal(size=(2, 3, 5, 7)) * 3).astype("float32")
        mask = random_padded_mask(rng, 2, 5, 7)[:, None]
        mix = np.array([0.0, 0.3, 1.0], "float32").reshape(3, 1, 1)
        got = kav_ops.hybrid_normalize(scores, mix, mask, iterations)
        want = mix * ref.doubly_normalized_attention(
            scores, mask, iterations
        ) + (1 - mix) * ref.softmax_attention(scores, mask)
        self.assertAllClose(got, want, atol=1e-5)
        # The iterations matter here: one-step HNAS is far from it.
        one_step = ref.hybrid_attention(scores, mix, mask)
        self.assertGreater(np.abs(one_step - want).max(), 1e-2)

    def test_masked_entries_exactly_zero_and_empty_rows_columns_zero(self):
        scores = np.random.default_rng(5).normal(size=(4, 5)).astype("float32")
        mask = np.ones((4, 5), bool)
        mask[1, :] = False  # a query with no valid key
        mask[:, 3] = False  # a key with no valid query
        mask[2, 0] = False
        for fn in (kav_ops.doubly_normalize, kav_ops.masked_softmax):
            weights = ops.convert_to_numpy(fn(scores, mask))
            self.assertTrue(np.all(np.isfinite(weights)))
            self.assertTrue(np.all(weights[~mask] == 0.0))
            self.assertAllClose(weights.sum(-1), [1, 0, 1, 1])

    def test_padded_key_gets_no_attention_with_large_negative_scores(self):
        # Additive -1e9 masks cancel under the column step (notes, section 1).
        scores = np.zeros((3, 4), "float32")
        scores[:, 3] = -1e9
        mask = np.array([True, True, True, False])[None, :]
        weights = ops.convert_to_numpy(kav_ops.doubly_normalize(scores, mask))
        self.assertTrue(np.all(weights[:, 3] == 0.0))
        self.assertAllClose(weights.sum(-1), np.ones(3))

    @parameterized.parameters("float16", "bfloat16")
    def test_huge_low_precision_scores_stay_finite(self, dtype):
        rng = np.random.default_rng(6)
        scores = rng.choice([-1e4, 1e4], size=(2, 5, 6))
        scores = ops.cast(scores, dtype)
        mask = np.ones((2, 5, 6), bool)
        mask[0, 2] = False
        mask[1, :, 4] = False
        for weights in (
            kav_ops.doubly_normalize(scores, mask),
            kav_ops.doubly_normalize(scores, mask, iterations=3),
            kav_ops.masked_softmax(scores, mask),
            kav_ops.hybrid_normalize(scores, 0.5, mask),
        ):
            self.assertDType(weights, dtype)
            values = ops.convert_to_numpy(ops.cast(weights, "float32"))
            self.assertTrue(np.all(np.isfinite(values)))
            self.assertTrue(np.all(values[~mask] == 0.0))

    def test_bias_form_equals_doubly_normalize(self):
        rng = np.random.default_rng(7)
        scores = rng.normal(size=(2, 5, 7)).astype("float32")
        mask = random_padded_mask(rng, 2, 5, 7)
        bias = kav_ops.doubly_normalized_bias(scores, mask)
        via_bias = kav_ops.masked_softmax(ops.add(scores, bias), mask)
        self.assertAllClose(
            via_bias, kav_ops.doubly_normalize(scores, mask), atol=1e-6
        )

    @parameterized.parameters(0, -1, 1.5, True)
    def test_invalid_iterations(self, iterations):
        with self.assertRaisesRegex(ValueError, "iterations"):
            kav_ops.doubly_normalize(np.zeros((2, 2)), iterations=iterations)

    def test_mode_collapse_toy(self):
        # Paper Appendix E: softmax collapses the clusters, DNAS keeps two.
        def gap(points):
            return np.linalg.norm(points[:500].mean(0) - points[500:].mean(0))

        points = two_gaussian_clusters()
        unas = self_attention_steps(
            points,
            lambda s: ops.convert_to_numpy(
                kav_ops.masked_softmax(s.astype("float32"))
            ).astype(np.float64),
        )
        dnas = self_attention_steps(
            points,
            lambda s: ops.convert_to_numpy(
                kav_ops.doubly_normalize(s.astype("float32"))
            ).astype(np.float64),
        )
        self.assertLess(gap(unas[-1]), 0.05 * gap(unas[0]))
        self.assertGreater(gap(dnas[-1]), 0.5 * gap(dnas[0]))


@settings(max_examples=40, deadline=None)
@given(
    t=st.integers(1, 7),
    s=st.integers(1, 7),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([0.1, 1.0, 10.0, 100.0]),
)
def test_theorem_2_every_valid_key_gets_at_least_one_over_s(t, s, seed, scale):
    rng = np.random.default_rng(seed)
    scores = (rng.normal(size=(t, s)) * scale).astype("float32")
    mask = rng.random((t, s)) < 0.7
    weights = ops.convert_to_numpy(kav_ops.doubly_normalize(scores, mask))
    valid_keys = mask.any(0)
    for j in np.flatnonzero(valid_keys):
        # Theorem 2 with masks: at least 1 / (most valid keys in a row that
        # sees key j), which is >= 1 / (number of valid keys).
        rows = mask[:, j]
        s_valid = mask[rows].any(0).sum()
        assert weights[:, j].sum() >= 1.0 / s_valid - 1e-5


class NormalizationContractsTest(TestCase):
    # Contracts a mutation sweep found untested.
    def test_scores_without_a_query_axis_are_refused(self):
        for name, fn in (
            ("masked_softmax", normalization.masked_softmax),
            ("doubly_normalize", normalization.doubly_normalize),
            (
                "hybrid_normalize",
                lambda s: normalization.hybrid_normalize(s, 0.5),
            ),
            ("doubly_normalized_bias", normalization.doubly_normalized_bias),
        ):
            with self.assertRaisesRegex(
                ValueError,
                r"`scores` must have shape \(\.\.\., T, S\)",
                msg=name,
            ):
                fn(np.ones(3, "float32"))

    def test_a_boolean_mix_array_is_refused(self):
        with self.assertRaisesRegex(ValueError, "`mix` must hold floats"):
            normalization.hybrid_normalize(
                np.zeros((2, 3, 3), "float32"),
                np.array([True, False]).reshape(2, 1, 1),
            )

    def test_dnas_bias_is_zero_for_keys_no_query_may_attend(self):
        # Added to scores that carry a -1e9 mask, a +1e9 bias would bring
        # a padded key back.
        scores = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
        mask = np.ones((3, 4), bool)
        mask[:, 2] = False
        bias = ops.convert_to_numpy(
            normalization.doubly_normalized_bias(scores, mask)
        )
        self.assertEqual(bias.shape, (1, 4))
        self.assertAllEqual(bias[..., 2], [0.0])
        self.assertTrue(np.all(np.isfinite(bias)))
        want = -np.log(np.exp(scores[:, [0, 1, 3]]).sum(0))
        self.assertAllClose(bias[0, [0, 1, 3]], want, atol=1e-5)
