"""keras-hub task models on converted backbones: a few `fit` steps each.

BERT's task models are fitted in conversion_test.py and
attention_weights_test.py; here RoBERTa, ALBERT, DistilBERT, ELECTRA (which
has no task model in keras-hub 0.32: a small functional classifier) and
GPT-2 (a causal LM with a causal variant, plus `.keras` and SavedModel
round trips). Tiny random backbones, preprocessed integer inputs.
"""

import os

import keras
import numpy as np
import pytest
from conversion_test import ENCODERS
from conversion_test import backbone_inputs
from conversion_test import gpt2

import keras_attnvariants as kav
import keras_attnvariants.backbones  # noqa: F401 (registers the reloader)
from keras_attnvariants.backbones.conversion import convert_backbone
from keras_attnvariants.backbones.conversion import self_attention_layers
from keras_attnvariants.testing.test_case import TestCase

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)

SPARSE_CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
PROJECTIONS = ("_query_dense", "_key_dense", "_value_dense", "_output_dense")


def numpy_outputs(outputs):
    return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)


def attention_trainables(backbone):
    """`{path: value}` of the converted attention layers' trainables."""
    return {
        v.path: np.array(keras.ops.convert_to_numpy(v))
        for layer in self_attention_layers(backbone)
        for v in layer.trainable_weights
    }


def must_change(backbone):
    """Paths of the attention variables a training step must move.

    The four projection kernels (the query and key kernels only move if
    gradients flow through the attention weights) and every trainable
    variable beyond the projections (HNAS's mixing weights). Biases are
    left out: softmax-like rows are shift invariant, so the key bias gets
    no gradient.
    """
    paths = []
    for layer in self_attention_layers(backbone):
        paths += [getattr(layer, name).kernel.path for name in PROJECTIONS]
        projections = {
            v.path for name in PROJECTIONS for v in getattr(layer, name).weights
        }
        paths += [
            v.path for v in layer.trainable_weights if v.path not in projections
        ]
    return paths


def traced():
    """Compile arguments of a traced train step: without XLA's compile
    time on TensorFlow; jitted on JAX, whose un-jitted steps dispatch op by
    op and take seconds each."""
    if keras.backend.backend() == "tensorflow":
        return {"jit_compile": False}
    return {}


def eager():
    """Compile arguments of a cheap train step for two or three steps:
    eager on TensorFlow (tracing costs more than it saves), jitted on JAX."""
    if keras.backend.backend() == "tensorflow":
        return {"run_eagerly": True}
    return {}


def lm_targets(data):
    """Next-token labels and sample weights for a causal LM."""
    labels = np.roll(data["token_ids"], -1, axis=1)
    weights = np.roll(data["padding_mask"], -1, axis=1)
    weights[:, -1] = 0
    return labels, weights.astype("float32")


class FitCheckTestCase(TestCase):
    """`fit_and_check` and `check_terms`, shared by the classes below."""

    def setUp(self):
        super().setUp()
        keras.utils.set_random_seed(0)

    def fit_and_check(
        self,
        model,
        backbone,
        data,
        labels,
        sample_weight=None,
        steps=3,
        **compile_kwargs,
    ):
        """Fits `model` `steps` steps (batch = the whole data); checks that
        the loss is finite and the converted attention layers trained."""
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=SPARSE_CE,
            **compile_kwargs,
        )
        before = attention_trainables(backbone)
        paths = must_change(backbone)
        self.assertNotEmpty(paths)
        self.assertContainsSubset(
            paths, list(before), "attention variables are not trainable"
        )
        history = model.fit(
            data,
            labels,
            sample_weight=sample_weight,
            batch_size=len(labels),
            epochs=steps,
            verbose=0,
        )
        losses = history.history["loss"]
        self.assertLen(losses, steps)
        self.assertTrue(np.all(np.isfinite(losses)), f"losses: {losses}")
        after = attention_trainables(backbone)
        unchanged = [p for p in paths if np.array_equal(before[p], after[p])]
        self.assertEqual(unchanged, [], "attention weights not trained")
        for value in after.values():
            self.assertTrue(np.all(np.isfinite(value)))
        return history

    def added_losses(self, model, data, training=True):
        """The losses a forward pass of `model` adds.

        TensorFlow: `model.losses` after an eager call. JAX: the losses
        `stateless_call` returns, jitted as in the JAX trainer (an eager
        call dispatches op by op and takes seconds); it leaves the model's
        state (e.g. a guidance term's step counter) unchanged.
        """
        if keras.backend.backend() != "jax":
            model(data, training=training)
            return model.losses
        import jax

        def forward(trainable, non_trainable, data):
            _, _, losses = model.stateless_call(
                trainable,
                non_trainable,
                data,
                training=training,
                return_losses=True,
            )
            return losses

        return jax.jit(forward)(
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            data,
        )

    def check_terms(self, model, backbone, data, history, terms, calls):
        """Each attached term (one instance shared by every converted layer)
        adds one loss per call of a converted layer in training, and none
        at inference."""
        layers = self_attention_layers(backbone)
        for layer in layers:
            self.assertEqual(
                [id(t) for t in layer.attention_losses],
                [id(t) for t in terms],
            )
        values = [
            float(keras.ops.convert_to_numpy(x))
            for x in self.added_losses(model, data)
        ]
        self.assertLen(values, len(terms) * calls)
        self.assertTrue(np.all(np.isfinite(values)), f"{values}")
        if terms:
            self.assertGreater(min(values), 0.0)
        if keras.backend.backend() == "tensorflow":
            # A `fit` metric per term (the JAX trainer drops metric updates
            # made inside layers; the loss applies on every backend).
            for term in terms:
                self.assertIn(term.name, history.history)
                self.assertGreater(history.history[term.name][-1], 0.0)
        # Terms run in training only.
        self.assertEmpty(self.added_losses(model, data, training=False))


