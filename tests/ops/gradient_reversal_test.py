import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.ops.gradient_reversal import gradient_reversal
from keras_attnvariants.testing.gradients import torch_leaf
from keras_attnvariants.testing.test_case import TestCase


def value_and_grad(fn, x, upstream):
    """`fn(x)` and the gradient of `sum(upstream * fn(x))`, any backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            total = tf.reduce_sum(y * upstream)
        return y.numpy(), tape.gradient(total, x).numpy()
    if backend == "jax":
        import jax

        y = fn(x)
        grad = jax.grad(lambda v: (fn(v) * upstream).sum())(x)
        return np.asarray(y), np.asarray(grad)
    x = torch_leaf(x)
    y = fn(x)
    (y * ops.convert_to_tensor(upstream)).sum().backward()
    return ops.convert_to_numpy(y.detach()), ops.convert_to_numpy(x.grad)


class GradientReversalTest(TestCase):
    @parameterized.parameters(1.0, 0.5, 3.0)
    def test_identity_forward_and_reversed_gradient(self, beta):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(3, 5)).astype("float32")
        upstream = rng.normal(size=(3, 5)).astype("float32")
        y, grad = value_and_grad(
            lambda v: gradient_reversal(v, beta), x, upstream
        )
        self.assertAllClose(y, x, atol=1e-6)
        self.assertAllClose(grad, -beta * upstream, atol=1e-6)

    def test_composes_with_downstream_function(self):
        # d/dx sum(GRL(x)^2) = -2x for beta = 1.
        x = np.array([0.5, -1.5, 2.0], "float32")
        y, grad = value_and_grad(
            lambda v: ops.square(gradient_reversal(v)), x, np.ones(3, "float32")
        )
        self.assertAllClose(y, x**2)
        self.assertAllClose(grad, -2 * x)

    def test_float16_forward_is_exact_without_overflow(self):
        if keras.backend.backend() == "torch":
            self.skipTest("Torch CPU lacks some float16 kernels.")
        x = np.array([1e-3, 3.14159, 6e4], "float16")  # 2 * 6e4 > 65504
        y = ops.convert_to_numpy(gradient_reversal(ops.convert_to_tensor(x)))
        self.assertEqual(y.dtype, np.float16)
        np.testing.assert_array_equal(y, x)

    @parameterized.parameters("one", True, None, float("nan"), float("inf"))
    def test_invalid_beta(self, beta):
        # A non-finite beta made the forward pass nan (nan * 0).
        with self.assertRaisesRegex(ValueError, "beta"):
            gradient_reversal(np.ones(2, "float32"), beta)

    def test_numpy_scalar_beta(self):
        x = np.array([0.5, -1.5, 2.0], "float32")
        y, grad = value_and_grad(
            lambda v: gradient_reversal(v, np.float32(0.5)),
            x,
            np.ones(3, "float32"),
        )
        self.assertAllClose(y, x)
        self.assertAllClose(grad, -0.5 * np.ones(3))

    def test_non_finite_entries_pass_through_with_zero_gradient(self):
        # `frozen - beta * (x - frozen)` made inf and -inf nan (inf - inf).
        x = np.array([np.inf, -np.inf, np.nan, 1.5], "float32")
        y, grad = value_and_grad(
            lambda v: gradient_reversal(v, 2.0), x, np.ones(4, "float32")
        )
        np.testing.assert_array_equal(y, x)  # nan == nan here
        np.testing.assert_array_equal(grad, [0.0, 0.0, 0.0, -2.0])
