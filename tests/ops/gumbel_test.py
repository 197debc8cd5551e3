import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.ops import gumbel
from keras_attnvariants.testing import numpy_reference as ref
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.test_case import TestCase


def np_relaxed(scores, noise, temperature, mask):
    """Reference written from the formula, float64, probabilities."""
    s = np.asarray(scores, np.float64)
    mask = np.broadcast_to(mask, s.shape)
    p = np.where(mask, np.exp(s - s.max(-1, keepdims=True)), 0.0)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    logp = np.log(np.where(mask, p, 1.0))
    z = np.where(mask, np.exp((logp + noise) / temperature), 0.0)
    row = z.sum(-1, keepdims=True)
    return np.where(row > 0, z / np.where(row > 0, row, 1), 0.0)


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(2, 3, 5, 7)).astype("float32")
    mask = rng.random((2, 1, 5, 7)) > 0.3
    mask[0, 0, 1] = False  # a fully masked row
    mask[:, :, 0, 0] = True
    return scores, mask


class GumbelOpsTest(TestCase):
    def test_gumbel_from_uniform_matches_formula_and_stays_finite(self):
        u = np.array([0.0, 1e-30, 0.25, 0.5, 0.999, 1.0], "float32")
        g = ops.convert_to_numpy(gumbel.gumbel_from_uniform(u))
        self.assertTrue(np.all(np.isfinite(g)))
        self.assertAllClose(g[2:5], -np.log(-np.log(u[2:5])), atol=1e-5)

    def test_gumbel_noise_is_seeded_with_gumbel_moments(self):
        a = gumbel.gumbel_noise((20000,), seed=3)
        b = gumbel.gumbel_noise((20000,), seed=3)
        self.assertAllClose(a, b, atol=0)
        other = ops.convert_to_numpy(gumbel.gumbel_noise((20000,), seed=4))
        self.assertGreater(np.mean(other != ops.convert_to_numpy(a)), 0.99)
        a = ops.convert_to_numpy(a)
        # Standard Gumbel: mean = Euler-Mascheroni, variance = pi^2 / 6.
        self.assertAllClose(a.mean(), 0.5772, atol=0.05)
        self.assertAllClose(a.var(), np.pi**2 / 6, atol=0.1)

    @parameterized.product(
        key=(0, 12345, -7, 2**31 - 1, 2**32 - 1),
        shape=((2, 3, 5, 7), (6,), ()),
    )
    def test_positional_uniform_matches_numpy_reference(self, key, shape):
        got = ops.convert_to_numpy(gumbel.positional_uniform(key, shape))
        self.assertEqual(got.dtype, np.float32)
        self.assertEqual(got.shape, shape)
        self.assertAllClose(got, ref.positional_uniform(key, shape), atol=0)
        # The same draw from a tensor key (the low 32 bits of an int).
        tensor_key = gumbel.hash_words(ops.convert_to_tensor(key % 2**31))
        if key % 2**32 < 2**31:
            again = gumbel.positional_uniform(tensor_key, shape)
            self.assertAllClose(again, got, atol=0)

    def test_positional_uniform_is_the_same_compiled(self):
        # XLA (TensorFlow jit_compile, JAX jit) must not change the bits.
        shape = (2, 3, 4, 9)
        want = ref.positional_uniform(77, shape)
        backend = keras.backend.backend()
        if backend == "tensorflow":
            import tensorflow as tf

            compiled = tf.function(
                lambda k: gumbel.positional_uniform(k, shape),
                jit_compile=True,
            )
        elif backend == "jax":
            import jax

            compiled = jax.jit(lambda k: gumbel.positional_uniform(k, shape))
        else:
            self.skipTest("no XLA compilation on this backend")
        got = compiled(gumbel.hash_words(ops.convert_to_tensor(77)))
        self.assertAllClose(ops.convert_to_numpy(got), want, atol=0)

    def test_positional_uniform_entries_do_not_depend_on_the_shape(self):
        # Padding appended on any axis leaves the common entries unchanged.
        small = ops.convert_to_numpy(gumbel.positional_uniform(9, (2, 3, 4)))
        large = ops.convert_to_numpy(gumbel.positional_uniform(9, (3, 5, 11)))
        self.assertAllClose(large[:2, :3, :4], small, atol=0)
        other = ops.convert_to_numpy(gumbel.positional_uniform(10, (2, 3, 4)))
        self.assertFalse(np.any(other == small))

    def test_positional_uniform_is_uniform_and_uncorrelated(self):
        u = ops.convert_to_numpy(
            gumbel.positional_uniform(3, (8, 4, 64, 64))
        ).astype(np.float64)
        self.assertGreater(u.min(), 0.0)
        self.assertLess(u.max(), 1.0)
        # 131072 draws: standard errors 0.0008 (mean), 0.0002 (variance),
        # about 0.003 (each correlation).
        self.assertAllClose(u.mean(), 0.5, atol=0.004)
        self.assertAllClose(u.var(), 1 / 12, atol=0.001)
        counts = np.histogram(u, bins=64, range=(0, 1))[0]
        chi2 = ((counts - u.size / 64) ** 2 / (u.size / 64)).sum()
        self.assertLess(chi2, 120)  # 63 dof: p ~ 2e-5
        centred = u - 0.5
        for axis in range(4):  # neighbours along every axis
            a = np.take(centred, range(0, u.shape[axis] - 1), axis=axis)
            b = np.take(centred, range(1, u.shape[axis]), axis=axis)
            self.assertLess(abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]), 0.015)

    def test_gumbel_max_choices_are_independent_across_keys_and_rows(self):
        # Consecutive draws (keys k, k + 1: the generator's counter words
        # hash to unrelated keys, but a hash that only XORed the key in at
        # the end made draw k + 1 an XOR-masked copy of draw k) and
        # neighbouring rows must pick their Gumbel-max categories
        # independently: a 2D chi-square over the 8 x 8 pairs of choices.
        rows, categories = 16384, 8

        def choices(key, shape):
            u = ops.convert_to_numpy(gumbel.positional_uniform(key, shape))
            return np.argmax(-np.log(-np.log(u)), axis=-1)

        def pair_chi2(a, b):
            counts = np.zeros((categories, categories))
            np.add.at(counts, (a.ravel(), b.ravel()), 1)
            expected = a.size / categories**2
            return ((counts - expected) ** 2 / expected).sum()

        first = choices(41, (rows, categories))
        pairs = {
            "next key": (first, choices(42, (rows, categories))),
            "next row": (first[:-1], first[1:]),
        }
        grid = choices(5, (2, 64, 128, categories))
        pairs["next batch row"] = (grid[0], grid[1])
        pairs["next query row"] = (grid[:, :-1], grid[:, 1:])
        for name, (a, b) in pairs.items():
            # 63 degrees of freedom: 130 is p ~ 1e-6.
            self.assertLess(pair_chi2(a, b), 130, name)

    def test_relaxed_sample_matches_numpy_reference(self):
        scores, mask = inputs()
        noise = np.random.default_rng(1).gumbel(size=scores.shape)
        for temperature in (0.5, 1.0, 3.0):
            got = gumbel.relaxed_sample(
                scores, noise.astype("float32"), temperature, mask
            )
            want = np_relaxed(scores, noise, temperature, mask)
            self.assertAllClose(got, want, atol=1e-5)

    def test_zero_noise_unit_temperature_is_softmax(self):
        scores, mask = inputs(2)
        got = gumbel.relaxed_sample(scores, 0.0, 1.0, mask)
        want = np_relaxed(scores, 0.0, 1.0, mask)
        self.assertAllClose(got, want, atol=1e-6)

    def test_one_hot_argmax_never_selects_masked_keys(self):
        scores, mask = inputs(3)
        scores = np.where(mask, scores, 1e6).astype("float32")
        hard = ops.convert_to_numpy(gumbel.one_hot_argmax(scores, mask))
        full = np.broadcast_to(mask, hard.shape)
        self.assertTrue(np.all(hard[~full] == 0))
        self.assertAllClose(hard.sum(-1), full.any(-1).astype("float32"))
        filled = np.where(full, scores, -np.inf)
        want = np.argmax(filled, -1)
        got = np.argmax(hard, -1)
        rows = full.any(-1)
        self.assertAllEqual(got[rows], want[rows])

    def test_straight_through_forward_is_exactly_one_hot(self):
        scores, mask = inputs(4)
        soft = gumbel.relaxed_sample(scores, 0.0, 1.0, mask)
        hard = ops.convert_to_numpy(gumbel.straight_through(soft, mask))
        self.assertTrue(set(np.unique(hard)) <= {0.0, 1.0})
        self.assertAllEqual(
            np.argmax(hard, -1), np.argmax(ops.convert_to_numpy(soft), -1)
        )

    def test_straight_through_picks_the_logits_argmax_when_given(self):
        # Logits too flat for float32's softmax: the weights tie, and their
        # own argmax is the first valid key, not the logits' argmax.
        scores, mask = inputs(5)
        logits = gumbel.relaxed_logits(scores, 0.0, 1e9, mask)
        soft = gumbel.sample_of_logits(logits, mask)
        hard = gumbel.straight_through(soft, mask, logits)
        hard = ops.convert_to_numpy(hard)
        full = np.broadcast_to(np.asarray(mask), hard.shape)
        want = np.argmax(np.where(full, np.asarray(scores), -np.inf), -1)
        rows = full.any(-1)
        self.assertAllEqual(np.argmax(hard, -1)[rows], want[rows])
        self.assertTrue(np.all(hard[~full] == 0))
        with self.assertRaisesRegex(ValueError, "`logits` must have"):
            gumbel.straight_through(soft, mask, logits[..., :1])

    def test_extreme_and_non_finite_scores_stay_finite(self):
        scores = np.array([[[1e30, -1e30, np.inf, -np.inf]]], "float32")
        mask = np.array([[[True, True, False, True]]])
        out = gumbel.relaxed_sample(scores, 0.0, 1.0, mask)
        self.assertTrue(np.all(np.isfinite(ops.convert_to_numpy(out))))
        self.assertAllClose(out, [[[1.0, 0.0, 0.0, 0.0]]])

    def test_clamped_logits_gradient_matches_autodiff_of_the_clamp(self):
        # The clamp differentiates like clip(nan_to_num(x), +-1e9):
        # 1 inside the bound, 0 at NaN, +-inf and clamped entries.
        scores = np.array(
            [[3.0, -2.5, 1e9, -1e9, 2e9, -5e9, np.nan, np.inf, -np.inf]],
            "float32",
        )
        upstream = np.arange(1, 10, dtype="float32")[None]
        (grad,) = gradients(gumbel._clamp_logits, upstream, scores)
        self.assertAllEqual(grad, [[1.0, 2.0, 3.0, 4.0, 0, 0, 0, 0, 0]])
        value = ops.convert_to_numpy(gumbel._clamp_logits(scores))
        self.assertAllEqual(
            value, [[3.0, -2.5, 1e9, -1e9, 1e9, -1e9, 0.0, 1e9, -1e9]]
        )

    def test_gather_values_equals_one_hot_weighted_sum(self):
        rng = np.random.default_rng(5)
        value = rng.normal(size=(2, 7, 3, 4)).astype("float32")
        idx = rng.integers(0, 7, size=(2, 3, 5)).astype("int32")
        row_valid = rng.random((2, 3, 5)) > 0.2
        got = gumbel.gather_values(value, idx, row_valid)
        one_hot = np.eye(7)[idx] * row_valid[..., None]
        want = np.einsum("bnts,bsnh->btnh", one_hot, value)
        self.assertAllClose(got, want, atol=1e-6)

    def test_scatter_values_is_the_transpose_of_gather_values(self):
        rng = np.random.default_rng(6)
        d_picked = rng.normal(size=(2, 5, 3, 4)).astype("float32")
        # Few keys, many queries: most keys are picked several times.
        idx = rng.integers(0, 3, size=(2, 3, 5)).astype("int32")
        row_valid = rng.random((2, 3, 5)) > 0.2
        got = gumbel.scatter_values(d_picked, idx, (2, 7, 3, 4), row_valid)
        one_hot = np.eye(7)[idx] * row_valid[..., None]
        want = np.einsum("btnh,bnts->bsnh", d_picked, one_hot)
        self.assertAllClose(got, want, atol=1e-6)
        self.assertAllEqual(ops.convert_to_numpy(got)[:, 3:], 0.0)
        # <gather(V), D> == <V, scatter(D)> for every V and D.
        value = rng.normal(size=(2, 7, 3, 4)).astype("float32")
        picked = gumbel.gather_values(value, idx, row_valid)
        self.assertAllClose(
            np.sum(ops.convert_to_numpy(picked) * d_picked),
            np.sum(value * ops.convert_to_numpy(got)),
            rtol=1e-5,
        )

    @parameterized.parameters("float16", "bfloat16")
    def test_scatter_values_keeps_dtype_and_sums_in_float32(self, dtype):
        # 600 queries pick key 0 with the same gradient row. A running sum
        # in the half type rounds every step: bfloat16 stalls at 256 (its
        # spacing there is 2), float16 ends at 600.0 instead of 600.5.
        d_picked = np.full((1, 600, 1, 2), 1.001, "float32")
        idx = np.zeros((1, 1, 600), "int32")
        got = gumbel.scatter_values(
            ops.cast(d_picked, dtype), idx, (1, 4, 1, 2)
        )
        self.assertEqual(keras.backend.standardize_dtype(got.dtype), dtype)
        got = ops.convert_to_numpy(ops.cast(got, "float32"))
        row = ops.convert_to_numpy(ops.cast(ops.cast(1.001, dtype), "float32"))
        want = ops.cast(ops.cast(600 * row, dtype), "float32")
        self.assertAllEqual(got[0, 0, 0], [ops.convert_to_numpy(want)] * 2)
        self.assertAllEqual(got[0, 1:], 0.0)

    def test_low_temperature_never_prefers_masked_keys(self):
        # |s| / temperature far beyond the mask fill of the old code (1e9).
        from keras_attnvariants.ops import combine

        scores = np.array([[[-2e7, -3e7, 5.0]]], "float32")
        mask = np.array([[[True, True, False]]])
        noise = np.zeros_like(scores)
        for temperature in (1.0, 0.01, 1e-4):
            weights = gumbel.relaxed_sample(scores, noise, temperature, mask)
            self.assertAllClose(weights, [[[1.0, 0.0, 0.0]]])
        value = np.arange(6, dtype="float32").reshape(1, 3, 1, 2)
        for attend in (
            combine.relaxed_gumbel_attend,
            combine.straight_through_gumbel_attend,
        ):
            out = attend(scores[:, None], value, noise[:, None], 1e-4, mask)
            self.assertAllClose(out, value[:, :1])

    def test_invalid_temperature_raises(self):
        scores, mask = inputs()
        # NumPy scalars too: np.float32(0) gave NaN weights and a negative
        # one a sample of the inverted distribution.
        for bad in (0.0, -2.0, np.float32(0.0), np.float32(-1.0), True):
            with self.assertRaisesRegex(ValueError, "temperature"):
                gumbel.relaxed_sample(scores, 0.0, bad, mask)
        # Scalars that are not Python numbers still work.
        got = gumbel.relaxed_sample(scores, 0.0, np.float32(2.0), mask)
        want = np_relaxed(scores, 0.0, 2.0, mask)
        self.assertAllClose(got, want, atol=1e-6)


