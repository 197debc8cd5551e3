import textwrap
from unittest import mock

import keras
import numpy as np
import pytest
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.layers import variant_attention
from keras_attnvariants.layers.gumbel_discrete_attention import (
    GumbelDiscreteAttention,
)
from keras_attnvariants.ops.noise import positional_dropout
from keras_attnvariants.testing import numpy_reference as ref
from keras_attnvariants.testing.subprocesses import run_script
from keras_attnvariants.testing.test_case import TestCase

INIT = {"num_heads": 2, "key_dim": 3}
BACKEND = keras.backend.backend()
# Gumbel-max frequencies over SAMPLES draws: the standard error of a cell
# is at most 0.5 / sqrt(SAMPLES) = 0.0079, so FREQUENCY_ATOL is about 5
# standard errors (32 cells are checked at once; 400 draws with 0.08 failed
# by chance on one seed at 3.7 standard errors).
SAMPLES = 4000
FREQUENCY_ATOL = 0.04


def padded_inputs(seed=0, batch=2, length=5, dim=4, scale=1.0):
    rng = np.random.default_rng(seed)
    x = (scale * rng.normal(size=(batch, length, dim))).astype("float32")
    lengths = np.array([length, length - 2])[:batch]
    valid = np.arange(length)[None] < lengths[:, None]
    return x, valid


def numpy_one_hot_argmax(scores, mask=None):
    """Independent reference: one-hot at the largest valid score."""
    s = np.asarray(scores, np.float64)
    mask = np.broadcast_to(
        np.ones_like(s, bool) if mask is None else mask, s.shape
    )
    filled = np.where(mask, s, -np.inf)
    idx = np.argmax(filled, axis=-1)
    out = np.eye(s.shape[-1])[idx]
    return np.where(mask.any(-1, keepdims=True), out, 0.0)


