"""The folded backwards under float16 / bfloat16 values, near one-hot.

`ops.combine` takes the row sums `sum_j g_ij A_ij` as `dO . O` in float32
and half precision alike; with a rounded half-precision `O` they no longer
matched `g = dO V^T`, and a saturated row (large logits, a low Gumbel
temperature) left a gradient of the rounding's size where the exact one
is 0: bfloat16 scores gradients 2-8e-2 off, 5-20x the error of autodiff
through the same weights in the same precision.
"""

import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.ops import combine
from keras_attnvariants.ops import normalization
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.test_case import TestCase

CASES = {
    "softmax": (combine.softmax_attend, normalization.masked_softmax),
    "dnas": (combine.doubly_normalized_attend, normalization.doubly_normalize),
    "hnas": (
        lambda s, v: combine.hybrid_attend(s, v, 0.4),
        lambda s: normalization.hybrid_normalize(s, 0.4),
    ),
    # Above 0.5 the backward takes the column sums (a mutation summing
    # over the other axis survived at mix 0.4 and T == S).
    "hnas_high": (
        lambda s, v: combine.hybrid_attend(s, v, 0.7),
        lambda s: normalization.hybrid_normalize(s, 0.7),
    ),
}


class HalfPrecisionBackwardTest(TestCase):
    @parameterized.product(
        name=sorted(CASES),
        dtype=["float16", "bfloat16"],
        lengths=[(6, 6), (5, 7)],
    )
    def test_folded_scores_gradient_as_accurate_as_autodiff(
        self, name, dtype, lengths
    ):
        folded, normalize = CASES[name]
        rng = np.random.default_rng(0)
        t, s = lengths
        # Logits near +-200: nearly one-hot rows, as at temperature 0.01.
        scores = (rng.normal(size=(2, 2, t, s)) * 100.0).astype("float32")
        value = rng.normal(size=(2, s, 2, 4)).astype("float32")
        upstream = rng.normal(size=(2, t, 2, 4)).astype("float32")

        def via_folded(s, v):
            return ops.cast(folded(s, ops.cast(v, dtype)), "float32")

        def via_weights(s, v):
            weights = ops.cast(normalize(s), dtype)
            v = ops.cast(v, dtype)
            out = ops.einsum(combine.COMBINE_EQUATION, weights, v)
            return ops.cast(out, "float32")

        def exact(s, v):
            return ops.einsum(combine.COMBINE_EQUATION, normalize(s), v)

        (want, _) = gradients(
            exact,
            upstream.astype("float64"),
            scores.astype("float64"),
            value.astype("float64"),
        )
        (got, _) = gradients(via_folded, upstream, scores, value)
        (baseline, _) = gradients(via_weights, upstream, scores, value)
        scale = np.linalg.norm(want)
        error = np.linalg.norm(got - want) / scale
        baseline_error = np.linalg.norm(baseline - want) / scale
        self.assertTrue(np.all(np.isfinite(got)))
        self.assertLess(error, 1.5 * baseline_error + 1e-5)
