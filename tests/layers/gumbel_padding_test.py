"""Gumbel training noise that does not change with padding.

The noise of score `(b, n, t, s)` is a hash of the generator state and of
that index (`ops.gumbel.positional_uniform`), so samples on real tokens do
not depend on how much padding follows them: along the keys, the queries
or the batch, in `GumbelDiscreteAttention` and in the two-stream layers.
"""

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.layers.gumbel_discrete_attention import (
    GumbelDiscreteAttention,
)
from keras_attnvariants.layers.two_stream_encoder import TwoStreamEncoder
from keras_attnvariants.ops.noise import noise_key
from keras_attnvariants.testing import numpy_reference as ref
from keras_attnvariants.testing.test_case import TestCase


def _state_array(words, variable):
    """The uint32 `words` in the dtype of a SeedGenerator state."""
    dtype = keras.backend.standardize_dtype(variable.dtype)
    return np.array(words, dtype=np.uint32).astype(dtype)


def _states(generators):
    return [ops.convert_to_numpy(g.state) for g in generators]


def _restore(generators, states):
    for generator, state in zip(generators, states):
        generator.state.assign(state)


class GumbelPaddingTest(TestCase):
    @parameterized.parameters(
        [0, 0], [7, 3], [2**31 + 5, 9], [2**32 - 1, 2**32 - 1]
    )
    def test_noise_key_matches_numpy_reference(self, seed, counter):
        # The key hashes the low 32 bits of both state words, whatever the
        # backend's state dtype (int64, uint32 or int32).
        generator = keras.random.SeedGenerator(0)
        generator.state.assign(_state_array([seed, counter], generator.state))
        key = ops.convert_to_numpy(noise_key(generator))
        words = np.array([seed, counter], np.uint32)
        want = ref.fmix32(
            ref.fmix32(words[0] ^ np.uint32(0x3C6EF372)) ^ words[1]
        )
        self.assertEqual(int(np.asarray(key).astype(np.uint32)), int(want))
        # Each draw advances the counter word.
        state = ops.convert_to_numpy(generator.state).astype(np.uint32)
        self.assertEqual(int(state[1]), (counter + 1) % 2**32)

    @parameterized.parameters(
        {"straight_through": False}, {"straight_through": True}
    )
    def test_cross_attention_ignores_key_query_and_batch_padding(
        self, straight_through
    ):
        rng = np.random.default_rng(3)
        q_len, k_len = np.array([4, 2]), np.array([5, 3])
        query = rng.normal(size=(3, 9, 4)).astype("float32")
        value = rng.normal(size=(3, 11, 4)).astype("float32")
        layer = GumbelDiscreteAttention(
            num_heads=2, key_dim=3, seed=8, straight_through=straight_through
        )
        layer(query[:2, :4], value[:2, :5])
        start = _states([layer.seed_generator])

        def run(batch, t, s, reset=True):
            # Padding holds other garbage at every size; row 2 is padding
            # only (a batch padded to a fixed size).
            lengths_q = np.append(q_len, 0)[:batch]
            lengths_k = np.append(k_len, 0)[:batch]
            q_valid = np.arange(t)[None] < lengths_q[:, None]
            k_valid = np.arange(s)[None] < lengths_k[:, None]
            fill = rng.normal(size=(1,)) * 7
            q = np.where(q_valid[..., None], query[:batch, :t], fill)
            v = np.where(k_valid[..., None], value[:batch, :s], fill)
            if reset:
                _restore([layer.seed_generator], start)
            out, w = layer(
                q.astype("float32"),
                v.astype("float32"),
                attention_mask=q_valid[:, :, None] & k_valid[:, None, :],
                return_attention_scores=True,
                training=True,
            )
            return ops.convert_to_numpy(out), ops.convert_to_numpy(w)

        base_out, base_w = run(2, 4, 5)
        for batch, t, s in ((2, 9, 5), (2, 4, 11), (3, 7, 8)):
            out, w = run(batch, t, s)
            for b in range(2):
                self.assertAllClose(
                    out[b, : q_len[b]], base_out[b, : q_len[b]], atol=1e-5
                )
                self.assertAllClose(
                    w[b, :, : q_len[b], : k_len[b]],
                    base_w[b, :, : q_len[b], : k_len[b]],
                    atol=1e-6,
                )
        # The samples are noisy: the next draw on the same inputs and mask
        # changes every example's real block.
        _, again = run(2, 4, 5, reset=False)
        for b in range(2):
            real = (b, slice(None), slice(q_len[b]), slice(k_len[b]))
            self.assertGreater(np.abs(again[real] - base_w[real]).max(), 1e-3)

    @parameterized.parameters(
        {"mode": "two_stream"},
        {"mode": "two_stream", "straight_through": True},
        {"mode": "single_stream"},
    )
    def test_two_stream_encoder_training_ignores_padding(self, **kwargs):
        keras.utils.set_random_seed(0)
        encoder = TwoStreamEncoder(
            12, 16, 2, d_model=8, num_heads=2, d_ff=16, seed=4, **kwargs
        )
        tokens = np.array([[3, 4, 5, 6, 7], [1, 2, 3, 0, 0]], "int32")
        lengths = np.array([5, 3])
        generators = [block.seed_generator for block in encoder.blocks]
        encoder(tokens)
        start = _states(generators)

        def run(total):
            ids = np.zeros((2, total), "int32")
            ids[:, :5] = tokens
            _restore(generators, start)
            h, attentions = encoder(ids, return_attention=True, training=True)
            return ops.convert_to_numpy(h), [
                ops.convert_to_numpy(z) for z in attentions
            ]

        base_h, base_z = run(5)
        h, z = run(12)
        for b, length in enumerate(lengths):
            self.assertAllClose(h[b, :length], base_h[b, :length], atol=1e-5)
            for layer_z, layer_base in zip(z, base_z):
                self.assertAllClose(
                    layer_z[b, :, :length, :length],
                    layer_base[b, :, :length, :length],
                    atol=1e-6,
                )


