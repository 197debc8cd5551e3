"""Gradients through the active Keras backend, as NumPy arrays."""

import keras
import numpy as np


def gradients(fn, upstream, *args):
    """Gradients of `sum(fn(*args) * upstream)` for every argument.

    Args:
        fn: function of backend tensors built from `keras.ops`.
        upstream: NumPy array broadcastable to `fn`'s output.
        *args: NumPy float arrays, the points of differentiation.

    Returns:
        list of NumPy arrays, one gradient per argument.
    """
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        args = [tf.constant(a) for a in args]
        with tf.GradientTape() as tape:
            tape.watch(args)
            loss = tf.reduce_sum(fn(*args) * upstream)
        return [g.numpy() for g in tape.gradient(loss, args)]
    if backend == "jax":
        import jax

        def loss(*a):
            return (fn(*a) * upstream).sum()

        grads = jax.grad(loss, argnums=tuple(range(len(args))))(*args)
        return [np.asarray(g) for g in grads]
    import torch

    args = [torch.tensor(a, requires_grad=True) for a in args]
    (fn(*args) * torch.tensor(upstream)).sum().backward()
    return [a.grad.numpy() for a in args]
