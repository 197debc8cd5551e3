"""How attached loss terms show in `model.metrics` and `fit` logs."""

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

import keras_attnvariants as kav
from keras_attnvariants.losses.attention_loss import AttentionLoss
from keras_attnvariants.testing.test_case import TestCase


class QueryMean(AttentionLoss):
    """Mean of the projected queries: cheap, with a known value."""

    needs_attention_weights = False

    def compute_loss_value(self, query):
        return ops.mean(ops.cast(query, "float32"))

    def from_attention(self, context):
        return self(context["query"])


def stacked_model(terms_per_layer, layers=3):
    inputs = keras.Input((5, 8))
    x = inputs
    for index in range(layers):
        x = kav.HybridAttention(
            num_heads=2,
            key_dim=4,
            hybrid_init=0.0,
            attention_losses=terms_per_layer(index),
        )(x, x)
    model = keras.Model(inputs, x)
    model.compile("sgd", "mse")
    return model


class AttentionLossMetricsTest(TestCase, parameterized.TestCase):
    @parameterized.named_parameters(("shared", True), ("per_layer", False))
    def test_each_tracker_listed_once(self, shared):
        one = QueryMean(name="q_mean")
        model = stacked_model(
            lambda i: [one if shared else QueryMean(name=f"q_mean_{i}")]
        )
        names = [metric.name for metric in model.metrics]
        # Keras visits every nested layer and adds its recursive `metrics`:
        # without `VariantAttention.metrics` a term shared by 3 layers was
        # listed 4 times, an unshared one twice.
        self.assertEqual(len(names), len(set(names)), names)
        ids = [id(v) for v in model.metrics_variables]
        self.assertEqual(len(ids), len(set(ids)))
        want = 1 if shared else 3
        trackers = [n for n in names if n.startswith("q_mean")]
        if keras.config.backend() == "jax":
            self.assertEqual(trackers, [])
        else:
            self.assertLen(trackers, want)

    @parameterized.named_parameters(
        ("float32", "float32"), ("mixed_bfloat16", "mixed_bfloat16")
    )
    def test_fit_logs_the_term_or_nothing_never_a_stale_zero(self, policy):
        # Under a mixed policy the term runs inside the attention layer's
        # autocast scope; on torch a metric updated there wrote to a
        # bfloat16 copy of its variables and stayed 0.0 (terms now turn off
        # autocasting).
        rng = np.random.default_rng(0)
        x = rng.normal(size=(4, 5, 8)).astype("float32")
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(policy)
        try:
            term = QueryMean(name="q_mean")
            model = stacked_model(lambda i: [term], layers=2)
        finally:
            keras.config.set_dtype_policy(previous)
        history = model.fit(x, np.zeros_like(x), epochs=1, verbose=0)
        if keras.config.backend() == "jax":
            # The JAX trainer drops metric updates made inside layers.
            self.assertNotIn("q_mean", history.history)
            self.assertIsNone(term.loss_tracker)
        else:
            value = history.history["q_mean"][0]
            self.assertTrue(np.isfinite(value))
            self.assertNotEqual(value, 0.0)

    def test_metric_weights_each_call_by_its_batch_size(self):
        # As Keras averages the loss: a short last batch weighs less. With
        # unweighted updates the logged value drifted from the per-example
        # mean whenever the data did not fill the last batch.
        if keras.config.backend() == "jax":
            self.skipTest("the JAX trainer drops metric updates in layers")
        rng = np.random.default_rng(0)
        term = kav.KQAlignment(method="mmd", weight=1.0)
        values = []
        for batch, shift in ((4, 1.0), (1, 3.0)):
            q = rng.normal(size=(batch, 5, 2, 4)).astype("float32")
            k = rng.normal(size=(batch, 5, 2, 4)).astype("float32") + shift
            values.append(float(keras.ops.convert_to_numpy(term(q, k))))
        got = float(keras.ops.convert_to_numpy(term.loss_tracker.result()))
        self.assertAllClose(got, (4 * values[0] + values[1]) / 5, atol=1e-5)
        self.assertNotAllClose(got, np.mean(values), atol=1e-3)

    def test_term_is_in_the_training_loss_on_every_backend(self):
        x = np.random.default_rng(1).normal(size=(4, 5, 8)).astype("float32")
        model = stacked_model(lambda i: [QueryMean(name="q_mean")], layers=1)
        model.compile(keras.optimizers.SGD(0.0), "mse")
        loss = model.train_on_batch(x, np.zeros_like(x), return_dict=True)
        attention = model.layers[1]
        term = ops.mean(attention._query_dense(x))
        mse = np.mean(np.square(model.predict(x, verbose=0)))
        self.assertAllClose(loss["loss"], mse + term, atol=1e-5)

    def test_shared_term_counts_every_layer_in_the_training_loss(self):
        # The JAX trainer calls the model's `call`, so each attention layer
        # opened its own Keras call context, which cleared what the shared
        # term had added for the layers before it: only the last layer's
        # value reached the loss.
        x = np.random.default_rng(2).normal(size=(4, 5, 8)).astype("float32")
        term = QueryMean(name="q_mean")
        model = stacked_model(lambda i: [term], layers=2)
        model.compile(keras.optimizers.SGD(0.0), "mse")
        loss = model.train_on_batch(x, np.zeros_like(x), return_dict=True)
        first, second = model.layers[1], model.layers[2]
        hidden = first(x, x)
        want = ops.mean(first._query_dense(x)) + ops.mean(
            second._query_dense(hidden)
        )
        mse = np.mean(np.square(model.predict(x, verbose=0)))
        self.assertAllClose(loss["loss"], mse + want, atol=1e-5)

    def test_attention_layer_metrics_exclude_terms_only(self):
        term = QueryMean(name="q_mean")
        layer = kav.HybridAttention(
            num_heads=2, key_dim=4, attention_losses=[term]
        )
        layer(np.zeros((1, 3, 8), "float32"), np.zeros((1, 3, 8), "float32"))
        self.assertEqual(layer.metrics, [])
        if keras.config.backend() != "jax":
            self.assertEqual(term.metrics, [term.loss_tracker])

    def test_track_metric_must_be_a_bool(self):
        # `bool("false")` turned the tracker on without a word.
        for bad in ("false", 0, None):
            with self.assertRaisesRegex(
                ValueError,
                r"`track_metric` must be a bool\. Received: track_metric=",
            ):
                QueryMean(track_metric=bad)
        term = QueryMean(track_metric=np.bool_(False))
        self.assertIs(term.get_config()["track_metric"], False)
        self.assertIsNone(term.loss_tracker)