class GumbelContractsTest(TestCase):
    # Contracts a mutation sweep found untested.
    @parameterized.parameters("argmax", "sample")
    def test_a_query_without_a_valid_key_gets_a_zero_context(self, mode):
        # The gather read value row 0 for it: a padded query leaked a
        # value into the output (and a pooling after it).
        x = np.random.default_rng(0).normal(size=(1, 3, 8)).astype("float32")
        mask = np.ones((1, 3, 3), bool)
        mask[0, 1] = False
        layer = GumbelDiscreteAttention(
            2, 4, use_bias=False, inference_mode=mode, seed=1
        )
        out, weights = layer(
            x, x, attention_mask=mask, return_attention_scores=True
        )
        kernel = ops.convert_to_numpy(layer._output_dense.kernel)
        self.assertAllEqual(ops.convert_to_numpy(weights)[0, :, 1], 0.0)
        # Without biases a zero context projects to zero.
        self.assertAllEqual(ops.convert_to_numpy(out)[0, 1], np.zeros(8))
        self.assertGreater(np.abs(kernel).sum(), 0.0)
        self.assertGreater(np.abs(ops.convert_to_numpy(out)[0, 0]).sum(), 0.0)

    def test_numpy_temperature_gives_a_json_config(self):
        import json

        config = GumbelDiscreteAttention(
            2, 4, temperature=np.float32(0.5)
        ).get_config()
        self.assertIs(type(config["temperature"]), float)
        json.dumps(config)

    def test_noise_seeds_stay_distinct_at_the_ends_of_the_range(self):
        from keras_attnvariants.layers.gumbel_discrete_attention import (
            noise_seed,
        )

        top = 2**31 - 1
        self.assertNotEqual(noise_seed(0), noise_seed(top))
        self.assertTrue(0 <= noise_seed(top) < 2**31)
        seeds = list(range(0, 2**31, 2**31 // 997)) + [top]
        self.assertLen({noise_seed(s) for s in seeds}, len(set(seeds)))


class _ReplicaContext:
    """A stand-in `tf.distribute` replica context: replica `replica_id`
    of `num_replicas`."""

    def __init__(self, replica_id, num_replicas):
        import tensorflow as tf

        self.num_replicas_in_sync = num_replicas
        self.replica_id_in_sync_group = tf.constant(replica_id, tf.int32)


def _as_replica(replica_id, num_replicas=2):
    """A context manager under which `ops.noise` sees replica
    `replica_id` of `num_replicas`: a `tf.distribute` replica context on
    TensorFlow, a `torch.distributed` rank on PyTorch (the framework
    functions it queries, patched; JAX has no per-replica key)."""
    import contextlib
    from unittest import mock

    backend = keras.backend.backend()
    stack = contextlib.ExitStack()
    if backend == "tensorflow":
        import tensorflow as tf

        context = _ReplicaContext(replica_id, num_replicas)
        stack.enter_context(
            mock.patch.object(
                tf.distribute, "get_replica_context", lambda: context
            )
        )
    elif backend == "torch":
        import torch.distributed as dist

        for name, value in (
            ("is_available", True),
            ("is_initialized", True),
            ("get_world_size", num_replicas),
            ("get_rank", replica_id),
        ):
            stack.enter_context(
                mock.patch.object(dist, name, lambda value=value: value)
            )
    return stack


class ReplicaNoiseKeyTest(TestCase):
    """Per-replica noise in one process, without a strategy over two
    devices (the MirroredStrategy test of
    `gumbel_discrete_attention_test.py` runs in the slow suite): the
    replica id `ops.noise` reads from the framework is hashed into the
    key, so replicas in the same generator state draw different noise."""

    def setUp(self):
        super().setUp()
        if keras.backend.backend() == "jax":
            self.skipTest("JAX data parallelism indexes one global batch")

    def _key(self, generator, state):
        generator.state.assign(_state_array(state, generator.state))
        return int(
            np.asarray(ops.convert_to_numpy(noise_key(generator))).astype(
                np.uint32
            )
        )

    def test_replica_id_is_hashed_into_the_noise_key(self):
        generator = keras.random.SeedGenerator(0)
        state = [11, 4]
        words = np.array(state, np.uint32)
        base = ref.fmix32(
            ref.fmix32(words[0] ^ np.uint32(0x3C6EF372)) ^ words[1]
        )
        self.assertEqual(self._key(generator, state), int(base))
        keys = []
        for replica in range(3):
            with _as_replica(replica, num_replicas=3):
                keys.append(self._key(generator, state))
            salted = ref.fmix32(np.uint32(replica) ^ np.uint32(0x1B873593))
            self.assertEqual(keys[-1], int(ref.fmix32(base ^ salted)))
        self.assertLen(set(keys + [int(base)]), 4)
        # One replica in sync: the plain key.
        with _as_replica(0, num_replicas=1):
            self.assertEqual(self._key(generator, state), int(base))

    def test_replicas_sample_different_gumbel_weights(self):
        x = np.random.default_rng(4).normal(size=(1, 5, 4)).astype("float32")
        layer = GumbelDiscreteAttention(num_heads=2, key_dim=3, seed=1)
        layer(x, x)
        start = ops.convert_to_numpy(layer.seed_generator.state)
        samples = []
        for replica in (0, 1):
            layer.seed_generator.state.assign(start)
            with _as_replica(replica):
                _, weights = layer(
                    x, x, return_attention_scores=True, training=True
                )
            samples.append(ops.convert_to_numpy(weights))
        self.assertGreater(np.abs(samples[0] - samples[1]).max(), 1e-3)
