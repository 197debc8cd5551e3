"""Attention dropout whose mask does not change with padding.

Keras MHA drops attention weights with `keras.random.dropout`, which draws
a new mask everywhere when the shape changes: a training output on real
tokens then depends on how much padding follows them. This package's
layers drop with `ops.noise.positional_dropout` (the mask of entry
`(b, n, t, s)` is a hash of the generator state and that index), from the
same dropout generator, so no variable is added.
"""

import textwrap

import keras
import numpy as np
import pytest
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.layers.doubly_normalized_attention import (
    DoublyNormalizedAttention,
)
from keras_attnvariants.layers.gumbel_discrete_attention import (
    GumbelDiscreteAttention,
)
from keras_attnvariants.layers.hybrid_attention import HybridAttention
from keras_attnvariants.ops.gumbel import positional_uniform
from keras_attnvariants.ops.noise import noise_key
from keras_attnvariants.ops.noise import positional_dropout
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.subprocesses import run_script
from keras_attnvariants.testing.test_case import TestCase

LAYERS = {
    "dnas": lambda **kw: DoublyNormalizedAttention(**kw),
    "hnas": lambda **kw: HybridAttention(hybrid_init=0.3, **kw),
    "softmax": lambda **kw: HybridAttention(hybrid_init=0.0, **kw),
    "gumbel": lambda **kw: GumbelDiscreteAttention(**kw),
}


class PositionalDropoutTest(TestCase):
    def test_rate_and_scale(self):
        generator = keras.random.SeedGenerator(5)
        x = np.full((4, 4, 64, 64), 2.0, "float32")
        dropped = ops.convert_to_numpy(positional_dropout(x, 0.3, generator))
        zero = dropped == 0.0
        # 65536 entries: the dropped fraction is within 4 sigma of 0.3.
        self.assertLess(abs(zero.mean() - 0.3), 4 * np.sqrt(0.21 / x.size))
        # Kept entries are scaled by 1 / (1 - rate), exactly as in float32.
        self.assertAllClose(
            dropped[~zero], np.full((~zero).sum(), 2.0 / 0.7), rtol=1e-6
        )

    def test_mask_is_the_positional_uniform_of_the_noise_key(self):
        # Independent recomputation: entry kept iff its hashed uniform,
        # drawn from a generator in the same state, is >= rate.
        generator = keras.random.SeedGenerator(11)
        twin = keras.random.SeedGenerator(11)
        x = np.ones((2, 3, 5, 7), "float32")
        dropped = ops.convert_to_numpy(positional_dropout(x, 0.4, generator))
        uniform = ops.convert_to_numpy(
            positional_uniform(noise_key(twin), (2, 3, 5, 7))
        )
        self.assertAllEqual(dropped != 0.0, uniform >= 0.4)

    def test_each_call_draws_a_new_mask(self):
        generator = keras.random.SeedGenerator(1)
        x = np.ones((2, 2, 16, 16), "float32")
        first = ops.convert_to_numpy(positional_dropout(x, 0.5, generator))
        second = ops.convert_to_numpy(positional_dropout(x, 0.5, generator))
        self.assertGreater(np.mean((first == 0) != (second == 0)), 0.2)

    def test_mask_ignores_trailing_padding(self):
        x = np.ones((3, 2, 9, 11), "float32")
        a = keras.random.SeedGenerator(3)
        b = keras.random.SeedGenerator(3)
        # Batch, queries and keys (the last axis is hashed apart) padded.
        small = ops.convert_to_numpy(
            positional_dropout(x[:2, :, :4, :6], 0.5, a)
        )
        large = ops.convert_to_numpy(positional_dropout(x, 0.5, b))
        self.assertAllEqual(small, large[:2, :, :4, :6])

    @parameterized.parameters(-0.1, 1.0, float("nan"), "0.1", True)
    def test_bad_rate_raises(self, rate):
        with self.assertRaisesRegex(ValueError, "rate"):
            positional_dropout(
                np.ones((1, 1), "float32"),
                rate,
                keras.random.SeedGenerator(0),
            )

    def test_zero_rate_is_identity(self):
        generator = keras.random.SeedGenerator(0)
        x = np.arange(6, dtype="float32").reshape(2, 3)
        self.assertAllEqual(
            ops.convert_to_numpy(positional_dropout(x, 0.0, generator)), x
        )


