"""The analytic backward passes of `doubly_normalize` / `hybrid_normalize`."""

import numpy as np
from absl.testing import parameterized

from keras_attnvariants import ops as kav_ops
from keras_attnvariants.testing import numpy_reference as ref
from keras_attnvariants.testing.autodiff_reference import autodiff_dnas
from keras_attnvariants.testing.autodiff_reference import autodiff_hybrid
from keras_attnvariants.testing.autodiff_reference import edge_mask
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.test_case import TestCase


def case(seed, masked, scale=3.0):
    rng = np.random.default_rng(seed)
    scores = (rng.normal(size=(2, 3, 5, 7)) * scale).astype("float32")
    upstream = rng.normal(size=scores.shape).astype("float32")
    return scores, upstream, edge_mask(rng) if masked else None


class NormalizationGradientTest(TestCase):
    @parameterized.parameters(False, True)
    def test_dnas_gradient_equals_autodiff(self, masked):
        scores, upstream, mask = case(0, masked)
        (got,) = gradients(
            lambda s: kav_ops.doubly_normalize(s, mask), upstream, scores
        )
        (want,) = gradients(lambda s: autodiff_dnas(s, mask), upstream, scores)
        self.assertTrue(np.all(np.isfinite(got)))
        self.assertAllClose(got, want, atol=1e-6)
        if masked:
            self.assertTrue(np.all(got[np.broadcast_to(~mask, got.shape)] == 0))

    @parameterized.parameters(
        (False, "head"), (True, "head"), (True, "scalar"), (True, "key")
    )
    def test_hybrid_gradient_equals_autodiff(self, masked, mix_kind):
        scores, upstream, mask = case(1, masked)
        mix = {
            "head": np.array([0.0, 0.3, 1.0], "float32").reshape(3, 1, 1),
            "scalar": np.array(0.4, "float32"),
            "key": np.linspace(0, 1, 7).astype("float32").reshape(1, 7),
        }[mix_kind]
        got = gradients(
            lambda s, u: kav_ops.hybrid_normalize(s, u, mask),
            upstream,
            scores,
            mix,
        )
        want = gradients(
            lambda s, u: autodiff_hybrid(s, u, mask), upstream, scores, mix
        )
        self.assertEqual(got[1].shape, mix.shape)
        for g, w in zip(got, want):
            self.assertTrue(np.all(np.isfinite(g)))
            self.assertAllClose(g, w, atol=2e-6)

    def test_dnas_gradient_matches_finite_differences_of_numpy(self):
        # Independent of any autodiff: central differences of Algorithm 1.
        rng = np.random.default_rng(2)
        scores = rng.normal(size=(4, 5)).astype("float32")
        upstream = rng.normal(size=(4, 5)).astype("float32")
        mask = np.ones((4, 5), bool)
        mask[0, 3] = False
        mask[1, :] = False  # a query with no valid key
        mask[:, 4] = False  # a key with no valid query
        (got,) = gradients(
            lambda s: kav_ops.doubly_normalize(s, mask), upstream, scores
        )
        want = np.zeros_like(got, dtype=np.float64)
        eps = 1e-4
        for idx in np.ndindex(scores.shape):
            step = np.zeros(scores.shape)
            step[idx] = eps
            up = ref.doubly_normalized_attention(scores + step, mask)
            down = ref.doubly_normalized_attention(scores - step, mask)
            want[idx] = ((up - down) * upstream).sum() / (2 * eps)
        self.assertAllClose(got, want, atol=1e-4)

    def test_gradients_finite_for_huge_scores(self):
        rng = np.random.default_rng(3)
        scores = rng.choice([-1e4, 1e4], size=(2, 3, 5, 7)).astype("float32")
        upstream = rng.normal(size=scores.shape).astype("float32")
        mask = edge_mask(rng)
        mix = np.array([0.0, 0.5, 1.0], "float32").reshape(3, 1, 1)
        (dnas,) = gradients(
            lambda s: kav_ops.doubly_normalize(s, mask), upstream, scores
        )
        hybrid = gradients(
            lambda s, u: kav_ops.hybrid_normalize(s, u, mask),
            upstream,
            scores,
            mix,
        )
        for g in (dnas, *hybrid):
            self.assertTrue(np.all(np.isfinite(g)))
