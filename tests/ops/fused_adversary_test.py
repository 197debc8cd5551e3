"""The fused adversary kernels of KQAlignment (JAX, Pallas on Triton).

On the CPU the kernels run through Pallas' interpreter: their values and
every gradient must match an independent `jax.numpy` MLP, and the GAN and
CT terms must give the same loss and gradients (queries, keys, every
weight) with and without them. Which program holds them is checked on
programs lowered for CUDA without a GPU; the compiled kernels are checked
where JAX has a GPU.
"""

import os
from unittest import mock

import keras
import numpy as np
import pytest
from absl.testing import parameterized

from keras_attnvariants.losses.kq_alignment import KQAlignment
from keras_attnvariants.ops import fused_adversary
from keras_attnvariants.testing.test_case import TestCase

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "jax", reason="a JAX (Pallas) kernel"
)

# The custom call target of a Pallas kernel lowered for CUDA.
TRITON_CALL = "__gpu$xla.gpu.triton"
OFF = {"KERAS_ATTNVARIANTS_FUSED_ADVERSARY": "0"}
ON = {"KERAS_ATTNVARIANTS_FUSED_ADVERSARY": "1"}


def gpu_available():
    import jax

    return jax.default_backend() == "gpu"


def reference_mlp(x, highway, dense_1, dense_2, navigator=None):
    """The adversary MLP written out in `jax.numpy` (autodiff reference)."""
    import jax
    import jax.numpy as jnp

    def leaky(z):
        return jnp.where(z >= 0, z, 0.2 * z)

    gate, gate_bias, transform, transform_bias = highway
    tau = jax.nn.sigmoid(x @ gate + gate_bias)
    y = tau * jax.nn.relu(x @ transform + transform_bias) + (1 - tau) * x
    out = leaky(y @ dense_1[0] + dense_1[1]) @ dense_2[0] + dense_2[1]
    if navigator is None:
        return out
    (n1, nb1), (n2, nb2) = navigator
    return out, leaky(x @ n1 + nb1) @ n2 + nb2


def random_weights(seed, dim, hidden, out_units, navigator):
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.normal(size=shape).astype("float32") * 0.3

    highway = (w(dim, dim), w(dim), w(dim, dim), w(dim))
    dense_1, dense_2 = (
        (w(dim, hidden), w(hidden)),
        (
            w(hidden, out_units),
            w(out_units),
        ),
    )
    nav = (
        ((w(dim, hidden), w(hidden)), (w(hidden, hidden), w(hidden)))
        if navigator
        else None
    )
    return highway, dense_1, dense_2, nav


def scalar_loss(mlp):
    """A loss of the MLP's outputs whose gradients differ per entry."""
    import jax.numpy as jnp

    def loss(x, highway, dense_1, dense_2, navigator):
        out = mlp(x, highway, dense_1, dense_2, navigator)
        if navigator is None:
            return jnp.sum(jnp.sin(out))
        return jnp.sum(jnp.sin(out[0])) + jnp.sum(jnp.cos(out[1]))

    return loss


class FusedMlpInterpretTest(TestCase):
    @parameterized.parameters(
        (16, 32, 1, False, 200),  # GAN's discriminator, 2 tiles, padded
        (16, 16, 1, False, 128),  # exactly one tile
        (16, 32, 32, True, 300),  # CT's critic and navigator
        (32, 16, 16, True, 5),  # fewer points than a tile
    )
    def test_values_and_gradients_match_jax_numpy(
        self, dim, hidden, out_units, navigator, points
    ):
        import jax

        weights = random_weights(0, dim, hidden, out_units, navigator)
        x = np.random.default_rng(1).normal(size=(points, dim))
        x = x.astype("float32")

        def fused(*args):
            return fused_adversary.mlp(*args, interpret=True)

        grad = jax.value_and_grad
        args = (x, *weights)
        got, got_grads = grad(scalar_loss(fused), range(5))(*args)
        want, want_grads = grad(scalar_loss(reference_mlp), range(5))(*args)
        self.assertAllClose(got, want, rtol=1e-5)
        leaves = jax.tree.leaves
        self.assertEqual(len(leaves(got_grads)), len(leaves(want_grads)))
        for g, w in zip(leaves(got_grads), leaves(want_grads)):
            self.assertEqual(g.shape, w.shape)
            scale = max(1.0, float(np.max(np.abs(w))))
            self.assertAllClose(g, w, atol=1e-5 * scale, rtol=1e-5)

    def test_fits(self):
        self.assertTrue(fused_adversary.fits(64, 64, 1))
        self.assertFalse(fused_adversary.fits(48, 64, 1))
        self.assertTrue(fused_adversary.fits(32, 64, 64))
        # 128 wide: never compiled, left to the generic path.
        self.assertFalse(fused_adversary.fits(64, 128, 128))
        self.assertFalse(fused_adversary.fits(64, 256, 1))
        self.assertFalse(fused_adversary.fits(64, 64, 32))
        self.assertFalse(fused_adversary.fits(None, 64, 1))


