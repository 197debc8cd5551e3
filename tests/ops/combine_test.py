"""`ops.combine`: normalization folded into the value product.

Each `*_attend` function must equal `normalize(scores) @ value` in value
and in every gradient (scores, value, mix), with padding, a query with no
valid key and a key with no valid query, and stay finite for huge scores.
The reference is the autodiff of the plain log-space formulas
(`testing.autodiff_reference`) and the float64 NumPy Algorithm 1.
"""

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.ops import combine
from keras_attnvariants.ops.gumbel import relaxed_sample
from keras_attnvariants.ops.gumbel import straight_through
from keras_attnvariants.testing import numpy_reference as ref
from keras_attnvariants.testing.autodiff_reference import autodiff_dnas
from keras_attnvariants.testing.autodiff_reference import autodiff_hybrid
from keras_attnvariants.testing.autodiff_reference import autodiff_softmax
from keras_attnvariants.testing.autodiff_reference import edge_mask
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.test_case import TestCase

# scores (B, N, T, S), value (B, S, N, H), output (B, T, N, H)
B, N, T, S, H = 2, 3, 5, 7, 4
MIX = np.array([0.0, 0.35, 1.0], "float32").reshape(N, 1, 1)


def attend_reference(weights, value):
    return ops.einsum("bnts,bsnh->btnh", weights, value)


def tensors(*arrays):
    return [ops.convert_to_tensor(a) for a in arrays]


def case(seed, masked, scale=3.0):
    rng = np.random.default_rng(seed)
    scores = (rng.normal(size=(B, N, T, S)) * scale).astype("float32")
    value = rng.normal(size=(B, S, N, H)).astype("float32")
    upstream = rng.normal(size=(B, T, N, H)).astype("float32")
    return scores, value, upstream, edge_mask(rng) if masked else None


# name -> (folded function, reference weights), both of (scores, mask).
def functions(mask):
    mix = ops.convert_to_tensor(MIX)
    return {
        "softmax": (
            lambda s, v: combine.softmax_attend(s, v, mask),
            lambda s: autodiff_softmax(s, mask),
        ),
        "dnas": (
            lambda s, v: combine.doubly_normalized_attend(s, v, mask),
            lambda s: autodiff_dnas(s, mask),
        ),
        "hnas": (
            lambda s, v: combine.hybrid_attend(s, v, mix, mask),
            lambda s: autodiff_hybrid(s, mix, mask),
        ),
    }


NAMES = [("softmax",), ("dnas",), ("hnas",)]


