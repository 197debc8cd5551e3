"""`ops.combine` with dropout multipliers (`keep=`).

`O = (weights * keep) @ value` without writing the weights: the value and
every gradient (scores, value, mix) must equal the autodiff of that
expression, with padding, and with a query that has no valid key.
"""

import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.ops import combine
from keras_attnvariants.ops.gumbel import relaxed_sample
from keras_attnvariants.testing.autodiff_reference import autodiff_dnas
from keras_attnvariants.testing.autodiff_reference import autodiff_hybrid
from keras_attnvariants.testing.autodiff_reference import autodiff_softmax
from keras_attnvariants.testing.autodiff_reference import edge_mask
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.test_case import TestCase

B, N, T, S, H = 2, 3, 5, 7, 4
MIX = np.array([0.2, 0.5, 0.8], "float32").reshape(N, 1, 1)
RATE = 0.4


def _case(seed, masked):
    rng = np.random.default_rng(seed)
    scores = (rng.normal(size=(B, N, T, S)) * 3.0).astype("float32")
    value = rng.normal(size=(B, S, N, H)).astype("float32")
    upstream = rng.normal(size=(B, T, N, H)).astype("float32")
    noise = rng.gumbel(size=(B, N, T, S)).astype("float32")
    keep = np.where(rng.random((B, N, T, S)) >= RATE, 1 / (1 - RATE), 0.0)
    mask = edge_mask(rng) if masked else None
    return scores, value, upstream, noise, keep.astype("float32"), mask


def _pairs(mask, keep, noise):
    """name -> (folded (s, v, mix), reference weights (s, mix))."""
    return {
        "softmax": (
            lambda s, v, *m: combine.softmax_attend(s, v, mask, keep),
            lambda s, *m: autodiff_softmax(s, mask),
        ),
        "dnas": (
            lambda s, v, *m: combine.doubly_normalized_attend(s, v, mask, keep),
            lambda s, *m: autodiff_dnas(s, mask),
        ),
        "hnas": (
            lambda s, v, *m: combine.hybrid_attend(s, v, m[0], mask, keep),
            lambda s, *m: autodiff_hybrid(s, m[0], mask),
        ),
        "relaxed_gumbel": (
            lambda s, v, *m: combine.relaxed_gumbel_attend(
                s, v, noise, 0.7, mask, keep
            ),
            lambda s, *m: relaxed_sample(s, noise, 0.7, mask),
        ),
    }


class CombineDropoutTest(TestCase):
    @parameterized.product(
        name=["softmax", "dnas", "hnas", "relaxed_gumbel"], masked=[0, 1]
    )
    def test_equals_autodiff_of_dropped_weights(self, name, masked):
        scores, value, upstream, noise, keep, mask = _case(3, masked)
        folded, weights = _pairs(mask, keep, noise)[name]

        def reference(s, v, *m):
            dropped = ops.multiply(weights(s, *m), keep)
            return ops.einsum("bnts,bsnh->btnh", dropped, v)

        args = (scores, value) + ((MIX,) if name == "hnas" else ())
        self.assertAllClose(
            ops.convert_to_numpy(folded(*map(ops.convert_to_tensor, args))),
            ops.convert_to_numpy(reference(*map(ops.convert_to_tensor, args))),
            atol=1e-5,
        )
        got = gradients(folded, upstream, *args)
        want = gradients(reference, upstream, *args)
        self.assertEqual(len(got), len(args))
        for label, g, w in zip(("scores", "value", "mix"), got, want):
            self.assertAllClose(g, w, atol=2e-5, msg=label)

    def test_all_ones_keep_is_no_dropout(self):
        scores, value, _, _, _, mask = _case(4, True)
        ones = np.ones_like(scores)
        for fn in (combine.softmax_attend, combine.doubly_normalized_attend):
            self.assertAllClose(
                ops.convert_to_numpy(fn(scores, value, mask, ones)),
                ops.convert_to_numpy(fn(scores, value, mask)),
                atol=1e-6,
            )
