"""The fused Sinkhorn kernel (JAX, Pallas on Triton).

On the CPU the kernel runs through Pallas' interpreter and must match the
generic iterations of `transport.sinkhorn_plan`; the dispatch is checked
on programs lowered for CUDA without a GPU (`jax.export`). The tests of
the compiled kernel run where JAX has a GPU.
"""

import os
import re
from unittest import mock

import keras
import numpy as np
import pytest
from absl.testing import parameterized

from keras_attnvariants.ops import fused_sinkhorn
from keras_attnvariants.ops import transport
from keras_attnvariants.ops.masking import MASK_FILL
from keras_attnvariants.testing.test_case import TestCase

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "jax", reason="a JAX (Pallas) kernel"
)

# The custom call target of a Pallas kernel lowered for CUDA.
TRITON_CALL = "__gpu$xla.gpu.triton"


def log_kernel_and_masks(seed, shape, drop=0.25, epsilon=0.01):
    """A normalized `-cost / epsilon` `(..., n, m)` with masked pairs at
    `MASK_FILL`, and the row and column masks (each set keeps a point)."""
    rng = np.random.default_rng(seed)
    *batch, n, m = shape
    cost = rng.uniform(size=shape).astype("float32")
    rows = rng.uniform(size=(*batch, n)) > drop
    cols = rng.uniform(size=(*batch, m)) > drop
    rows[..., 0] = True
    cols[..., -1] = True
    valid = rows[..., :, None] & cols[..., None, :]
    cost = cost / np.max(np.where(valid, cost, 0.0), (-2, -1), keepdims=True)
    log_kernel = np.where(valid, -cost / epsilon, MASK_FILL)
    return log_kernel.astype("float32"), rows, cols, valid


def plan_of(log_kernel, u, v, valid):
    u, v = np.asarray(u), np.asarray(v)
    plan = np.exp(log_kernel + u[..., :, None] + v[..., None, :])
    return np.where(valid, plan, 0.0)


def lowered_program(fn, *args, platform="cuda"):
    """`fn` jitted and lowered for `platform` (no such device needed), as
    MLIR text."""
    import jax
    from jax import export

    # A fresh function each time: `jax.jit` caches traces by function, and
    # the tests change what tracing reads (the environment variable).
    exported = export.export(
        jax.jit(lambda *args: fn(*args)),
        platforms=[platform],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON_CALL)],
    )(*args)
    return exported.mlir_module()


def holds_kernel(program):
    """Whether a lowered program calls a Pallas/Triton kernel (a bool, so
    that a failing assertion does not print the whole program)."""
    return TRITON_CALL in program


def ot_cost(q, k, q_mask, k_mask):
    cost = transport.squared_euclidean_cost(q, k)
    return transport.sinkhorn_cost(cost, 0.01, 100, q_mask, k_mask)


def gpu_available():
    import jax

    return jax.default_backend() == "gpu"


class FusedSinkhornInterpretTest(TestCase):
    @parameterized.parameters(
        ((3, 7, 5), 1),
        ((3, 7, 5), 11),
        ((2, 16, 16), 100),
        ((2, 2, 33, 20), 100),
        ((1, 40, 64), 37),
    )
    def test_potentials_match_generic_iterations(self, shape, iterations):
        log_kernel, rows, cols, valid = log_kernel_and_masks(0, shape)
        generic = transport._potentials(log_kernel, rows, cols, iterations)
        fused = fused_sinkhorn.potentials(
            log_kernel,
            rows,
            cols,
            iterations,
            transport._ABSORB_EVERY,
            MASK_FILL,
            interpret=True,
        )
        want = plan_of(log_kernel, *generic, valid)
        got = plan_of(log_kernel, *fused, valid)
        self.assertEqual(got.shape, shape)
        self.assertAllClose(got, want, atol=1e-6, rtol=1e-4)
        # And a transport plan: its valid entries sum to 1.
        self.assertAllClose(got.sum((-2, -1)), np.ones(shape[:-2]), atol=1e-5)

    def test_empty_row_set_gives_zero_plan_not_nan(self):
        log_kernel, rows, cols, valid = log_kernel_and_masks(1, (2, 6, 5))
        rows[1] = False
        valid = rows[..., :, None] & cols[..., None, :]
        log_kernel = np.where(valid, log_kernel, MASK_FILL)
        u, v = fused_sinkhorn.potentials(
            log_kernel, rows, cols, 20, 10, MASK_FILL, interpret=True
        )
        plan = plan_of(log_kernel, u, v, valid)
        self.assertTrue(np.all(np.isfinite(plan)))
        self.assertAllClose(plan[1], np.zeros((6, 5)))
        self.assertAllClose(plan[0].sum(), 1.0, atol=1e-5)

    def test_padded_sizes_and_fit(self):
        self.assertEqual(fused_sinkhorn.padded_size(1), 16)
        self.assertEqual(fused_sinkhorn.padded_size(16), 16)
        self.assertEqual(fused_sinkhorn.padded_size(17), 32)
        self.assertEqual(fused_sinkhorn.padded_size(128), 128)
        self.assertTrue(fused_sinkhorn.fits(128, 256))
        self.assertTrue(fused_sinkhorn.fits(100, 200))
        self.assertFalse(fused_sinkhorn.fits(256, 256))
        self.assertFalse(fused_sinkhorn.fits(0, 8))
        self.assertFalse(fused_sinkhorn.fits(None, 8))