class TaskModelFitTest(FitCheckTestCase):
    def test_roberta_text_classifier_with_hnas_and_kq_alignment(self):
        term = kav.KQAlignment(method="mmd", weight=1.0, name="kq_mmd")
        backbone = convert_backbone(
            ENCODERS["roberta"](),
            kav.HybridAttention,
            hybrid_init=0.5,
            attention_losses=[term],
        )
        model = keras_hub.models.RobertaTextClassifier(
            backbone=backbone, num_classes=3, preprocessor=None
        )
        data = backbone_inputs(backbone, lengths=(6, 4, 5))
        self.assertEqual(sorted(data), ["padding_mask", "token_ids"])
        labels = np.array([0, 1, 2])
        history = self.fit_and_check(model, backbone, data, labels, **traced())
        self.check_terms(model, backbone, data, history, [term], calls=2)
        # The mixing weights stay in [0, 1].
        for layer in self_attention_layers(backbone):
            u = keras.ops.convert_to_numpy(layer.hybrid_weight)
            self.assertTrue(np.all((u >= 0.0) & (u <= 1.0)))

    def test_albert_masked_lm_with_dnas_and_guidance(self):
        # ALBERT's 3 depths share one attention layer: one converted
        # layer, applied (and adding the term) once per depth.
        term = kav.AttentionGuidanceRegularizer(
            {0: "next", 1: "prev"}, alpha=1.0, name="guidance"
        )
        backbone = convert_backbone(
            ENCODERS["albert"](),
            kav.DoublyNormalizedAttention,
            iterations=2,
            attention_losses=[term],
        )
        self.assertLen(self_attention_layers(backbone), 1)
        model = keras_hub.models.AlbertMaskedLM(
            backbone=backbone, preprocessor=None
        )
        data = backbone_inputs(backbone, lengths=(6, 4, 5, 3))
        data["mask_positions"] = np.array(
            [[1, 3], [0, 2], [4, 1], [0, 2]], "int32"
        )
        labels = np.take_along_axis(
            data["token_ids"], data["mask_positions"], axis=1
        )
        history = self.fit_and_check(model, backbone, data, labels, **eager())
        # The guidance term's step counter advanced once per train step,
        # not once per depth.
        self.assertEqual(int(keras.ops.convert_to_numpy(term.step)), 3)
        self.check_terms(model, backbone, data, history, [term], calls=3)

    def test_distil_bert_text_classifier_with_gumbel(self):
        backbone = convert_backbone(
            ENCODERS["distil_bert"](),
            kav.GumbelDiscreteAttention,
            seed=3,
        )
        model = keras_hub.models.DistilBertTextClassifier(
            backbone=backbone, num_classes=2, preprocessor=None
        )
        data = backbone_inputs(backbone, lengths=(6, 3))
        self.assertEqual(sorted(data), ["padding_mask", "token_ids"])
        history = self.fit_and_check(
            model, backbone, data, np.array([1, 0]), **eager()
        )
        # No term attached: no loss beyond the task's.
        self.check_terms(model, backbone, data, history, [], calls=2)

    def test_electra_backbone_in_functional_classifier(self):
        # keras-hub 0.32 has no ELECTRA task model (only ElectraBackbone
        # and ElectraTokenizer): a small functional classifier on the
        # pooled output stands in for one.
        self.assertFalse(
            any(
                name.startswith("Electra") and name.endswith(("LM", "ifier"))
                for name in dir(keras_hub.models)
            )
        )
        term = kav.KQAlignment(method="mmd", weight=1.0, name="kq_mmd")
        backbone = convert_backbone(
            ENCODERS["electra"](),
            kav.HybridAttention,
            hybrid_init=0.3,
            attention_losses=[term],
        )
        inputs = {
            name: keras.Input(shape=(None,), dtype="int32", name=name)
            for name in ("token_ids", "segment_ids", "padding_mask")
        }
        pooled = backbone(inputs)["pooled_output"]
        model = keras.Model(inputs, keras.layers.Dense(2)(pooled))
        data = backbone_inputs(backbone, lengths=(6, 4))
        self.assertEqual(sorted(data), sorted(inputs))
        labels = np.array([0, 1])
        history = self.fit_and_check(model, backbone, data, labels, **traced())
        self.check_terms(model, backbone, data, history, [term], calls=2)
        # The wrapper reloads with the converted backbone inside.
        reloaded = self.assert_keras_save_load_parity(model, data, atol=0)
        layers = self_attention_layers(reloaded.get_layer(backbone.name))
        self.assertTrue(all(type(x) is kav.HybridAttention for x in layers))


