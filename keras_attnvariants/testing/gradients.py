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
    args = [torch_leaf(a) for a in args]
    (fn(*args) * keras.ops.convert_to_tensor(upstream)).sum().backward()
    return [keras.ops.convert_to_numpy(a.grad) for a in args]


def torch_leaf(array):
    """A PyTorch leaf tensor that requires a gradient, on Keras's device.

    `torch.tensor(array)` lands on the CPU, while Keras puts the tensors it
    makes (masks, constants, weights) on its default device, a GPU where
    there is one: mixing the two raised "Expected all tensors to be on the
    same device" on a GPU machine.
    """
    tensor = keras.ops.convert_to_tensor(array)
    return tensor.detach().clone().requires_grad_(True)


def hessian_vector_products(fn, upstream, direction, *args):
    """Second derivatives: the gradients of `<grad_args L, direction>`.

    `L = sum(fn(*args) * upstream)`; `direction` holds one NumPy array per
    argument. Differentiates the backend's own gradient a second time
    (nested tapes, `jax.grad` of `jax.grad`, `create_graph=True`), as a
    gradient penalty or a Hessian-vector product does.

    Returns:
        list of NumPy arrays, one per argument.
    """
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        args = [tf.constant(a) for a in args]
        with tf.GradientTape() as outer:
            outer.watch(args)
            with tf.GradientTape() as inner:
                inner.watch(args)
                loss = tf.reduce_sum(fn(*args) * upstream)
            grads = inner.gradient(loss, args)
            inner_product = sum(
                tf.reduce_sum(g * d) for g, d in zip(grads, direction)
            )
        return [g.numpy() for g in outer.gradient(inner_product, args)]
    if backend == "jax":
        import jax

        def loss(*a):
            return (fn(*a) * upstream).sum()

        argnums = tuple(range(len(args)))

        def inner_product(*a):
            grads = jax.grad(loss, argnums=argnums)(*a)
            return sum((g * d).sum() for g, d in zip(grads, direction))

        grads = jax.grad(inner_product, argnums=argnums)(*args)
        return [np.asarray(g) for g in grads]
    import torch

    args = [torch_leaf(a) for a in args]
    loss = (fn(*args) * keras.ops.convert_to_tensor(upstream)).sum()
    grads = torch.autograd.grad(loss, args, create_graph=True)
    inner_product = sum(
        (g * keras.ops.convert_to_tensor(d)).sum()
        for g, d in zip(grads, direction)
    )
    grads = torch.autograd.grad(inner_product, args)
    return [keras.ops.convert_to_numpy(g) for g in grads]