class CombineTest(TestCase):
    @parameterized.parameters(*[n + (m,) for n in NAMES for m in (0, 1)])
    def test_equals_weights_times_value(self, name, masked):
        scores, value, upstream, mask = case(0, masked)
        folded, weights = functions(mask)[name]
        scores, value = tensors(scores, value)
        got = ops.convert_to_numpy(folded(scores, value))
        want = ops.convert_to_numpy(attend_reference(weights(scores), value))
        self.assertAllClose(got, want, atol=1e-5)

    def test_matches_numpy_algorithm_1(self):
        scores, value, _, mask = case(1, True)
        got = combine.doubly_normalized_attend(*tensors(scores, value), mask)
        weights = ref.doubly_normalized_attention(scores, mask)
        want = np.einsum("bnts,bsnh->btnh", weights, value)
        self.assertAllClose(ops.convert_to_numpy(got), want, atol=1e-5)
        got = combine.hybrid_attend(*tensors(scores, value, MIX), mask)
        weights = ref.hybrid_attention(scores, MIX, mask)
        want = np.einsum("bnts,bsnh->btnh", weights, value)
        self.assertAllClose(ops.convert_to_numpy(got), want, atol=1e-5)

    @parameterized.parameters(*[n + (m,) for n in NAMES for m in (0, 1)])
    def test_gradients_equal_autodiff(self, name, masked):
        scores, value, upstream, mask = case(2, masked)
        folded, weights = functions(mask)[name]
        got = gradients(folded, upstream, scores, value)
        want = gradients(
            lambda s, v: attend_reference(weights(s), v),
            upstream,
            scores,
            value,
        )
        for g, w in zip(got, want):
            self.assertTrue(np.all(np.isfinite(g)))
            self.assertAllClose(g, w, atol=2e-5)
        if mask is not None:
            # Masked scores get no gradient at all.
            masked_entries = ~np.broadcast_to(mask, scores.shape)
            self.assertEqual(float(np.abs(got[0][masked_entries]).max()), 0.0)

    @parameterized.parameters(False, True)
    def test_mix_gradient_equals_autodiff(self, masked):
        scores, value, upstream, mask = case(3, masked)
        mix = np.array([0.2, 0.5, 0.9], "float32").reshape(N, 1, 1)

        def folded(s, v, u):
            return combine.hybrid_attend(s, v, u, mask)

        def plain(s, v, u):
            return attend_reference(autodiff_hybrid(s, u, mask), v)

        got = gradients(folded, upstream, scores, value, mix)
        want = gradients(plain, upstream, scores, value, mix)
        for g, w in zip(got, want):
            self.assertAllClose(g, w, atol=3e-5)
        self.assertGreater(float(np.abs(got[2]).min()), 0.0)

    def test_scalar_mix_gradient(self):
        scores, value, upstream, _ = case(4, False)
        mix = np.array(0.3, "float32")
        got = gradients(
            lambda s, v, u: combine.hybrid_attend(s, v, u),
            upstream,
            scores,
            value,
            mix,
        )
        want = gradients(
            lambda s, v, u: attend_reference(autodiff_hybrid(s, u, None), v),
            upstream,
            scores,
            value,
            mix,
        )
        self.assertEqual(got[2].shape, ())
        self.assertAllClose(got[2], want[2], atol=3e-5)

    def test_relaxed_gumbel_equals_sample_times_value(self):
        scores, value, upstream, mask = case(5, True)
        noise = np.random.default_rng(6).gumbel(size=scores.shape)
        noise = noise.astype("float32")

        def folded(s, v):
            return combine.relaxed_gumbel_attend(s, v, noise, 0.5, mask)

        def plain(s, v):
            return attend_reference(relaxed_sample(s, noise, 0.5, mask), v)

        self.assertAllClose(
            ops.convert_to_numpy(folded(*tensors(scores, value))),
            ops.convert_to_numpy(plain(*tensors(scores, value))),
            atol=1e-5,
        )
        got = gradients(folded, upstream, scores, value)
        want = gradients(plain, upstream, scores, value)
        for g, w in zip(got, want):
            self.assertAllClose(g, w, atol=2e-5)

    @parameterized.parameters(False, True)
    def test_straight_through_equals_one_hot_times_value(self, masked):
        scores, value, upstream, mask = case(10, masked)
        noise = np.random.default_rng(11).gumbel(size=scores.shape)
        noise = noise.astype("float32")

        def folded(s, v):
            return combine.straight_through_gumbel_attend(
                s, v, noise, 0.5, mask
            )

        def plain(s, v):
            soft = relaxed_sample(s, noise, 0.5, mask)
            return attend_reference(straight_through(soft, mask), v)

        got = ops.convert_to_numpy(folded(*tensors(scores, value)))
        want = ops.convert_to_numpy(plain(*tensors(scores, value)))
        # Exactly one value row per query (zeros for rows without a key).
        self.assertAllClose(got, want, atol=1e-6)
        got = gradients(folded, upstream, scores, value)
        want = gradients(plain, upstream, scores, value)
        for g, w in zip(got, want):
            self.assertAllClose(g, w, atol=2e-5)
        self.assertGreater(float(np.abs(got[0]).max()), 0.0)

    @parameterized.parameters(*NAMES)
    def test_huge_scores_stay_finite(self, name):
        scores, value, upstream, mask = case(7, True, scale=1e4)
        folded, weights = functions(mask)[name]
        out = ops.convert_to_numpy(folded(*tensors(scores, value)))
        self.assertTrue(np.all(np.isfinite(out)))
        want = attend_reference(weights(*tensors(scores)), value)
        want = ops.convert_to_numpy(want)
        self.assertAllClose(out, want, atol=1e-4)
        for g in gradients(folded, upstream, scores, value):
            self.assertTrue(np.all(np.isfinite(g)))

    @parameterized.parameters(
        *[n + (d,) for n in NAMES for d in ("float16", "bfloat16")]
    )
    def test_half_precision_values(self, name, dtype):
        if dtype == "float16" and keras.backend.backend() == "torch":
            self.skipTest("Torch CPU kernels lack float16 matmuls.")
        scores, value, _, mask = case(8, True, scale=30.0)
        # Long uniform rows: `e @ V` sums S values of magnitude 100, more
        # than float16 holds before the row normalization.
        scores = np.concatenate([scores] * 200, axis=-1)
        value = np.concatenate([value] * 200, axis=1) * 100.0
        mask = np.concatenate([mask] * 200, axis=-1)
        folded, weights = functions(mask)[name]
        scores = ops.convert_to_tensor(scores)
        out = folded(scores, ops.cast(value, dtype))
        self.assertEqual(keras.backend.standardize_dtype(out.dtype), dtype)
        out = ops.convert_to_numpy(ops.cast(out, "float32"))
        self.assertTrue(np.all(np.isfinite(out)))
        want = ops.convert_to_numpy(attend_reference(weights(scores), value))
        self.assertAllClose(out, want, rtol=0.05, atol=1.0)

    def test_invalid_mix_shape(self):
        scores, value, _, _ = case(9, False)
        with self.assertRaisesRegex(ValueError, "`mix`.*\\(3, 1, 1\\)"):
            combine.hybrid_attend(scores, value, np.zeros((3, 5, 1)))