def to_np(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def cold_peak_model():
    """A cold (temperature 0.01) Gumbel layer on `(6, 4)` inputs and a
    model, compiled not to train, whose output (and "mae" loss against 0)
    is the mean of each row's largest weight: ~1 when cold, ~1/S hot."""
    inputs = keras.Input((6, 4))
    layer = GumbelDiscreteAttention(**INIT, temperature=0.01, seed=1)
    _, scores = layer(inputs, inputs, return_attention_scores=True)
    peak = keras.layers.Lambda(
        lambda w: ops.mean(ops.max(w, axis=-1), axis=(1, 2)),
        output_shape=(),
    )(scores)
    model = keras.Model(inputs, peak)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mae")
    return layer, model


class GumbelDiscreteAttentionTest(TestCase):
    def test_layer_basics(self):
        self.run_layer_test(
            GumbelDiscreteAttention,
            init_kwargs={**INIT, "temperature": 0.5, "seed": 1},
            input_shape={"query_shape": (2, 5, 4), "value_shape": (2, 7, 4)},
            expected_output_shape=(2, 5, 4),
            expected_num_trainable_weights=8,
            expected_num_non_trainable_weights=1,
            expected_num_seed_generators=1,
            run_training_check=False,
            run_mixed_precision_check=False,
        )

    def test_config_covers_every_init_arg(self):
        layer = GumbelDiscreteAttention(
            **INIT,
            temperature=0.3,
            straight_through=True,
            inference_mode="soft",
            seed=4,
        )
        self.assert_config_covers_init_args(layer)
        clone = GumbelDiscreteAttention.from_config(layer.get_config())
        self.assertEqual(clone.inference_mode, "soft")
        self.assertTrue(clone.straight_through)
        self.assertEqual(clone.initial_temperature, 0.3)

    def test_argmax_inference_is_deterministic_and_one_hot(self):
        x, valid = padded_inputs(seed=1)
        mask = valid[:, :, None] & valid[:, None, :]
        layer = GumbelDiscreteAttention(**INIT, seed=0)
        out1, w1 = layer(
            x, x, attention_mask=mask, return_attention_scores=True
        )
        out2, w2 = layer(
            x, x, attention_mask=mask, return_attention_scores=True
        )
        self.assertAllClose(out1, out2, atol=0)
        self.assertAllClose(w1, w2, atol=0)
        w = to_np(w1)
        self.assertTrue(set(np.unique(w)) <= {0.0, 1.0})
        row_valid = np.broadcast_to(valid[:, None, :], w.shape[:-1])
        self.assertAllClose(w.sum(-1), row_valid.astype("float32"))

    @parameterized.parameters(None, "padding")
    def test_argmax_output_is_value_row_of_argmax_key(self, masking):
        rng = np.random.default_rng(2)
        query = rng.normal(size=(2, 5, 4)).astype("float32")
        value = rng.normal(size=(2, 7, 4)).astype("float32")
        mask = None
        if masking:
            k_valid = np.arange(7)[None] < np.array([7, 3])[:, None]
            mask = np.broadcast_to(k_valid[:, None, :], (2, 5, 7))
        layer = GumbelDiscreteAttention(num_heads=2, key_dim=3)
        out, w = layer(
            query, value, attention_mask=mask, return_attention_scores=True
        )
        want_out, want_w = ref.multi_head_attention(
            layer, query, value, numpy_one_hot_argmax, mask
        )
        self.assertAllClose(w, want_w, atol=0)
        self.assertAllClose(out, want_out, atol=1e-5)

    def test_soft_inference_equals_multi_head_attention(self):
        x, valid = padded_inputs(seed=3)
        mask = valid[:, :, None] & valid[:, None, :]
        layer = GumbelDiscreteAttention(**INIT, inference_mode="soft")
        mha = keras.layers.MultiHeadAttention(**INIT)
        layer(x, x)
        mha(x, x)
        mha.set_weights([np.asarray(w) for w in layer.trainable_weights])
        got = to_np(layer(x, x, attention_mask=mask))[valid]
        want = to_np(mha(x, x, attention_mask=mask))[valid]
        self.assertAllClose(got, want, atol=1e-5)

    def test_training_weights_are_fresh_seeded_distributions(self):
        x, valid = padded_inputs(seed=4)
        mask = valid[:, :, None] & valid[:, None, :]

        def draws(layer, count=2):
            return [
                to_np(
                    layer(
                        x,
                        x,
                        attention_mask=mask,
                        return_attention_scores=True,
                        training=True,
                    )[1]
                )
                for _ in range(count)
            ]

        first = GumbelDiscreteAttention(**INIT, seed=7)
        second = GumbelDiscreteAttention(**INIT, seed=7)
        first(x, x)
        second(x, x)
        second.set_weights(first.get_weights())
        a1, a2 = draws(first)
        b1, b2 = draws(second)
        # Distributions over the valid keys only.
        full_mask = np.broadcast_to(mask[:, None], a1.shape)
        self.assertTrue(np.all(a1[~full_mask] == 0.0))
        sums = a1.sum(-1)
        self.assertAllClose(sums[full_mask.any(-1)], 1.0, atol=1e-5)
        self.assertAllClose(sums[~full_mask.any(-1)], 0.0, atol=0)
        # Fresh noise on each call, the same noise for the same seed.
        self.assertGreater(np.abs(a1 - a2).max(), 1e-3)
        self.assertAllClose(a1, b1, atol=1e-6)
        self.assertAllClose(a2, b2, atol=1e-6)

    def test_training_weights_match_relaxed_sample_statistics(self):
        # The expected relaxed sample at temperature -> 0 is softmax(s):
        # the argmax of log_softmax(s) + g is a sample from Cat(softmax(s)).
        x, _ = padded_inputs(seed=5, batch=1, length=4)
        layer = GumbelDiscreteAttention(
            **INIT, temperature=1e-3, seed=1, inference_mode="soft"
        )
        _, soft = layer(x, x, return_attention_scores=True)
        big_x = np.repeat(x, SAMPLES, axis=0)
        _, w = layer(big_x, big_x, return_attention_scores=True, training=True)
        freq = to_np(w).round().mean(0)
        self.assertAllClose(freq, to_np(soft)[0], atol=FREQUENCY_ATOL)

    def test_sample_inference_draws_from_the_softmax(self):
        # `inference_mode="sample"` is a Gumbel-max draw from
        # Cat(softmax(s)) (uniform noise in its place went unnoticed).
        x, _ = padded_inputs(seed=5, batch=1, length=4)
        layer = GumbelDiscreteAttention(**INIT, seed=1, inference_mode="sample")
        layer(x, x)
        soft_layer = GumbelDiscreteAttention(**INIT, inference_mode="soft")
        soft_layer(x, x)
        soft_layer.set_weights(layer.get_weights())
        _, soft = soft_layer(x, x, return_attention_scores=True)
        big_x = np.repeat(x, SAMPLES, axis=0)
        _, w = layer(big_x, big_x, return_attention_scores=True)
        freq = to_np(w).mean(0)
        self.assertAllClose(freq, to_np(soft)[0], atol=FREQUENCY_ATOL)

    @pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.function XLA")
    def test_xla_noise_is_seeded_and_gumbel_distributed(self):
        # The noise reproduces with the seed, gives Gumbel-max samples
        # distributed as Cat(softmax(s)), and is the same in and out of
        # XLA (it was ThreeFry under XLA, Philox outside).
        import tensorflow as tf

        x, _ = padded_inputs(seed=5, batch=1, length=4)
        big_x = np.repeat(x, SAMPLES, axis=0)

        def sampler(layer):
            @tf.function(jit_compile=True)
            def sample(inputs):
                return layer(
                    inputs, inputs, return_attention_scores=True, training=True
                )[1]

            return sample

        layers = [
            GumbelDiscreteAttention(
                **INIT, temperature=1e-3, seed=3, inference_mode="soft"
            )
            for _ in range(3)
        ]
        for layer in layers:
            layer(x, x)
            layer.set_weights(layers[0].get_weights())
        first, second = (sampler(layer) for layer in layers[:2])
        a1, a2 = to_np(first(big_x)), to_np(first(big_x))
        b1 = to_np(second(big_x))
        self.assertAllClose(a1, b1, atol=0)
        eager = layers[2](
            big_x, big_x, return_attention_scores=True, training=True
        )[1]
        # Temperature 1e-3 amplifies XLA's float32 rounding (up to 1e-4);
        # different noise would differ by up to 1.
        self.assertAllClose(to_np(eager), a1, atol=1e-3)
        self.assertGreater(np.abs(a1 - a2).max(), 0.5)
        _, soft = layers[0](x, x, return_attention_scores=True)
        self.assertAllClose(
            a1.round().mean(0), to_np(soft)[0], atol=FREQUENCY_ATOL
        )

    @pytest.mark.skipif(BACKEND != "tensorflow", reason="uses GradientTape")
    def test_straight_through_is_one_hot_with_gradients(self):
        import tensorflow as tf

        x, valid = padded_inputs(seed=6)
        mask = valid[:, :, None] & valid[:, None, :]
        layer = GumbelDiscreteAttention(**INIT, straight_through=True, seed=2)
        layer(x, x)
        with tf.GradientTape() as tape:
            out, w = layer(
                x,
                x,
                attention_mask=mask,
                return_attention_scores=True,
                training=True,
            )
            loss = tf.reduce_sum(out * out)
        w = to_np(w)
        self.assertTrue(set(np.unique(w)) <= {0.0, 1.0})
        self.assertTrue(
            np.all(w[~np.broadcast_to(mask[:, None], w.shape)] == 0)
        )
        grads = tape.gradient(loss, layer._query_dense.kernel)
        self.assertGreater(float(tf.reduce_max(tf.abs(grads))), 0.0)

    @parameterized.parameters(
        {"training": True, "straight_through": False},
        {"training": True, "straight_through": True},
        {"training": True, "straight_through": False, "scores": False},
        {"training": True, "straight_through": True, "scores": False},
        {"training": False, "inference_mode": "argmax"},
        {"training": False, "inference_mode": "sample"},
        {"training": False, "inference_mode": "soft"},
        {"training": False, "inference_mode": "soft", "scores": False},
    )
    def test_mixed_precision_extreme_logits_and_masked_rows(
        self, training, scores=True, **kwargs
    ):
        # scores=False: the folded path (`ops.combine`).
        x, valid = padded_inputs(seed=7, scale=1e4)
        mask = valid[:, :, None] & valid[:, None, :]
        mask[1] = False  # a fully masked example
        self.assert_mixed_precision_outputs(
            GumbelDiscreteAttention,
            {**INIT, "seed": 3, **kwargs},
            (x, x),
            {
                "attention_mask": mask,
                "training": training,
                "return_attention_scores": scores,
            },
        )

    @parameterized.parameters(
        {"training": True},
        {"training": True, "straight_through": True},
        {"training": False, "inference_mode": "sample"},
        {"training": False, "inference_mode": "argmax"},
    )
    def test_masked_keys_are_never_chosen(self, training, **kwargs):
        x, valid = padded_inputs(seed=8, length=6)
        # Padded keys hold huge values: they would win without the mask.
        x = np.where(valid[..., None], x, 50.0).astype("float32")
        layer = GumbelDiscreteAttention(**INIT, seed=5, **kwargs)
        key_mask = np.broadcast_to(valid[:, None, :], (2, 6, 6))
        for _ in range(5):
            _, w = layer(
                x,
                x,
                attention_mask=key_mask,
                use_causal_mask=True,
                return_attention_scores=True,
                training=training,
            )
            w = to_np(w)
            allowed = key_mask & np.tril(np.ones((6, 6), bool))
            allowed = np.broadcast_to(allowed[:, None], w.shape)
            self.assertTrue(np.all(w[~allowed] == 0.0))
            self.assertAllClose(w.sum(-1), 1.0, atol=1e-5)

    @parameterized.parameters(
        {"training": True},
        {"training": True, "straight_through": True},
        {"training": True, "scores": False},
        {"training": True, "straight_through": True, "scores": False},
        {"training": False, "inference_mode": "sample"},
    )
    def test_sample_on_real_tokens_ignores_the_padding_length(
        self, training, scores=True, **kwargs
    ):
        # Quality bar: an output on real tokens must not depend on how
        # much padding follows it. With noise from `keras.random` the
        # whole (B, N, T, S) draw changed with S, so every sample did.
        rng = np.random.default_rng(14)
        lengths = np.array([5, 3])
        layer = GumbelDiscreteAttention(**INIT, seed=4, **kwargs)
        layer(np.zeros((2, 5, 4), "float32"), np.zeros((2, 5, 4), "float32"))
        state = ops.convert_to_numpy(layer.seed_generator.state)
        x = rng.normal(size=(2, 12, 4)).astype("float32")
        results = []
        for total in (5, 8, 12):
            valid = np.arange(total)[None] < lengths[:, None]
            # Padding holds different garbage at each length.
            inputs = np.where(
                valid[..., None], x[:, :total], rng.normal(size=(1,)) * 9
            ).astype("float32")
            layer.seed_generator.state.assign(state)
            out = layer(
                inputs,
                inputs,
                attention_mask=valid[:, :, None] & valid[:, None, :],
                return_attention_scores=scores,
                training=training,
            )
            out, w = out if scores else (out, None)
            results.append((to_np(out), None if w is None else to_np(w)))
        (out_5, w_5) = results[0]
        real = np.arange(5)[None] < lengths[:, None]
        for out, w in results[1:]:
            self.assertAllClose(out[:, :5][real], out_5[real], atol=1e-5)
            if scores:
                self.assertAllClose(w[:, :, :5, :5], w_5, atol=1e-6)
        # Without restoring the generator the next draw differs.
        inputs = x[:, :5]
        again = layer(
            inputs,
            inputs,
            attention_mask=real[:, :, None] & real[:, None, :],
            training=training,
        )
        self.assertGreater(np.abs(to_np(again) - out_5).max(), 1e-3)

    def test_dropout_is_independent_of_the_gumbel_noise(self):
        # MHA seeds its dropout with `seed` too. A Gumbel generator with
        # the same seed drew the same uniforms, so dropout removed exactly
        # the keys with the lowest (TensorFlow) or highest (JAX, torch)
        # noise: dropped entries averaged 0.04 or 0.21 against 0.125.
        x, _ = padded_inputs(seed=13, batch=16, length=8)
        layer = GumbelDiscreteAttention(**INIT, dropout=0.5, seed=3)
        layer(x, x)
        kept = {}

        def recording_dropout(inputs, rate, seed_generator):
            outputs = positional_dropout(inputs, rate, seed_generator)
            kept["mask"] = to_np(outputs) != 0
            return outputs

        with mock.patch.object(
            variant_attention, "positional_dropout", recording_dropout
        ):
            _, w = layer(x, x, return_attention_scores=True, training=True)
        w, mask = to_np(w), kept["mask"]
        # Independent dropout: both means are 1 / S up to sampling noise
        # (standard error about 0.004).
        self.assertAllClose(w[~mask].mean(), 1 / 8, atol=0.03)
        self.assertAllClose(w[mask].mean(), 1 / 8, atol=0.03)

    def test_padded_values_have_no_influence_on_argmax_output(self):
        x, valid = padded_inputs(seed=9)
        mask = valid[:, :, None] & valid[:, None, :]
        layer = GumbelDiscreteAttention(**INIT)
        base = to_np(layer(x, x, attention_mask=mask))
        perturbed = np.where(valid[..., None], x, 100.0).astype("float32")
        out = to_np(layer(perturbed, perturbed, attention_mask=mask))
        self.assertAllClose(base[valid], out[valid], atol=1e-6)

    def test_keras_mask_equals_explicit_mask(self):
        x, valid = padded_inputs(seed=10)
        layer = GumbelDiscreteAttention(**INIT)
        explicit = layer(
            x, x, attention_mask=valid[:, :, None] & valid[:, None, :]
        )
        masked_x = keras.layers.Masking()(np.where(valid[..., None], x, 0.0))
        via_keras_mask = layer(masked_x, masked_x)
        self.assertAllClose(
            to_np(explicit)[valid], to_np(via_keras_mask)[valid], atol=1e-6
        )

    def test_temperature_change_takes_effect_inside_compiled_fit(self):
        x, _ = padded_inputs(seed=11, length=6)
        layer, model = cold_peak_model()

        class HeatUp(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == 1:
                    layer.set_temperature(1000.0)

        history = model.fit(
            x, np.zeros(2), epochs=2, verbose=0, callbacks=[HeatUp()]
        )
        cold, hot = history.history["loss"]
        self.assertGreater(cold, 0.9)
        self.assertLess(hot, 0.3)

    @parameterized.parameters(True, False)
    def test_temperature_set_mid_epoch_reaches_the_next_step(self, synced):
        # On JAX a `fit` holds the variables' values between steps: a
        # change through a held layer reference took no effect and was
        # overwritten at the end of the epoch (peaks 1.0 at every batch,
        # 0.01 after `fit`). Reading `self.model` syncs the state first;
        # without it JAX now refuses the change.
        x = np.random.default_rng(3).random((8, 6, 4)).astype("float32")
        layer, model = cold_peak_model()

        class HeatUp(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if batch == 1:
                    if synced:
                        self.model  # syncs a JAX fit's state
                    layer.set_temperature(1000.0)

        def fit():
            return model.fit(
                x,
                np.zeros(8),
                batch_size=2,
                epochs=1,
                verbose=0,
                callbacks=[HeatUp()],
            )

        if keras.config.backend() == "jax" and not synced:
            with self.assertRaisesRegex(
                ValueError, r"JAX `fit` holds.*Received: value=1000.0"
            ):
                fit()
            return
        # One cold batch (peak ~1), three hot ones (~1/6).
        self.assertLess(fit().history["loss"][0], 0.5)
        self.assertAllClose(layer.temperature, 1000.0)

    def test_invalid_arguments_raise(self):
        for bad in (0.0, -1.0, "1", True, float("inf"), float("nan")):
            with self.assertRaisesRegex(ValueError, "temperature"):
                GumbelDiscreteAttention(**INIT, temperature=bad)
        # NumPy scalars are numbers too.
        layer = GumbelDiscreteAttention(
            **INIT, temperature=np.float32(0.5), seed=np.int64(3)
        )
        layer.set_temperature(np.float64(0.25))
        self.assertEqual(layer.get_config()["seed"], 3)
        self.assertEqual(layer.get_config()["temperature"], 0.25)
        with self.assertRaisesRegex(ValueError, "inference_mode"):
            GumbelDiscreteAttention(**INIT, inference_mode="mode")
        with self.assertRaisesRegex(ValueError, "seed"):
            GumbelDiscreteAttention(**INIT, seed=1.5)
        for bad in ("false", 0, None):
            with self.assertRaisesRegex(
                ValueError, "`straight_through` must be a bool"
            ):
                GumbelDiscreteAttention(**INIT, straight_through=bad)
        layer = GumbelDiscreteAttention(**INIT)
        with self.assertRaisesRegex(ValueError, "temperature"):
            layer.set_temperature(0.0)
        x = np.zeros((2, 5, 4), "float32")
        with self.assertRaisesRegex(ValueError, "attention_mask"):
            layer(x, x, attention_mask=np.ones((2, 5, 3), bool))

    def test_keras_save_load_parity(self):
        x, _ = padded_inputs(seed=12)
        inputs = keras.Input((5, 4))
        layer = GumbelDiscreteAttention(**INIT, temperature=0.5, seed=3)
        model = keras.Model(inputs, layer(inputs, inputs))
        layer.set_temperature(0.25)
        reloaded = self.assert_keras_save_load_parity(model, x)
        self.assertAllClose(to_np(reloaded.layers[-1].temperature), 0.25)


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
    from keras_attnvariants.layers.gumbel_discrete_attention import (
        GumbelDiscreteAttention,
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        layer = GumbelDiscreteAttention(num_heads=2, key_dim=3, seed=1)
        x = np.random.default_rng(0).normal(size=(1, 5, 4)).astype("float32")
        layer(x, x)

    @tf.function
    def step():
        def replica_fn():
            return layer(x, x, return_attention_scores=True, training=True)[1]
        return strategy.run(replica_fn)

    # Three steps x two replicas: six samples, all different (a seed of
    # `counter + replica` made replica 0 at step k + 1 redraw replica 1's
    # noise of step k).
    samples = [
        np.asarray(w)
        for _ in range(3)
        for w in strategy.experimental_local_results(step())
    ]
    print("MAXDIFF", float(np.abs(samples[0] - samples[1]).max()))
    print("MINDIFF", min(
        float(np.abs(a - b).max())
        for i, a in enumerate(samples)
        for b in samples[i + 1:]
    ))
    """
)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute")
@pytest.mark.slow
def test_mirrored_replicas_draw_different_noise():
    lines = run_script(MIRRORED_SCRIPT)
    assert float(lines["MAXDIFF"]) > 1e-3, lines
    assert float(lines["MINDIFF"]) > 1e-3, lines