def projected(seed):
    """Queries (2, 6, 3, 16), keys (2, 7, 3, 16) and padding masks; the
    padded positions hold large values (they must not matter)."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(2, 6, 3, 16)).astype("float32")
    k = (rng.normal(size=(2, 7, 3, 16)) + 0.5).astype("float32")
    q_mask = np.arange(6)[None] < np.array([6, 4])[:, None]
    k_mask = np.arange(7)[None] < np.array([7, 3])[:, None]
    q[1, 4:] = 1e3
    k[1, 3:] = -1e3
    return q, k, q_mask, k_mask


def loss_and_grads(term, q, k, q_mask, k_mask, jit=False):
    """The term's value and its gradients with respect to `q`, `k` and
    every trainable weight (JAX, stateless; compiled with `jit`)."""
    import jax

    variables = term.trainable_variables

    def value(q, k, values):
        mapping = list(zip(variables, values))
        with keras.StatelessScope(state_mapping=mapping):
            return term(q, k, q_mask, k_mask)

    grad = jax.value_and_grad(value, (0, 1, 2))
    out, grads = (jax.jit(grad) if jit else grad)(
        q, k, [v.value for v in variables]
    )
    return float(out), jax.tree.leaves(grads)


def built_term(method, seed=0, **kwargs):
    term = KQAlignment(method=method, weight=1.0, **kwargs)
    q, k, q_mask, k_mask = projected(seed)
    term(q, k, q_mask, k_mask)
    rng = np.random.default_rng(seed + 10)
    for w in term.weights:
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.5)
    return term


def with_relu_ties(term, inputs):
    """`inputs` with zero (valid) points, and the term's highway transform
    bias zeroed: the transform is exactly 0 there, where the relu's
    gradient convention (0) decides the points' gradients."""
    q, k, q_mask, k_mask = (np.array(t) for t in inputs)
    q[0, 1] = 0.0
    k[0, 2] = 0.0
    for w in term.weights:
        if "transform" in w.path and "bias" in w.path:
            w.assign(np.zeros(w.shape, "float32"))
    return q, k, q_mask, k_mask


def forced_on_gpu():
    """The fused path turned on as if on an NVIDIA GPU, and the kernels
    interpreted (two context managers: the second is optional)."""
    gpu = mock.patch.object(fused_adversary, "on_nvidia_gpu", lambda: True)
    on = mock.patch.dict(os.environ, ON)

    class Both:
        def __enter__(self):
            gpu.__enter__()
            on.__enter__()

        def __exit__(self, *exc):
            on.__exit__(*exc)
            gpu.__exit__(*exc)

    return Both(), mock.patch.object(fused_adversary, "INTERPRET", True)