class GPT2CausalLMTest(FitCheckTestCase):
    """GPT2CausalLM on a GPT-2 backbone converted to Gumbel attention."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        keras.utils.set_random_seed(0)
        cls.term = kav.KQAlignment(method="mmd", weight=1.0, name="kq_mmd")
        cls.backbone = convert_backbone(
            gpt2(),
            kav.GumbelDiscreteAttention,
            seed=7,
            attention_losses=[cls.term],
        )
        cls.model = keras_hub.models.GPT2CausalLM(
            backbone=cls.backbone, preprocessor=None
        )
        cls.data = backbone_inputs(cls.backbone, lengths=(8, 6, 5, 3), total=8)
        # Trained once; the tests below use the trained model (the round
        # trips do not change it).
        cls.trained = False

    def train(self):
        if type(self).trained:
            return
        labels, weights = lm_targets(self.data)
        history = self.fit_and_check(
            self.model,
            self.backbone,
            self.data,
            labels,
            sample_weight=weights,
            **traced(),
        )
        self.check_terms(
            self.model, self.backbone, self.data, history, [self.term], 2
        )
        type(self).trained = True

    def test_fit(self):
        layers = self_attention_layers(self.backbone)
        self.assertLen(layers, 2)
        for layer in layers:
            self.assertIsInstance(layer, kav.GumbelDiscreteAttention)
            self.assertIsInstance(
                layer, keras_hub.layers.CachedMultiHeadAttention
            )
        self.assertEqual(sorted(self.data), ["padding_mask", "token_ids"])
        self.train()

    def test_keras_round_trip(self):
        self.train()
        expected = numpy_outputs(self.model(self.data))
        self.assertEqual(expected.shape, (4, 8, 50))
        path = os.path.join(self.get_temp_dir(), "gpt2_lm.keras")
        self.model.save(path)
        reloaded = keras.saving.load_model(path)
        self.assertIsInstance(reloaded, keras_hub.models.GPT2CausalLM)
        self.assertIsInstance(reloaded.backbone, keras_hub.models.GPT2Backbone)
        layers = self_attention_layers(reloaded.backbone)
        self.assertLen(layers, 2)
        for layer, original in zip(
            layers, self_attention_layers(self.backbone)
        ):
            self.assertIsInstance(layer, kav.GumbelDiscreteAttention)
            self.assertIsInstance(
                layer, keras_hub.layers.CachedMultiHeadAttention
            )
            self.assertEqual(layer.seed, original.seed)
            (term,) = layer.attention_losses
            self.assertIsInstance(term, kav.KQAlignment)
            self.assertIs(term, layers[0].attention_losses[0])
        self.assertEqual(
            sorted(v.path for v in reloaded.weights),
            sorted(v.path for v in self.model.weights),
        )
        self.assertAllClose(
            numpy_outputs(reloaded(self.data)), expected, atol=0
        )
        # The reloaded term still applies in training.
        self.assertLen(self.added_losses(reloaded, self.data), 2)

    def test_kv_cache_steps_match_full_forward(self):
        # `generate`'s path: prefill a cache on a prompt padded with 0s,
        # then feed the true tokens one by one through the cached call of
        # the converted layers; the logits must be the full forward's.
        self.train()
        data = backbone_inputs(self.backbone, lengths=(8, 8), total=8)
        token_ids = data["token_ids"]
        expected = numpy_outputs(self.model(data))[:, 4:]
        prompt = token_ids.copy()
        prompt[:, 4:] = 0
        _, cache = self.model._build_cache(prompt)
        steps = []
        for index in range(4, 8):
            logits, _, cache = self.model.call_with_cache(
                token_ids[:, index : index + 1], cache, index
            )
            steps.append(numpy_outputs(logits)[:, 0])
        self.assertAllClose(np.stack(steps, axis=1), expected, atol=1e-5)

    def test_saved_model_export(self):
        if keras.backend.backend() != "tensorflow":
            self.skipTest("SavedModel export is tested on TensorFlow")
        import tensorflow as tf

        self.train()
        expected = numpy_outputs(self.model(self.data))
        path = os.path.join(self.get_temp_dir(), "gpt2_lm_saved")
        self.model.export(path, verbose=False)
        # Keep the loaded object: its variables die with it.
        loaded = tf.saved_model.load(path)
        served = loaded.serve({k: tf.constant(v) for k, v in self.data.items()})
        self.assertAllClose(np.asarray(served), expected, atol=1e-6)