class FoldedDropoutTest(TestCase):
    """DNAS, HNAS and the relaxed Gumbel sample fold dropout into the value
    product (`ops.combine`, `keep=`): the same mask as the materialized
    weights, so the same outputs and gradients."""

    @parameterized.named_parameters(
        ("dnas", "dnas"), ("hnas", "hnas"), ("gumbel", "gumbel")
    )
    def test_folded_equals_materialized(self, name):
        rng = np.random.default_rng(4)
        x = rng.normal(size=(2, 6, 8)).astype("float32")
        valid = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
        mask = valid[:, :, None] & valid[:, None, :]
        upstream = rng.normal(size=(2, 6, 8)).astype("float32")
        layer = LAYERS[name](
            num_heads=2,
            key_dim=4,
            dropout=0.4,
            seed=2,
            attention_path="explicit",
        )
        layer(x, x)
        generators = [layer._dropout_layer.seed_generator]
        if name == "gumbel":
            generators.append(layer.seed_generator)
        start = [ops.convert_to_numpy(g.state) for g in generators]

        def run(scores):
            def call(inputs):
                for generator, state in zip(generators, start):
                    generator.state.assign(state)
                out = layer(
                    inputs,
                    inputs,
                    attention_mask=mask,
                    return_attention_scores=scores,
                    training=True,
                )
                return out[0] if scores else out

            return call

        folded, materialized = run(False), run(True)
        out = ops.convert_to_numpy(folded(ops.convert_to_tensor(x)))
        want = ops.convert_to_numpy(materialized(ops.convert_to_tensor(x)))
        self.assertAllClose(out, want, atol=1e-5)
        # Dropout acted: some weights were zeroed (the output differs from
        # inference).
        self.assertGreater(
            np.abs(out - ops.convert_to_numpy(layer(x, x))).max(), 1e-3
        )
        (got,) = gradients(folded, upstream, x)
        (ref,) = gradients(materialized, upstream, x)
        self.assertAllClose(got, ref, atol=1e-4)

    def test_folded_path_draws_no_weights_buffer_for_dropout(self):
        layer = DoublyNormalizedAttention(num_heads=2, key_dim=4, dropout=0.5)
        x = np.zeros((1, 3, 8), "float32")
        layer(x, x)

        def refuse(*args, **kwargs):
            raise AssertionError("materialized the weights")

        layer._attend = refuse
        layer(x, x, training=True)