class FusedSinkhornDispatchTest(TestCase):
    """Which kernel a program lowered for CUDA holds."""

    def args(self, n=24, m=20):
        log_kernel, rows, cols, _ = log_kernel_and_masks(2, (2, 3, n, m))
        q = np.random.default_rng(3).normal(size=(2, 3, n, 8))
        k = np.random.default_rng(4).normal(size=(2, 3, m, 8))
        return q.astype("float32"), k.astype("float32"), rows, cols

    def test_sinkhorn_cost_runs_the_fused_kernel_on_cuda(self):
        self.assertTrue(holds_kernel(lowered_program(ot_cost, *self.args())))

    def test_environment_variable_turns_it_off(self):
        env = {"KERAS_ATTNVARIANTS_FUSED_SINKHORN": "0"}
        with mock.patch.dict(os.environ, env):
            program = lowered_program(ot_cost, *self.args())
        self.assertFalse(holds_kernel(program))

    def test_matrices_too_large_for_the_chip_take_the_generic_path(self):
        program = lowered_program(ot_cost, *self.args(n=200, m=300))
        self.assertFalse(holds_kernel(program))

    def test_smallest_epsilon_takes_the_kernel_and_below_is_refused(self):
        # Below 1e-6 `-cost / epsilon` could reach the padding fill; such
        # an `epsilon` is refused (float32 lost the plan's marginals).
        def cost_at(epsilon):
            def fn(q, k, q_mask, k_mask):
                cost = transport.squared_euclidean_cost(q, k)
                return transport.sinkhorn_cost(
                    cost, epsilon, 100, q_mask, k_mask
                )

            return fn

        args = self.args()
        self.assertTrue(holds_kernel(lowered_program(cost_at(1e-6), *args)))
        with self.assertRaisesRegex(ValueError, "`epsilon` must be"):
            lowered_program(cost_at(1e-7), *args)

    def test_differentiable_plan_keeps_the_generic_path(self):
        # `sinkhorn_plan` differentiates through its iterations; the
        # kernel has no autodiff rule.
        def plan(q, k, q_mask, k_mask):
            cost = transport.squared_euclidean_cost(q, k)
            return transport.sinkhorn_plan(cost, 0.01, 100, q_mask, k_mask)

        self.assertFalse(holds_kernel(lowered_program(plan, *self.args())))

    def test_cpu_program_runs_the_generic_path(self):
        program = lowered_program(ot_cost, *self.args(), platform="cpu")
        self.assertFalse(holds_kernel(program))
        self.assertNotIn("pallas", program)


@pytest.mark.skipif(
    keras.config.backend() != "jax" or not gpu_available(),
    reason="needs JAX on a GPU",
)
class FusedSinkhornGpuTest(TestCase):
    """The compiled Triton kernel against the generic path, on a GPU."""

    @parameterized.parameters((24, 20), (128, 128), (77, 200))
    def test_cost_and_gradients_match_generic_path(self, n, m):
        import jax

        _, rows, cols, _ = log_kernel_and_masks(5, (4, 2, n, m))
        rng = np.random.default_rng(6)
        q = rng.normal(size=(4, 2, n, 16)).astype("float32")
        k = (rng.normal(size=(4, 2, m, 16)) + 0.5).astype("float32")
        grad = jax.jit(
            jax.value_and_grad(
                lambda q, k: ot_cost(q, k, rows, cols).sum(), argnums=(0, 1)
            )
        )
        value, (dq, dk) = grad(q, k)
        program = jax.jit(ot_cost).lower(q, k, rows, cols).as_text()
        self.assertTrue(holds_kernel(program))
        env = {"KERAS_ATTNVARIANTS_FUSED_SINKHORN": "0"}
        with mock.patch.dict(os.environ, env):
            generic = jax.jit(
                jax.value_and_grad(
                    lambda q, k: ot_cost(q, k, rows, cols).sum(),
                    argnums=(0, 1),
                )
            )
            want, (want_dq, want_dk) = generic(q, k)
        self.assertAllClose(value, want, rtol=1e-4)
        self.assertAllClose(dq, want_dq, atol=1e-5, rtol=1e-3)
        self.assertAllClose(dk, want_dk, atol=1e-5, rtol=1e-3)


