"""Second derivatives through the hand-written backward passes.

A gradient penalty (WGAN-GP) or a Hessian-vector product differentiates
the backward pass itself. The folded backwards of `ops.normalization` and
`ops.combine` must then give what plain autodiff of the formula gives, on
every backend: PyTorch ran their forward under `no_grad`, and the second
derivative came out silently wrong (up to 2x off) until the backward
recomputed it from its inputs under `create_graph=True`.
"""

import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants import ops as kav_ops
from keras_attnvariants.ops import combine
from keras_attnvariants.testing.autodiff_reference import autodiff_dnas
from keras_attnvariants.testing.autodiff_reference import autodiff_hybrid
from keras_attnvariants.testing.autodiff_reference import autodiff_softmax
from keras_attnvariants.testing.autodiff_reference import edge_mask
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.gradients import hessian_vector_products
from keras_attnvariants.testing.test_case import TestCase

MIX = 0.3


def attend(weights, value):
    """`weights @ value` in the `(B, T, N, H)` layout of `ops.combine`."""
    return ops.einsum(combine.COMBINE_EQUATION, weights, value)


CASES = {
    "doubly_normalize": (
        lambda s, v, m: kav_ops.doubly_normalize(s, m),
        lambda s, v, m: autodiff_dnas(s, m),
        False,
    ),
    "hybrid_normalize": (
        lambda s, v, m: kav_ops.hybrid_normalize(s, MIX, m),
        lambda s, v, m: autodiff_hybrid(s, MIX, m),
        False,
    ),
    "softmax_attend": (
        lambda s, v, m: combine.softmax_attend(s, v, m),
        lambda s, v, m: attend(autodiff_softmax(s, m), v),
        True,
    ),
    "doubly_normalized_attend": (
        lambda s, v, m: combine.doubly_normalized_attend(s, v, m),
        lambda s, v, m: attend(autodiff_dnas(s, m), v),
        True,
    ),
    "hybrid_attend": (
        lambda s, v, m: combine.hybrid_attend(s, v, MIX, m),
        lambda s, v, m: attend(autodiff_hybrid(s, MIX, m), v),
        True,
    ),
}


class SecondOrderTest(TestCase):
    @parameterized.product(name=sorted(CASES), masked=[False, True])
    def test_hessian_vector_product_equals_autodiff(self, name, masked):
        got_fn, want_fn, takes_value = CASES[name]
        rng = np.random.default_rng(0)
        scores = rng.normal(size=(2, 3, 5, 7)) * 2.0
        value = rng.normal(size=(2, 7, 3, 4))
        mask = edge_mask(rng) if masked else None
        if takes_value:
            upstream = rng.normal(size=(2, 5, 3, 4))
            args = (scores, value)
        else:
            upstream = rng.normal(size=scores.shape)
            args = (scores,)
        direction = [rng.normal(size=a.shape) for a in args]

        def wrap(fn):
            if takes_value:
                return lambda s, v: fn(s, v, mask)
            return lambda s: fn(s, None, mask)

        first = gradients(wrap(got_fn), upstream, *args)
        want_first = gradients(wrap(want_fn), upstream, *args)
        for g, w in zip(first, want_first):
            self.assertAllClose(g, w, atol=1e-5, rtol=1e-5)
        got = hessian_vector_products(wrap(got_fn), upstream, direction, *args)
        want = hessian_vector_products(
            wrap(want_fn), upstream, direction, *args
        )
        for g, w in zip(got, want):
            # Not vanishing: the check would hold for a backward that
            # dropped the curvature only if the curvature were 0.
            self.assertGreater(np.max(np.abs(w)), 1e-3)
            # float32 where the backend computes it (JAX without x64):
            # 1e-5, against errors of 1e-2 to 1 without the fix.
            self.assertAllClose(g, w, atol=1e-5, rtol=1e-5)
