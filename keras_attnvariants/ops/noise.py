"""Seeded noise for layers, stable under padding and distinct per replica.

Unlike the rest of `ops`, these functions draw from a
`keras.random.SeedGenerator` passed in (and advance it), as
`keras.random` functions do with a seed generator.

A layer keeps a `keras.random.SeedGenerator`; each draw hashes the
generator's state (and, under `tf.distribute`, the replica id) into one
32-bit key, and every entry of the noise is a hash of that key and of the
entry's own index (`ops.gumbel.positional_uniform`). Noise on real tokens
then does not change with the amount of padding after them, is identical
on every backend and in or out of XLA, and differs between replicas.
"""

import keras
from keras import ops

from keras_attnvariants.ops.gumbel import fmix32
from keras_attnvariants.ops.gumbel import hash_words
from keras_attnvariants.ops.gumbel import positional_uniform
from keras_attnvariants.validation import check_float

# Salts of the seed words and the replica id in the noise key.
_SEED_SALT = 0x3C6EF372
_REPLICA_SALT = 0x1B873593


def noise_key(seed_generator):
    """The 32-bit key of one noise draw (advances `seed_generator`).

    A hash of the low 32 bits of the generator's two state words. Under
    `tf.distribute` every replica holds the same generator state, so on the
    TensorFlow backend, inside a replica context with more than one replica,
    the replica id is hashed in as well: every (step, replica) pair draws
    its own noise (a key of `counter + replica` would make replica r at step
    k + 1 redraw replica r + 1's noise of step k). JAX data parallelism
    needs no such step: there the batch index of `positional_uniform` is
    global. On the PyTorch backend, with an initialized
    `torch.distributed` process group of several ranks (e.g. under
    `DistributedDataParallel`, where every rank seeds alike and indexes
    its own local batch from 0), the rank is hashed in the same way.
    """
    seed = hash_words(_next_state(seed_generator))  # the low 32 bits
    key = fmix32(ops.bitwise_xor(seed[0], hash_words(_SEED_SALT)))
    key = fmix32(ops.bitwise_xor(key, seed[1]))
    replica = _replica_id()
    if replica is not None:
        replica = hash_words(replica)
        replica = fmix32(ops.bitwise_xor(replica, hash_words(_REPLICA_SALT)))
        key = fmix32(ops.bitwise_xor(key, replica))
    return key


def _next_state(seed_generator):
    """`seed_generator.next()`: its state, then the state advanced by
    `[0, 1]`.

    The same arithmetic as Keras's `SeedGenerator.next`, with the
    increment a Python list instead of a NumPy array: under
    `jit_compile=True` on PyTorch, torch.compile cannot trace NumPy
    arrays, and the graph break inside the layer's name scope made it run
    the whole layer call eagerly (Keras 3.15). It reads and assigns
    `state.value` as `next` does, so it behaves alike in JAX's stateless
    train step and in a `tf.distribute` replica context; it computes with
    the current backend's ops (the layers' generators are plain
    `SeedGenerator`s of that backend) and bypasses a subclass's `next`.
    """
    state = seed_generator.state
    value = state.value * 1  # a copy, as `next` returns
    state.assign(
        ops.add(state.value, ops.convert_to_tensor([0, 1], dtype=state.dtype))
    )
    return value


def _replica_id():
    """This replica's index among several data-parallel ones, or None.

    TensorFlow: the replica id inside a `tf.distribute` replica context
    with more than one replica (a tensor). PyTorch: the rank of an
    initialized `torch.distributed` group of more than one process. JAX
    data parallelism shards one global batch, so none is needed.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            return context.replica_id_in_sync_group
    elif backend == "torch":
        import torch.distributed as dist

        if (
            dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
        ):
            return dist.get_rank()
    return None


def distributed_uniform(shape, seed_generator):
    """float32 uniforms from `seed_generator`, distinct on each replica,
    and stable under padding.

    `positional_uniform` with the key `noise_key(seed_generator)`: an
    entry depends on the key and on its index only, so the noise on real
    tokens does not change with the amount of padding after them (nor with
    XLA, nor with the backend, for the same generator state).
    """
    return positional_uniform(noise_key(seed_generator), shape)


def _check_rate(rate):
    rate = check_float("rate", rate, 0.0, True)
    if rate >= 1.0:
        raise ValueError(f"`rate` must be in [0, 1). Received: rate={rate}")
    return rate


def _check_seed_generator(seed_generator, rate):
    """`ValueError` unless `seed_generator` is a
    `keras.random.SeedGenerator` (or None where `rate` is 0: not drawn)."""
    if seed_generator is None and rate == 0.0:
        return
    if not isinstance(seed_generator, keras.random.SeedGenerator):
        raise ValueError(
            "`seed_generator` must be a `keras.random.SeedGenerator`. "
            f"Received: seed_generator={seed_generator!r}"
        )


def _kept(shape, rate, seed_generator):
    """Boolean keep mask: `distributed_uniform(shape) >= rate`."""
    return ops.greater_equal(distributed_uniform(shape, seed_generator), rate)


def positional_dropout(inputs, rate, seed_generator):
    """Inverted dropout whose mask is stable under padding.

    Like `keras.random.dropout`: each entry is zeroed with probability
    `rate` and the others are scaled by `1 / (1 - rate)`. The keep mask is
    `distributed_uniform(shape, seed_generator) >= rate`, so the entries of
    real `(b, n, t, s)` positions keep their mask whatever the amount of
    padding after them (`keras.random.dropout` draws a new mask everywhere
    when the shape changes), and replicas drop different entries.

    Args:
        inputs: tensor, e.g. attention weights `(B, N, T, S)`.
        rate: float in `[0, 1)`, the fraction dropped.
        seed_generator: the `keras.random.SeedGenerator` it advances
            (`ValueError` for anything else; may be None at `rate=0`).

    Returns:
        A tensor of `inputs`' shape and dtype.
    """
    rate = _check_rate(rate)
    _check_seed_generator(seed_generator, rate)
    inputs = ops.convert_to_tensor(inputs)
    if rate == 0.0:
        return inputs
    keep = _kept(ops.shape(inputs), rate, seed_generator)
    scale = ops.cast(1.0 / (1.0 - rate), inputs.dtype)
    return ops.where(keep, ops.multiply(inputs, scale), ops.zeros_like(inputs))


def dropout_multipliers(shape, rate, seed_generator):
    """float32 `positional_dropout` multipliers: `0` or `1 / (1 - rate)`.

    `x * dropout_multipliers(x.shape, rate, g)` equals
    `positional_dropout(x, rate, g')` for a generator `g'` in the same
    state (same mask). The folded attention paths
    (`ops.combine.softmax_attend(..., keep=...)`) take these, so dropout
    needs no materialized weights there.

    Args:
        shape: the shape of the tensor to drop, e.g. `(B, N, T, S)`.
        rate: float in `[0, 1)`.
        seed_generator: the `keras.random.SeedGenerator` it advances
            (`ValueError` for anything else; may be None at `rate=0`).

    Returns:
        A float32 tensor of `shape`.
    """
    rate = _check_rate(rate)
    _check_seed_generator(seed_generator, rate)
    if rate == 0.0:
        return ops.ones(shape, "float32")
    keep = _kept(shape, rate, seed_generator)
    return ops.where(keep, 1.0 / (1.0 - rate), 0.0)