class GumbelContractsTest(TestCase):
    # Contracts a mutation sweep found untested.
    def test_straight_through_picks_the_best_valid_key_of_raw_logits(self):
        # The masked key holds the largest raw logit.
        logits = np.array([[5.0, 1.0, 0.0]], "float32")
        mask = np.array([[False, True, True]])
        soft = np.array([[0.0, 0.7, 0.3]], "float32")
        got = gumbel.straight_through(soft, mask, logits=logits)
        self.assertAllClose(got, [[0.0, 1.0, 0.0]])

    def test_a_clamped_valid_score_still_beats_the_mask_fill(self):
        # A score at -LOGIT_BOUND must stay above the masked entries' fill,
        # or the row shared its weight with a masked key (summing to 0.5).
        got = gumbel.relaxed_sample(
            np.array([[-1e12, 5.0]], "float32"),
            0.0,
            1.0,
            mask=np.array([[True, False]]),
        )
        self.assertAllClose(got, [[1.0, 0.0]])

    def test_argmax_of_an_empty_key_axis_is_empty(self):
        scores = np.zeros((1, 2, 3, 0), "float32")
        got = gumbel.one_hot_argmax(scores)
        self.assertEqual(tuple(got.shape), (1, 2, 3, 0))
        # Index 0 on every backend (TensorFlow's path gave -1).
        self.assertAllEqual(
            gumbel.argmax_indices(scores), np.zeros((1, 2, 3), "int32")
        )

    def test_a_vector_key_is_refused(self):
        with self.assertRaisesRegex(ValueError, "`key` must be an int"):
            gumbel.positional_uniform(
                ops.convert_to_tensor(np.array([1, 2], "int32")), (2, 3)
            )

    def test_row_valid_of_another_rank_is_refused(self):
        value = np.zeros((2, 6, 3, 4), "float32")
        indices = np.zeros((2, 3, 6), "int32")
        with self.assertRaisesRegex(ValueError, "`row_valid` must be"):
            gumbel.gather_values(
                value, indices, row_valid=np.ones((2, 3, 6, 1), bool)
            )