class FusedKQAlignmentTest(TestCase):
    @parameterized.parameters(
        ("gan", {}),
        ("gan", {"gan_loss": "non_saturating"}),
        ("gan", {"hidden_dim": 32}),
        ("ct", {}),
        ("ct", {"rho": 0.2, "hidden_dim": 32}),
    )
    def test_same_loss_and_gradients_as_the_generic_path(self, method, kw):
        term = built_term(method, **kw)
        inputs = with_relu_ties(term, projected(1))
        want, want_grads = loss_and_grads(term, *inputs)
        gpu, interpret = forced_on_gpu()
        with gpu, interpret:
            self.assertTrue(term._fuses_adversary(16))
            got, got_grads = loss_and_grads(term, *inputs)
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
        self.assertLen(got_grads, len(want_grads))
        for g, w in zip(got_grads, want_grads):
            scale = max(1.0, float(np.max(np.abs(w))))
            self.assertAllClose(g, w, atol=2e-5 * scale, rtol=1e-4)
        # The padded queries and keys get no gradient.
        self.assertAllClose(got_grads[0][1, 4:], np.zeros((2, 3, 16)))
        self.assertAllClose(got_grads[1][1, 3:], np.zeros((4, 3, 16)))

    def test_dispatch(self):
        gpu, _ = forced_on_gpu()
        shared, ct = built_term("gan"), built_term("ct")
        per_head = built_term("gan", adversary_per_head=True)
        # Off by default, on a GPU too (its speed is not measured yet).
        self.assertFalse(shared._fuses_adversary(16))
        with mock.patch.dict(os.environ, ON):
            self.assertEqual(shared._fuses_adversary(16), gpu_available())
        with gpu:
            self.assertTrue(shared._fuses_adversary(16))
            self.assertTrue(ct._fuses_adversary(16))
            # Not a power of two, or one adversary per head: generic.
            self.assertFalse(shared._fuses_adversary(24))
            self.assertFalse(per_head._fuses_adversary(16))
            with mock.patch.dict(os.environ, OFF):
                self.assertFalse(shared._fuses_adversary(16))

    @parameterized.parameters("gan", "ct")
    def test_training_step_lowered_for_cuda_holds_the_kernels(self, method):
        import jax
        from jax import export

        term = built_term(method)
        q, k, q_mask, k_mask = projected(2)
        variables = term.trainable_variables

        def step(q, k, values):
            def value(q, k, values):
                mapping = list(zip(variables, values))
                with keras.StatelessScope(state_mapping=mapping):
                    return term(q, k, q_mask, k_mask)

            return jax.grad(value, (0, 1, 2))(q, k, values)

        def lowered(platform="cuda"):
            exported = export.export(
                jax.jit(lambda *a: step(*a)),
                platforms=[platform],
                disabled_checks=[
                    export.DisabledSafetyCheck.custom_call(TRITON_CALL)
                ],
            )(q, k, [v.value for v in variables])
            return exported.mlir_module()

        gpu, _ = forced_on_gpu()
        with gpu:
            program = lowered()
        # The forward and the backward kernel, for each cloud.
        self.assertEqual(program.count(TRITON_CALL), 4)
        with gpu, mock.patch.dict(os.environ, OFF):
            self.assertFalse(TRITON_CALL in lowered())
        # Traced on a GPU host but compiled for its CPU (the benchmarks'
        # FLOP count): XLA ops, no kernel.
        with gpu:
            self.assertFalse(TRITON_CALL in lowered("cpu"))

    @parameterized.parameters("gan", "ct")
    def test_gpu_traced_step_compiled_for_cpu_matches(self, method):
        # The custom gradient's XLA branch (what a CPU compile of a step
        # traced on a GPU host runs), compiled, against the plain path.
        term = built_term(method)
        inputs = with_relu_ties(term, projected(4))
        want, want_grads = loss_and_grads(term, *inputs)
        gpu, _ = forced_on_gpu()
        with gpu:
            self.assertTrue(term._fuses_adversary(16))
            got, got_grads = loss_and_grads(term, *inputs, jit=True)
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
        for g, w in zip(got_grads, want_grads):
            scale = max(1.0, float(np.max(np.abs(w))))
            self.assertAllClose(g, w, atol=2e-5 * scale, rtol=1e-4)


@pytest.mark.skipif(
    keras.config.backend() != "jax" or not gpu_available(),
    reason="needs JAX on a GPU",
)
class FusedAdversaryGpuTest(TestCase):
    """The compiled kernels against the generic path, on a GPU."""

    @parameterized.parameters(
        ("gan", {}),
        ("gan", {"gan_loss": "non_saturating"}),
        ("ct", {}),
    )
    def test_same_loss_and_gradients_as_the_generic_path(self, method, kw):
        term = built_term(method, **kw)
        inputs = projected(3)
        with mock.patch.dict(os.environ, ON):
            self.assertTrue(term._fuses_adversary(16))
            got, got_grads = loss_and_grads(term, *inputs)
        with mock.patch.dict(os.environ, OFF):
            want, want_grads = loss_and_grads(term, *inputs)
        self.assertAllClose(got, want, rtol=1e-4, atol=1e-5)
        for g, w in zip(got_grads, want_grads):
            scale = max(1.0, float(np.max(np.abs(w))))
            self.assertAllClose(g, w, atol=1e-4 * scale, rtol=1e-3)

    def test_large_cloud_matches_generic_path(self):
        # The benchmark's head size (64) and many tiles.
        import jax

        weights = random_weights(4, 64, 64, 64, True)
        x = np.random.default_rng(5).normal(size=(20000, 64))
        args = (x.astype("float32"), *weights)
        got, got_grads = jax.jit(
            jax.value_and_grad(scalar_loss(fused_adversary.mlp), range(5))
        )(*args)
        want, want_grads = jax.jit(
            jax.value_and_grad(scalar_loss(reference_mlp), range(5))
        )(*args)
        self.assertAllClose(got, want, rtol=1e-4)
        for g, w in zip(
            jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)
        ):
            scale = max(1.0, float(np.max(np.abs(w))))
            self.assertAllClose(g, w, atol=1e-4 * scale, rtol=1e-3)