# Pinned after a mutation review (2026-12-02): the off switch in any
# case, `fits` on empty or unknown sides, the Triton launch parameters and
# the arguments `sinkhorn_cost` passes (read from the program lowered for
# CUDA, no GPU needed), finite potentials on masked points.


def compiler_params(program):
    """`{name: value}` of the Triton call's `num_warps` / `num_stages`."""
    return {
        key: int(value)
        for key, value in re.findall(r"(num_warps|num_stages) = (\d+)", program)
    }


class FusedSinkhornSwitchTest(TestCase):
    def test_every_documented_off_value_in_any_case_turns_it_off(self):
        for flag in ("0", "false", "off", "no", "FALSE", "Off", " No\n"):
            with mock.patch.dict(
                os.environ, {"KERAS_ATTNVARIANTS_FUSED_SINKHORN": flag}
            ):
                self.assertFalse(fused_sinkhorn.enabled(), msg=repr(flag))
        for flag in ("1", "true", "on", "yes"):
            with mock.patch.dict(
                os.environ, {"KERAS_ATTNVARIANTS_FUSED_SINKHORN": flag}
            ):
                self.assertTrue(fused_sinkhorn.enabled(), msg=repr(flag))

    def test_fits_rejects_an_empty_or_unknown_side_either_way(self):
        self.assertTrue(fused_sinkhorn.fits(1, 1))
        for n, m in ((8, 0), (0, 0), (8, -1), (-1, 8), (8, None), (None, None)):
            self.assertFalse(fused_sinkhorn.fits(n, m), msg=(n, m))

    def test_warps_grow_with_the_padded_matrix(self):
        # About 32 entries per thread, between 4 and 16 warps.
        for elements, want in (
            (16 * 16, 4),
            (64 * 64, 4),
            (64 * 128, 8),
            (128 * 128, 16),
            (128 * 256, 16),
        ):
            self.assertEqual(fused_sinkhorn._num_warps(elements), want)


class FusedSinkhornLoweringTest(TestCase):
    """What the CUDA program's Triton call is given."""

    args = FusedSinkhornDispatchTest.args

    def test_compiler_params_follow_the_padded_size(self):
        # 24 x 20 pads to 32 x 32; 100 x 200 to 128 x 256.
        for (n, m), warps in (((24, 20), 4), ((100, 200), 16)):
            program = lowered_program(ot_cost, *self.args(n=n, m=m))
            self.assertEqual(
                compiler_params(program),
                {"num_warps": warps, "num_stages": 1},
                msg=(n, m),
            )

    def test_sinkhorn_cost_passes_its_iterations_and_the_generic_constants(
        self,
    ):
        with mock.patch.object(
            fused_sinkhorn, "potentials", wraps=fused_sinkhorn.potentials
        ) as potentials:
            lowered_program(ot_cost, *self.args())
        potentials.assert_called_once()
        (log_kernel, rows, cols, *rest), kwargs = potentials.call_args
        self.assertEqual(
            tuple(rest) + tuple(kwargs.values()),
            (100, transport._ABSORB_EVERY, MASK_FILL),
        )
        self.assertEqual(tuple(log_kernel.shape), (2, 3, 24, 20))
        self.assertEqual(tuple(rows.shape), (2, 3, 24))
        self.assertEqual(tuple(cols.shape), (2, 3, 20))


class FusedSinkhornMaskedPotentialsTest(TestCase):
    def test_potentials_stay_finite_on_masked_and_padded_points(self):
        # As the generic path's: masked rows and columns keep scaling 1
        # (not a / mass = 0, whose log is -inf).
        from fused_sinkhorn_test import log_kernel_and_masks

        log_kernel, rows, cols, _ = log_kernel_and_masks(7, (2, 9, 6), 0.4)
        self.assertFalse(rows.all())
        self.assertFalse(cols.all())
        u, v = fused_sinkhorn.potentials(
            log_kernel, rows, cols, 25, 10, MASK_FILL, interpret=True
        )
        generic = transport._potentials(log_kernel, rows, cols, 25)
        for got, want in zip((u, v), generic):
            self.assertTrue(np.all(np.isfinite(np.asarray(want))))
            self.assertTrue(np.all(np.isfinite(np.asarray(got))))
