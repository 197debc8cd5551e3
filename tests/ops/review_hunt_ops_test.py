import numpy as np
from absl.testing import parameterized

from keras_attnvariants.ops import receptive_field as rf
from keras_attnvariants.testing.gradients import gradients
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


class SinkhornInfiniteCostTest(TestCase):
    """A `+inf` cost forbids its pair: the default (normalized) plan was
    all nan (the normalizing max became inf), while `normalize_cost=False`
    gave the right plan; `sinkhorn_cost` was nan (`0 * inf`)."""

    def _reference(self, cost, epsilon, iterations):
        finite = np.isfinite(cost)
        scaled = cost / np.abs(np.where(finite, cost, 0.0)).max()
        kernel = np.where(finite, np.exp(-scaled / epsilon), 0.0)
        a = np.full(cost.shape[0], 1.0 / cost.shape[0])
        b = np.full(cost.shape[1], 1.0 / cost.shape[1])
        u, v = np.ones_like(a), np.ones_like(b)
        for _ in range(iterations):
            u = a / (kernel @ v)
            v = b / (kernel.T @ u)
        return u[:, None] * kernel * v[None, :], scaled

    def test_infinite_cost_forbids_pair(self):
        from keras import ops

        from keras_attnvariants.ops.transport import sinkhorn_cost
        from keras_attnvariants.ops.transport import sinkhorn_plan

        rng = np.random.default_rng(0)
        cost = rng.random((4, 5)).astype("float32")
        cost[0, 1] = cost[2, 3] = np.inf
        plan = ops.convert_to_numpy(
            sinkhorn_plan(cost, epsilon=0.1, iterations=30)
        )
        expected, scaled = self._reference(cost.astype("float64"), 0.1, 30)
        self.assertTrue(np.isfinite(plan).all())
        self.assertEqual(plan[0, 1], 0.0)
        self.assertEqual(plan[2, 3], 0.0)
        self.assertAllClose(plan, expected, atol=1e-6)
        value = float(
            ops.convert_to_numpy(
                sinkhorn_cost(cost, epsilon=0.1, iterations=30)
            )
        )
        finite_cost = np.where(np.isfinite(cost), cost, 0.0)
        self.assertAllClose(value, (expected * finite_cost).sum(), atol=1e-5)
        # The gradient is the plan on the finite pairs, 0 on forbidden ones.
        (gradient,) = gradients(
            lambda c: sinkhorn_cost(c, epsilon=0.1, iterations=30),
            np.float32(1.0),
            cost,
        )
        self.assertAllClose(gradient, expected, atol=1e-6)

    def test_nan_cost_is_not_taken_for_a_forbidden_pair(self):
        from keras import ops

        from keras_attnvariants.ops.transport import sinkhorn_plan

        cost = np.array([[np.nan, 1.0], [1.0, 0.0]], "float32")
        for normalize_cost in (True, False):
            plan = ops.convert_to_numpy(
                sinkhorn_plan(cost, epsilon=0.1, normalize_cost=normalize_cost)
            )
            self.assertTrue(np.isnan(plan).all(), plan)


class GradientReversalDtypeTest(TestCase):
    """An int (or bool) `x` failed with a backend error on TensorFlow
    and silently came back as float32 on JAX and PyTorch."""

    def test_non_float_input_raises(self):
        from keras_attnvariants.ops.gradient_reversal import gradient_reversal

        for x in (np.array([1, 2], "int32"), np.array([True])):
            with self.assertRaisesRegex(
                ValueError, "`x`.*Received: x with dtype"
            ):
                gradient_reversal(x)