class LayerDropoutPaddingTest(TestCase):
    @parameterized.named_parameters(
        ("dnas", "dnas"),
        ("hnas", "hnas"),
        ("softmax", "softmax"),
        ("gumbel", "gumbel"),
    )
    def test_training_output_ignores_trailing_padding(self, name):
        rng = np.random.default_rng(0)
        lengths = np.array([5, 3])
        x = rng.normal(size=(2, 12, 8)).astype("float32")
        layer = LAYERS[name](num_heads=2, key_dim=4, dropout=0.5, seed=7)
        layer(x[:, :5], x[:, :5])
        generators = [layer._dropout_layer.seed_generator]
        if name == "gumbel":
            generators.append(layer.seed_generator)
        start = [ops.convert_to_numpy(g.state) for g in generators]

        def run(total, reset=True, training=True):
            valid = np.arange(total)[None] < lengths[:, None]
            inputs = np.where(valid[..., None], x[:, :total], 3.0)
            if reset:
                for generator, state in zip(generators, start):
                    generator.state.assign(state)
            out = layer(
                inputs.astype("float32"),
                inputs.astype("float32"),
                attention_mask=valid[:, :, None] & valid[:, None, :],
                training=training,
            )
            return ops.convert_to_numpy(out)

        base = run(5)
        for total in (8, 12):
            out = run(total)
            for b, n in enumerate(lengths):
                self.assertAllClose(out[b, :n], base[b, :n], atol=1e-5)
        # Dropout is active: the same inputs and mask give the same output
        # from the same generator state, another one on the next draw, and
        # inference a third (compared on every real row).
        again = run(5)
        self.assertAllClose(again, base, atol=1e-6)
        next_draw = run(5, reset=False)
        inference = run(5, training=False)
        for b, n in enumerate(lengths):
            for other in (next_draw, inference):
                diff = np.abs(other[b, :n] - base[b, :n]).max()
                self.assertGreater(diff, 1e-3)

    @parameterized.named_parameters(
        ("dnas", "dnas"),
        ("hnas", "hnas"),
        ("gumbel", "gumbel"),
    )
    def test_cross_attention_ignores_query_key_and_batch_padding(self, name):
        # T != S, padded separately, and a third example appended to the
        # batch: the first two examples' real rows keep their output.
        rng = np.random.default_rng(4)
        query = rng.normal(size=(3, 9, 8)).astype("float32")
        value = rng.normal(size=(3, 11, 8)).astype("float32")
        q_len, v_len = np.array([4, 2, 4]), np.array([5, 3, 5])
        layer = LAYERS[name](num_heads=2, key_dim=4, dropout=0.5, seed=5)
        layer(query[:2, :4], value[:2, :5])
        generators = [layer._dropout_layer.seed_generator]
        if name == "gumbel":
            generators.append(layer.seed_generator)
        start = [ops.convert_to_numpy(g.state) for g in generators]

        def run(batch, t, s, reset=True):
            if reset:
                for generator, state in zip(generators, start):
                    generator.state.assign(state)
            q_valid = np.arange(t)[None] < q_len[:batch, None]
            v_valid = np.arange(s)[None] < v_len[:batch, None]
            out = layer(
                np.where(q_valid[..., None], query[:batch, :t], 3.0),
                np.where(v_valid[..., None], value[:batch, :s], -3.0),
                attention_mask=q_valid[:, :, None] & v_valid[:, None, :],
                training=True,
            )
            return ops.convert_to_numpy(out)

        base = run(2, 4, 5)
        for batch, t, s in ((2, 9, 5), (2, 4, 11), (3, 9, 11)):
            out = run(batch, t, s)
            for b in range(2):
                self.assertAllClose(
                    out[b, : q_len[b]], base[b, : q_len[b]], atol=1e-5
                )
        # The noise acted: the next draw changes every example's real rows.
        next_draw = run(2, 4, 5, reset=False)
        for b in range(2):
            diff = np.abs(next_draw[b, : q_len[b]] - base[b, : q_len[b]])
            self.assertGreater(diff.max(), 1e-3)

    @parameterized.named_parameters(
        (f"{name}_{policy}", name, policy)
        for name in ("dnas", "hnas", "gumbel")
        for policy in ("mixed_float16", "mixed_bfloat16", "bfloat16")
    )
    def test_training_under_reduced_precision_keeps_dtype_and_mask(
        self, name, policy
    ):
        # The same weights and generator states give the float32 output up
        # to rounding (a different mask would move outputs by ~1), in the
        # compute dtype.
        if policy == "mixed_float16" and keras.backend.backend() == "torch":
            self.skipTest("torch CPU has no float16 matmuls")
        rng = np.random.default_rng(6)
        x = rng.normal(size=(2, 6, 8)).astype("float32")
        reference = LAYERS[name](num_heads=2, key_dim=4, dropout=0.5, seed=7)
        reduced = LAYERS[name](
            num_heads=2, key_dim=4, dropout=0.5, seed=7, dtype=policy
        )
        reference(x, x)
        reduced(x, x)
        reduced.set_weights(reference.get_weights())
        outputs = [layer(x, x, training=True) for layer in (reference, reduced)]
        self.assertEqual(
            keras.backend.standardize_dtype(outputs[1].dtype),
            reduced.compute_dtype,
        )
        want, got = (
            ops.convert_to_numpy(ops.cast(out, "float32")) for out in outputs
        )
        self.assertGreater(np.abs(want).max(), 0.3)
        self.assertAllClose(got, want, atol=0.08, rtol=0.0)

    @parameterized.named_parameters(
        ("dnas", "dnas"),
        ("hnas", "hnas"),
        ("softmax", "softmax"),
    )
    def test_unset_training_does_not_drop(self, name):
        # `training` left unset (None) is inference, as for Keras's
        # `Dropout`, also on the path that materializes the weights.
        rng = np.random.default_rng(8)
        x = rng.normal(size=(2, 6, 8)).astype("float32")
        layer = LAYERS[name](num_heads=2, key_dim=4, dropout=0.5, seed=2)
        layer(x, x)
        generator = layer._dropout_layer.seed_generator
        state = ops.convert_to_numpy(generator.state)
        unset, _ = layer(x, x, return_attention_scores=True)
        self.assertAllEqual(ops.convert_to_numpy(generator.state), state)
        off, _ = layer(x, x, return_attention_scores=True, training=False)
        self.assertAllClose(unset, off, atol=0.0)

    def test_inference_does_not_drop(self):
        rng = np.random.default_rng(1)
        x = rng.normal(size=(2, 6, 8)).astype("float32")
        with_dropout = HybridAttention(
            num_heads=2, key_dim=4, hybrid_init=0.3, dropout=0.5, seed=1
        )
        without = HybridAttention(num_heads=2, key_dim=4, hybrid_init=0.3)
        with_dropout(x, x)
        without(x, x)
        without.set_weights(with_dropout.get_weights())
        self.assertAllClose(
            with_dropout(x, x, training=False), without(x, x), atol=1e-6
        )

    def test_training_output_equals_numpy_with_the_hashed_mask(self):
        # softmax attention (HNAS at u = 0 is exactly MHA) with the weights
        # dropped by the recomputed positional mask, through the output
        # projection, against NumPy.
        rng = np.random.default_rng(2)
        x = rng.normal(size=(2, 5, 8)).astype("float32")
        layer = HybridAttention(
            num_heads=2, key_dim=4, hybrid_init=0.0, dropout=0.4, seed=3
        )
        layer(x, x)
        generator = layer._dropout_layer.seed_generator
        state = ops.convert_to_numpy(generator.state)
        twin = keras.random.SeedGenerator(0)
        twin.state.assign(state)
        keep = (
            ops.convert_to_numpy(
                positional_uniform(noise_key(twin), (2, 2, 5, 5))
            )
            >= 0.4
        )
        out = ops.convert_to_numpy(layer(x, x, training=True))

        def dense(inputs, sublayer):
            kernel, bias = (ops.convert_to_numpy(w) for w in sublayer.weights)
            return np.einsum("btd,dnh->btnh", inputs, kernel) + bias

        q, k, v = (
            dense(x, d)
            for d in (layer._query_dense, layer._key_dense, layer._value_dense)
        )
        scores = np.einsum("btnh,bsnh->bnts", q / 2.0, k)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        weights = np.where(keep, weights / 0.6, 0.0)
        context = np.einsum("bnts,bsnh->btnh", weights, v)
        kernel, bias = (
            ops.convert_to_numpy(w) for w in layer._output_dense.weights
        )
        want = np.einsum("btnh,nhd->btd", context, kernel) + bias
        self.assertAllClose(out, want, atol=1e-5)


MIRRORED_SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    import numpy as np
    from keras_attnvariants.layers.hybrid_attention import HybridAttention
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        layer = HybridAttention(
            num_heads=2, key_dim=3, hybrid_init=0.0, dropout=0.5, seed=1
        )
        x = np.random.default_rng(0).normal(size=(1, 6, 4)).astype("float32")
        layer(x, x)

    @tf.function
    def step():
        return strategy.run(lambda: layer(x, x, training=True))

    # Three steps x two replicas on the same example: six outputs, all
    # different (Keras's Dropout drew one mask on both replicas).
    outputs = [
        np.asarray(y)
        for _ in range(3)
        for y in strategy.experimental_local_results(step())
    ]
    print("MINDIFF", min(
        float(np.abs(a - b).max())
        for i, a in enumerate(outputs)
        for b in outputs[i + 1:]
    ))
    """
)


@pytest.mark.skipif(
    keras.config.backend() != "tensorflow", reason="tf.distribute"
)
@pytest.mark.slow
def test_mirrored_replicas_drop_different_weights():
    lines = run_script(MIRRORED_SCRIPT)
    assert float(lines["MINDIFF"]) > 1e-3, lines
