"""Test-session setup: full float32 matmuls on every device.

The tests compare layers with float32 / float64 NumPy references at float32
tolerances. On Ampere and later GPUs, TensorFlow and JAX run float32
matmuls as TensorFloat-32 by default (10-bit mantissa, errors near 1e-3),
which such comparisons do not allow; TensorFlow's own tests turn it off
the same way (`run_without_tensor_float_32`). A no-op on CPUs, where CI
runs. Models trained by users keep each framework's default.

Every test also starts from the same global seed, so layers built without
a seed get the same initial weights whichever tests ran before (and on
whichever pytest-xdist worker): a threshold on their outputs cannot pass
or fail by test order.
"""

import keras
import pytest


def _full_float32_matmuls():
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    elif backend == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


_full_float32_matmuls()


@pytest.fixture(autouse=True)
def _seeded():
    keras.utils.set_random_seed(20261127)
