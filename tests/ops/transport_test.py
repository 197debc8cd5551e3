import os
from unittest import mock

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops
from scipy.optimize import linear_sum_assignment
from scipy.special import logsumexp

from keras_attnvariants.ops import fused_sinkhorn
from keras_attnvariants.ops import transport
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.test_case import TestCase


def clouds(seed, n, m, dim=4, shift=0.0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype("float32")
    y = (rng.normal(size=(m, dim)) + shift).astype("float32")
    return x, y


def numpy_mmd(x, y, bandwidth=1.0):
    def k(a, b):
        d = ((a[:, None] - b[None]) ** 2).sum(-1)
        return np.exp(-d / (2 * bandwidth**2)).mean()

    return k(x, x) + k(y, y) - 2 * k(x, y)


def numpy_sinkhorn(cost, epsilon, iterations):
    n, m = cost.shape
    kernel = -cost / cost.max() / epsilon
    u, v = np.zeros(n), np.zeros(m)
    for _ in range(iterations):
        u = -np.log(n) - logsumexp(kernel + v[None], axis=1)
        v = -np.log(m) - logsumexp(kernel + u[:, None], axis=0)
    return np.exp(kernel + u[:, None] + v[None])


def masked_ct_inputs(seed):
    """A `(5, 6)` cost and logits with 3 valid rows and 4 valid columns."""
    rng = np.random.default_rng(seed)
    cost = rng.uniform(size=(5, 6)).astype("float32")
    logits = rng.normal(size=(5, 6)).astype("float32")
    row_mask = np.array([1, 0, 1, 1, 0], bool)
    col_mask = np.array([1, 1, 0, 1, 1, 0], bool)
    return cost, logits, row_mask, col_mask


def np_conditional_transport(cost, logits, rho):
    """Bidirectional CT cost with uniform marginals, from the formula."""
    forward = np.exp(logits - logsumexp(logits, axis=1, keepdims=True))
    backward = np.exp(logits - logsumexp(logits, axis=0, keepdims=True))
    return (
        rho * (forward * cost).sum(1).mean()
        + (1 - rho) * (backward * cost).sum(0).mean()
    )


class SinkhornTest(TestCase):
    @parameterized.parameters((30, 30, 0), (24, 40, 1), (48, 36, 2))
    def test_marginals_within_1e3_after_default_iterations(self, n, m, seed):
        x, y = clouds(seed, n, m, shift=0.5 * seed)
        cost = transport.squared_euclidean_cost(x, y)
        plan = ops.convert_to_numpy(transport.sinkhorn_plan(cost))
        self.assertLessEqual(np.abs(plan.sum(1) - 1 / n).max(), 1e-3)
        self.assertLessEqual(np.abs(plan.sum(0) - 1 / m).max(), 1e-3)
        self.assertAllClose(plan.sum(), 1.0, atol=1e-3)

    def test_matches_numpy_log_domain_sinkhorn(self):
        x, y = clouds(3, 7, 5)
        cost = ops.convert_to_numpy(transport.squared_euclidean_cost(x, y))
        plan = transport.sinkhorn_plan(cost, epsilon=0.05, iterations=20)
        self.assertAllClose(plan, numpy_sinkhorn(cost, 0.05, 20), atol=1e-6)

    @parameterized.parameters(0, 1, 2, 3)
    def test_cost_close_to_exact_assignment(self, seed):
        # Entropic bias bound: with P* the optimal permutation plan (entropy
        # log n), <C, P_eps> - eps' H(P_eps) <= <C, P*> - eps' log n, so
        # 0 <= <C, P_eps> - OT <= eps' (H(P_eps) - log n) <= eps' log n,
        # where eps' = epsilon * max(C) (normalized cost). The lower side
        # allows for the residual marginal error (<= 1e-3 * max(C)).
        n = 20
        x, y = clouds(seed, n, n, shift=0.3 * seed)
        cost = ops.convert_to_numpy(transport.squared_euclidean_cost(x, y))
        rows, cols = linear_sum_assignment(cost)
        exact = cost[rows, cols].mean()
        got = float(transport.sinkhorn_cost(cost))
        scale = cost.max()
        self.assertGreaterEqual(got, exact - 1e-3 * scale)
        self.assertLessEqual(got, exact + 0.01 * scale * np.log(n))
        # In practice the gap is a few percent.
        self.assertLess((got - exact) / exact, 0.1)

    def test_masked_rows_and_columns_get_no_mass(self):
        x, y = clouds(4, 6, 5)
        cost = transport.squared_euclidean_cost(x, y)
        row_mask = np.array([1, 1, 0, 1, 1, 0], bool)
        col_mask = np.array([1, 0, 1, 1, 1], bool)
        plan = ops.convert_to_numpy(
            transport.sinkhorn_plan(cost, row_mask=row_mask, col_mask=col_mask)
        )
        self.assertTrue(np.all(plan[~row_mask] == 0.0))
        self.assertTrue(np.all(plan[:, ~col_mask] == 0.0))
        want = transport.sinkhorn_plan(
            ops.convert_to_numpy(cost)[row_mask][:, col_mask]
        )
        self.assertAllClose(plan[row_mask][:, col_mask], want, atol=1e-6)

    def test_cost_equals_numpy_plan_times_raw_cost_with_masks(self):
        # `<C, P>` with the raw (not the normalized) cost, over the valid
        # block only.
        x, y = clouds(8, 6, 5)
        cost = ops.convert_to_numpy(transport.squared_euclidean_cost(x, y))
        row_mask = np.array([1, 1, 0, 1, 1, 0], bool)
        col_mask = np.array([1, 0, 1, 1, 1], bool)
        got = transport.sinkhorn_cost(cost, 0.05, 20, row_mask, col_mask)
        sub = cost[row_mask][:, col_mask].astype(np.float64)
        want = (numpy_sinkhorn(sub, 0.05, 20) * sub).sum()
        self.assertAllClose(got, want, rtol=1e-5, atol=0)

    def test_fully_masked_and_zero_cost_are_finite(self):
        cost = np.zeros((2, 4, 3), "float32")
        plan = transport.sinkhorn_plan(
            cost, row_mask=np.array([[1, 1, 0, 0], [0, 0, 0, 0]], bool)
        )
        plan = ops.convert_to_numpy(plan)
        self.assertTrue(np.all(np.isfinite(plan)))
        self.assertAllClose(plan[0].sum(), 1.0, atol=1e-6)
        self.assertAllClose(plan[1], np.zeros((4, 3)))

    def test_ot_near_zero_for_identical_and_grows_with_separation(self):
        x, _ = clouds(5, 12, 1)
        costs = []
        for shift in (0.0, 0.5, 1.0, 2.0):
            cost = transport.squared_euclidean_cost(x, x + shift)
            costs.append(float(transport.sinkhorn_cost(cost)))
        # Identical clouds: tiny against the mean pairwise cost.
        self.assertLess(
            costs[0], 1e-3 * float(np.mean(ops.convert_to_numpy(cost)))
        )
        self.assertTrue(np.all(np.diff(costs) > 0), costs)

    def test_non_finite_masked_costs_have_no_influence(self):
        x, y = clouds(6, 6, 5)
        cost = ops.convert_to_numpy(transport.squared_euclidean_cost(x, y))
        row_mask = np.array([1, 1, 0, 1, 1, 0], bool)
        col_mask = np.array([1, 0, 1, 1, 1], bool)
        valid = row_mask[:, None] & col_mask[None, :]
        want = transport.sinkhorn_cost(cost, 0.05, 30, row_mask, col_mask)
        for fill in (np.inf, np.nan):
            bad = np.where(valid, cost, fill).astype("float32")
            got = transport.sinkhorn_cost(bad, 0.05, 30, row_mask, col_mask)
            self.assertAllClose(got, want, atol=1e-6, msg=f"{fill}")

    @parameterized.named_parameters(
        ("epsilon", {"epsilon": 0.0}, "epsilon"),
        ("epsilon_nan", {"epsilon": float("nan")}, "epsilon"),
        ("epsilon_inf", {"epsilon": float("inf")}, "epsilon"),
        # float32 lost the plan's marginals: it summed to 2e6 at 1e-10.
        ("epsilon_tiny", {"epsilon": 1e-7}, r"`epsilon` must be .*>= 1e-06"),
        ("iterations", {"iterations": 0}, "iterations"),
        ("iterations_float", {"iterations": 2.5}, "iterations"),
        # `"false"` normalized the cost (a truthy string).
        (
            "normalize_cost_string",
            {"normalize_cost": "false"},
            r"`normalize_cost` must be a bool\. Received: normalize_cost=",
        ),
        ("normalize_cost_int", {"normalize_cost": 0}, "`normalize_cost`"),
    )
    def test_invalid_arguments(self, kwargs, name):
        with self.assertRaisesRegex(ValueError, name):
            transport.sinkhorn_plan(np.zeros((2, 2), "float32"), **kwargs)

    def test_smallest_epsilon_keeps_the_marginals(self):
        # The column marginals are exact in exact arithmetic; at the
        # floor float32 keeps them within 1% (5% at 1e-7, now refused).
        x, y = clouds(0, 8, 7, shift=0.5)
        cost = transport.squared_euclidean_cost(x, y)
        plan = ops.convert_to_numpy(
            transport.sinkhorn_plan(cost, transport.MIN_EPSILON)
        )
        self.assertAllClose(plan.sum(0), np.full(7, 1 / 7), rtol=0.02)
        self.assertAllClose(plan.sum(), 1.0, atol=0.01)

    def test_epsilon_floor_is_in_units_of_the_normalized_cost(self):
        # A raw cost sets its own scale: 1e-9 on a cost of size 1e-8 is
        # the normalized 0.1, and its plan was exact before the floor.
        x, y = clouds(0, 8, 7, shift=0.5)
        cost = ops.convert_to_numpy(transport.squared_euclidean_cost(x, y))
        tiny = cost * 1e-8
        got = transport.sinkhorn_plan(tiny, 1e-9, normalize_cost=False)
        want = transport.sinkhorn_plan(cost, 1e-9 / float(tiny.max()))
        self.assertAllClose(got, want, atol=1e-6)
        with self.assertRaisesRegex(ValueError, "`epsilon` must be"):
            transport.sinkhorn_plan(tiny, 1e-9)

    def test_numpy_scalar_arguments(self):
        x, y = clouds(7, 4, 5)
        cost = transport.squared_euclidean_cost(x, y)
        got = transport.sinkhorn_plan(cost, np.float32(0.05), np.int64(12))
        want = transport.sinkhorn_plan(cost, 0.05, 12)
        self.assertAllClose(got, want)

    def test_eager_jax_calls_reuse_the_compiled_loops(self):
        # The Sinkhorn loops' bodies were closures made per call: eager
        # JAX recompiled both loops at every call (0.3 s for a 6 x 5 cost).
        if keras.config.backend() != "jax":
            self.skipTest("JAX compiles each eager loop")
        import jax.monitoring

        # Programs compiled, or read from a persistent compilation cache
        # (CI shares one between its processes).
        compiles = []

        def on_compile(event, duration, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration":
                compiles.append(event)

        def on_cache_hit(event, **kwargs):
            if event == "/jax/compilation_cache/cache_hits":
                compiles.append(event)

        x, y = clouds(8, 6, 5)
        cost = transport.squared_euclidean_cost(x, y)
        mask = np.array([True] * 4 + [False])
        # 26 iterations: two 10-iteration blocks and a last one of 5.
        first = transport.sinkhorn_plan(cost, iterations=26, col_mask=mask)
        other = ops.convert_to_tensor(ops.convert_to_numpy(cost))
        jax.monitoring.register_event_duration_secs_listener(on_compile)
        jax.monitoring.register_event_listener(on_cache_hit)
        try:
            second = transport.sinkhorn_plan(
                other, iterations=26, col_mask=mask
            )
            ops.convert_to_numpy(second)
            repeat = len(compiles)
            # A shape no other test uses, so not compiled in this process.
            x, y = clouds(9, 11, 3)
            odd = transport.squared_euclidean_cost(x, y)
            transport.sinkhorn_plan(odd, iterations=27)
        finally:
            jax.monitoring.unregister_event_duration_listener(on_compile)
            jax.monitoring.unregister_event_listener(on_cache_hit)
        self.assertEqual(repeat, 0)
        # The listeners see compiles: a new shape compiles.
        self.assertGreater(len(compiles), 0)
        self.assertAllClose(second, first, atol=1e-6)


class ConditionalTransportTest(TestCase):
    def test_plans_match_numpy_and_are_conditionals(self):
        rng = np.random.default_rng(0)
        logits = rng.normal(size=(3, 5, 7)).astype("float32")
        row_mask = np.arange(5)[None] < np.array([5, 3, 1])[:, None]
        col_mask = np.arange(7)[None] < np.array([7, 2, 4])[:, None]
        forward, backward = transport.conditional_transport_plans(
            logits, row_mask, col_mask
        )
        forward = ops.convert_to_numpy(forward)
        backward = ops.convert_to_numpy(backward)
        for b in range(3):
            sub = logits[b][row_mask[b]][:, col_mask[b]]
            f = np.exp(sub - logsumexp(sub, axis=1, keepdims=True))
            g = np.exp(sub - logsumexp(sub, axis=0, keepdims=True))
            self.assertAllClose(forward[b][row_mask[b]][:, col_mask[b]], f)
            self.assertAllClose(backward[b][row_mask[b]][:, col_mask[b]], g)
        valid = row_mask[:, :, None] & col_mask[:, None, :]
        self.assertTrue(np.all(forward[~valid] == 0.0))
        self.assertTrue(np.all(backward[~valid] == 0.0))

    def test_cost_matches_numpy(self):
        rng = np.random.default_rng(1)
        cost = rng.uniform(size=(4, 6)).astype("float32")
        logits = rng.normal(size=(4, 6)).astype("float32")
        want = np_conditional_transport(cost, logits, rho=0.3)
        got = transport.conditional_transport_cost(cost, logits, rho=0.3)
        self.assertAllClose(got, want, atol=1e-6)

    def test_masked_cost_matches_numpy_on_the_valid_block(self):
        # Uniform marginals over the valid points only: 1/3 and 1/4 here.
        cost, logits, row_mask, col_mask = masked_ct_inputs(3)
        c = cost[row_mask][:, col_mask]
        z = logits[row_mask][:, col_mask]
        want = np_conditional_transport(c, z, rho=0.3)
        got = transport.conditional_transport_cost(
            cost, logits, row_mask, col_mask, rho=0.3
        )
        self.assertAllClose(got, want, atol=1e-6)

    def test_masked_plans_and_cost_with_logits_below_any_fill(self):
        # Valid logits near -2e9: a finite fill for the masked pairs
        # (-1e9) became each line's maximum and the valid weights
        # underflowed to 0 (row sums 0, the cost about halved).
        cost, logits, row_mask, col_mask = masked_ct_inputs(4)
        low = logits * 10.0 - 2e9
        forward, backward = transport.conditional_transport_plans(
            low, row_mask, col_mask
        )
        forward = ops.convert_to_numpy(forward)
        backward = ops.convert_to_numpy(backward)
        self.assertAllClose(forward[row_mask].sum(-1), np.ones(3))
        self.assertAllClose(backward[:, col_mask].sum(0), np.ones(4))
        c = cost[row_mask][:, col_mask]
        z = low.astype("float64")[row_mask][:, col_mask]
        want = np_conditional_transport(c, z, rho=0.5)
        got = transport.conditional_transport_cost(
            cost, low, row_mask, col_mask
        )
        self.assertAllClose(got, want, atol=1e-5)
        unpadded = transport.conditional_transport_cost(
            c, low[row_mask][:, col_mask]
        )
        self.assertAllClose(got, unpadded, atol=1e-6)

    def test_cosine_cost_range(self):
        x, y = clouds(2, 4, 5)
        cost = ops.convert_to_numpy(transport.cosine_cost(x, y))
        xn = x / np.linalg.norm(x, axis=-1, keepdims=True)
        yn = y / np.linalg.norm(y, axis=-1, keepdims=True)
        self.assertAllClose(cost, 1 - xn @ yn.T, atol=1e-6)

    def test_non_finite_masked_costs_have_no_influence(self):
        cost, logits, row_mask, col_mask = masked_ct_inputs(2)
        valid = row_mask[:, None] & col_mask[None, :]
        want = transport.conditional_transport_cost(
            cost, logits, row_mask, col_mask
        )
        for fill in (np.inf, np.nan):
            got = transport.conditional_transport_cost(
                np.where(valid, cost, fill).astype("float32"),
                np.where(valid, logits, fill).astype("float32"),
                row_mask,
                col_mask,
            )
            self.assertAllClose(got, want, atol=1e-6, msg=f"{fill}")

    def test_invalid_rho(self):
        with self.assertRaisesRegex(ValueError, "rho"):
            transport.conditional_transport_cost(
                np.zeros((2, 2)), np.zeros((2, 2)), rho=1.5
            )
        # NumPy scalars are floats too.
        got = transport.conditional_transport_cost(
            np.ones((2, 2), "float32"), np.zeros((2, 2)), rho=np.float32(0.3)
        )
        self.assertAllClose(got, 1.0)


class GaussianMMDTest(TestCase):
    @parameterized.parameters(1.0, 2.5)
    def test_matches_numpy(self, bandwidth):
        x, y = clouds(0, 5, 7, shift=0.7)
        got = transport.gaussian_mmd(x, y, bandwidth=bandwidth)
        self.assertAllClose(got, numpy_mmd(x, y, bandwidth), atol=1e-6)

    def test_zero_for_identical_and_grows_with_separation(self):
        x, _ = clouds(1, 8, 1)
        values = [
            float(transport.gaussian_mmd(x, x + shift))
            for shift in (0.0, 0.3, 1.0, 3.0)
        ]
        self.assertLess(abs(values[0]), 1e-6)
        self.assertTrue(np.all(np.diff(values) > 0), values)

    def test_masked_points_have_no_influence(self):
        x, y = clouds(2, 6, 5)
        x_mask = np.array([1, 1, 1, 0, 1, 0], bool)
        y_mask = np.array([1, 0, 1, 1, 1], bool)
        got = transport.gaussian_mmd(x, y, x_mask, y_mask)
        self.assertAllClose(got, numpy_mmd(x[x_mask], y[y_mask]), atol=1e-6)
        x2 = np.where(x_mask[:, None], x, 1e3).astype("float32")
        again = transport.gaussian_mmd(x2, y, x_mask, y_mask)
        self.assertAllClose(again, got, atol=1e-7)
        # Masked points may hold anything, non-finite values included.
        for fill in (np.inf, np.nan, 1e30):
            x3 = np.where(x_mask[:, None], x, fill).astype("float32")
            y3 = np.where(y_mask[:, None], y, -fill).astype("float32")
            again = transport.gaussian_mmd(x3, y3, x_mask, y_mask)
            self.assertAllClose(again, got, atol=1e-7, msg=f"{fill}")

    def test_empty_cloud_gives_zero(self):
        x, y = clouds(3, 4, 4)
        got = transport.gaussian_mmd(x, y, x_mask=np.zeros(4, bool))
        self.assertAllClose(got, 0.0)

    @parameterized.parameters(-1.0, float("nan"), float("inf"), "1")
    def test_invalid_bandwidth(self, bandwidth):
        with self.assertRaisesRegex(ValueError, "bandwidth"):
            transport.gaussian_mmd(
                np.zeros((2, 2)), np.zeros((2, 2)), None, None, bandwidth
            )

    def test_numpy_scalar_bandwidth(self):
        x, y = clouds(4, 5, 7, shift=0.7)
        got = transport.gaussian_mmd(x, y, bandwidth=np.float32(2.5))
        self.assertAllClose(got, numpy_mmd(x, y, 2.5), atol=1e-6)


class FarFromOriginTest(TestCase):
    """Clouds with a small spread far from the origin: the expansion
    `|x|^2 + |y|^2 - 2 x.y` lost their distances (86-162% off at an
    offset of 100, some exactly 0) before the clouds were centered."""

    def spread_clouds(self, offset):
        rng = np.random.default_rng(0)
        x = 0.05 * rng.normal(size=(8, 64))
        y = 0.05 * rng.normal(size=(9, 64))
        return (x + offset).astype("float32"), (y + offset).astype("float32")

    def test_squared_euclidean_cost_matches_numpy_at_an_offset(self):
        x, y = self.spread_clouds(100.0)
        want = ((x[:, None].astype("float64") - y[None]) ** 2).sum(-1)
        got = transport.squared_euclidean_cost(x, y)
        self.assertAllClose(got, want, rtol=1e-4, atol=0)

    def test_gaussian_mmd_does_not_move_with_the_offset(self):
        x, y = self.spread_clouds(100.0)
        x_mask = np.arange(8) < 6
        x[~x_mask] = np.inf
        far = transport.gaussian_mmd(x, y, x_mask, bandwidth=0.3)
        x0, y0 = self.spread_clouds(0.0)
        near = transport.gaussian_mmd(x0[:6], y0, bandwidth=0.3)
        self.assertAllClose(far, near, rtol=1e-3, atol=0)
        self.assertAllClose(
            far, numpy_mmd(x[:6].astype("float64"), y, 0.3), rtol=1e-3, atol=0
        )

    def test_gaussian_mmd_of_one_pair_of_clouds_is_float32_under_float64(self):
        # PyTorch's `where` promoted the 0-d result with a Python 0.0 to
        # floatx.
        x, y = clouds(5, 4, 3, dim=3, shift=1.0)
        previous = keras.config.floatx()
        keras.config.set_floatx("float64")
        try:
            got = transport.gaussian_mmd(x, y)
        finally:
            keras.config.set_floatx(previous)
        self.assertEqual(keras.backend.standardize_dtype(got.dtype), "float32")
        self.assertAllClose(got, numpy_mmd(x, y), atol=1e-6)


# Contracts a mutation sweep found untested (each test fails on the
# mutation named in its comment).
class SinkhornContractsTest(TestCase):
    def test_each_iteration_count_matches_numpy_before_convergence(self):
        # One iteration too few (or too many) survived: the only exact
        # count test ran 20 iterations at epsilon 0.05, converged already.
        x, y = clouds(7, 6, 5)
        cost = ops.convert_to_numpy(transport.squared_euclidean_cost(x, y))
        for iterations in (1, 2, 3, 12):
            got = transport.sinkhorn_plan(cost, 0.01, iterations)
            want = numpy_sinkhorn(cost.astype("float64"), 0.01, iterations)
            self.assertAllClose(got, want, atol=1e-5, msg=f"{iterations}")

    def test_negative_costs_are_normalized_by_their_magnitude(self):
        # The scale is max |cost|: without `abs`, an all-negative cost
        # (negated similarities) hit the 1e-12 floor and the plan summed
        # to about 1e19.
        rng = np.random.default_rng(0)
        cost = -rng.uniform(0.5, 1.0, (5, 6)).astype("float32")
        plan = ops.convert_to_numpy(transport.sinkhorn_plan(cost))
        self.assertAllClose(plan.sum(), 1.0, atol=1e-3)
        self.assertAllClose(plan.sum(1), np.full(5, 1 / 5), atol=1e-3)
        self.assertAllClose(plan.sum(0), np.full(6, 1 / 6), atol=1e-3)

    def test_cost_scale_is_a_constant_for_the_gradient(self):
        # The documented gradient: the plan of `cost / s` with `s` the
        # (stopped) max |cost|. Without `stop_gradient` the entry holding
        # the maximum got a gradient through `s` too.
        rng = np.random.default_rng(1)
        cost = rng.uniform(size=(4, 5)).astype("float32")
        upstream = rng.normal(size=(4, 5)).astype("float32")
        scale = float(np.abs(cost).max())

        def normalized(c):
            return transport.sinkhorn_plan(c, 0.1, 30)

        def by_hand(c):
            return transport.sinkhorn_plan(
                c / scale, 0.1, 30, normalize_cost=False
            )

        (got,) = gradients(normalized, upstream, cost)
        (want,) = gradients(by_hand, upstream, cost)
        self.assertAllClose(got, want, atol=1e-5)

    def test_fused_kernel_flag_ignores_whitespace(self):
        # A value read from a file ends in a newline.
        for flag, want in ((" off\n", False), ("0\n", False), (" 1 ", True)):
            with mock.patch.dict(
                os.environ, {"KERAS_ATTNVARIANTS_FUSED_SINKHORN": flag}
            ):
                self.assertEqual(fused_sinkhorn.enabled(), want, msg=flag)


class NonNegativeTest(TestCase):
    def test_squared_euclidean_cost_of_wide_clouds_is_never_negative(self):
        # `|x|^2 + |y|^2 - 2 x.y` rounds below 0 on the diagonal (-0.004
        # for these points without the clamp).
        x = (30.0 * np.random.default_rng(2).normal(size=(64, 16))).astype(
            "float32"
        )
        cost = ops.convert_to_numpy(transport.squared_euclidean_cost(x, x))
        self.assertGreaterEqual(cost.min(), 0.0)

    def test_gaussian_mmd_of_near_identical_clouds_is_never_negative(self):
        for seed in range(20):
            x = np.random.default_rng(seed).normal(size=(2, 33, 8))
            x = x.astype("float32")
            got = ops.convert_to_numpy(transport.gaussian_mmd(x, x + 1e-4))
            self.assertGreaterEqual(got.min(), 0.0, msg=f"seed {seed}")


class GaussianMMDEmptyCloudTest(TestCase):
    def test_either_empty_cloud_gives_zero(self):
        # The "present" check read only `x`: an empty `y` gave 0.48.
        x, y = clouds(3, 4, 5, dim=3, shift=1.0)
        for kwargs in (
            {"y_mask": np.zeros(5, bool)},
            {"x_mask": np.zeros(4, bool)},
            {"x_mask": np.ones(4, bool), "y_mask": np.zeros(5, bool)},
        ):
            got = transport.gaussian_mmd(x, y, **kwargs)
            self.assertAllClose(got, 0.0, msg=str(kwargs))


class LeadingAxesTest(TestCase):
    def test_clouds_whose_leading_axes_do_not_broadcast_raise(self):
        # They failed in a backend op (TF's InvalidArgumentError).
        rng = np.random.default_rng(4)
        x = rng.normal(size=(2, 5, 3)).astype("float32")
        y = rng.normal(size=(3, 4, 3)).astype("float32")
        for fn in (
            transport.gaussian_mmd,
            transport.squared_euclidean_cost,
            transport.cosine_cost,
        ):
            with self.assertRaisesRegex(
                ValueError, r"leading axes.*Received: y with shape \(3, 4, 3\)"
            ):
                fn(x, y)
        # Broadcasting leading axes still work.
        got = transport.squared_euclidean_cost(x, y[:1])
        self.assertEqual(tuple(got.shape), (2, 5, 4))
