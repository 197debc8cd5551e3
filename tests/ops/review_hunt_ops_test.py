import numpy as np
from absl.testing import parameterized

from keras_attnvariants.ops import receptive_field as rf
from keras_attnvariants.testing.test_case import TestCase


class ReceptiveFieldShapeTest(TestCase):
    @parameterized.named_parameters(
        # One example's (T, T) weights gave a (T, T, T) "field".
        ("one_example", (4, 4)),
        # A stack of layers (L, B, N, T, T) failed inside a multiply.
        ("stacked_layers", (2, 3, 2, 4, 4)),
        # Cross-attention (B, T, S) weights broadcast into (B, S, S).
        ("non_square", (2, 1, 4)),
        ("non_square_heads", (2, 3, 5, 4)),
    )
    def test_rejects_weights_that_are_not_self_attention(self, shape):
        z = np.full(shape, 0.25, "float32")
        with self.assertRaisesRegex(
            ValueError,
            r"`attentions` must be self-attention weights.*"
            rf"Received: attentions with shape \({', '.join(map(str, shape))}",
        ):
            rf.receptive_fields([z])
        # Also when only a later layer is wrong.
        with self.assertRaisesRegex(ValueError, "attentions"):
            rf.receptive_fields([np.full((2, 4, 4), 0.25, "float32"), z])

    def test_three_and_four_dimensional_layers_still_mix(self):
        rng = np.random.default_rng(0)
        z4 = rng.dirichlet(np.ones(5), size=(2, 3, 5)).astype("float32")
        z3 = z4.sum(1)
        self.assertAllClose(
            rf.receptive_fields([z4, z3]), rf.receptive_fields([z3, z4])
        )
        # A 4-D layer counts as its heads summed.
        self.assertAllClose(
            rf.receptive_fields([z4, z3]), rf.receptive_fields([z3, z3])
        )
