import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants.backbones.conversion import convert_backbone
from keras_attnvariants.backbones.conversion import self_attention_layers
from keras_attnvariants.testing.test_case import TestCase

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)


def tiny_bert():
    return keras_hub.models.BertBackbone(
        vocabulary_size=50,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=8,
    )


def converted_bert():
    converted = convert_backbone(
        tiny_bert(), kav.HybridAttention, hybrid_init=0.0
    )
    # Non-trivial mixing weights, so a reload that loses them shows.
    for i, layer in enumerate(self_attention_layers(converted)):
        layer.hybrid_weight.assign([0.3 + 0.2 * i, 0.9])
    return converted


def inputs():
    valid = np.arange(6)[None] < np.array([6, 4])[:, None]
    ids = np.random.default_rng(0).integers(1, 50, size=valid.shape)
    return {
        "token_ids": np.where(valid, ids, 0).astype("int32"),
        "segment_ids": np.zeros(valid.shape, "int32"),
        "padding_mask": valid.astype("int32"),
    }


def numpy_outputs(outputs):
    return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)


class SerializationTest(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # One converted backbone for all tests; none of them changes it.
        cls.backbone = converted_bert()
        cls.expected = numpy_outputs(cls.backbone(inputs()))

    def test_keras_round_trip_keeps_class_and_outputs(self):
        backbone = self.backbone
        path = os.path.join(self.get_temp_dir(), "backbone.keras")
        backbone.save(path)
        reloaded = keras.saving.load_model(path)
        self.assertIsInstance(reloaded, keras_hub.models.BertBackbone)
        layers = self_attention_layers(reloaded)
        self.assertTrue(all(type(x) is kav.HybridAttention for x in layers))
        self.assertTrue(all(x.self_attention_padding for x in layers))
        self.assertLen(reloaded.weights, len(backbone.weights))
        got = numpy_outputs(reloaded(inputs()))
        expected = self.expected
        for key in ("sequence_output", "pooled_output"):
            self.assertAllClose(got[key], expected[key], atol=1e-6)
        self.assertAllClose(np.asarray(layers[1].hybrid_weight), [0.5, 0.9])

    def test_task_model_round_trip(self):
        classifier = keras_hub.models.BertTextClassifier(
            backbone=self.backbone, num_classes=2, preprocessor=None
        )
        self.assert_keras_save_load_parity(classifier, inputs())

    def test_reload_in_fresh_process_without_keras_hub_import(self):
        backbone = self.backbone
        path = os.path.join(self.get_temp_dir(), "fresh.keras")
        backbone.save(path)
        expected = keras.ops.convert_to_numpy(
            backbone(inputs())["sequence_output"]
        )
        np.save(path + ".npy", expected)
        code = (
            "import sys, numpy as np, keras\n"
            "import keras_attnvariants.backbones\n"
            "assert 'keras_hub' not in sys.modules\n"
            f"m = keras.saving.load_model({path!r})\n"
            "x = {'token_ids': np.load(%r + '.x.npy'),\n"
            "     'segment_ids': np.zeros((2, 6), 'int32'),\n"
            "     'padding_mask': np.load(%r + '.m.npy')}\n"
            "out = keras.ops.convert_to_numpy(m(x)['sequence_output'])\n"
            "print(type(m).__mro__[2].__name__,\n"
            "      np.abs(out - np.load(%r + '.npy')).max())\n"
        ) % (path, path, path)
        np.save(path + ".x.npy", inputs()["token_ids"])
        np.save(path + ".m.npy", inputs()["padding_mask"])
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
        )
        name, diff = out.stdout.split()[-2:]
        self.assertEqual(name, "BertBackbone")
        self.assertLess(float(diff), 1e-6)

    def test_export_to_saved_model(self):
        if keras.backend.backend() != "tensorflow":
            self.skipTest("SavedModel export is tested on TensorFlow")
        import tensorflow as tf

        backbone = self.backbone
        path = os.path.join(self.get_temp_dir(), "saved_model")
        backbone.export(path, verbose=False)
        # Keep the loaded object: its variables die with it.
        loaded = tf.saved_model.load(path)
        served = loaded.serve({k: tf.constant(v) for k, v in inputs().items()})
        expected = self.expected
        for key in ("sequence_output", "pooled_output"):
            self.assertAllClose(served[key].numpy(), expected[key], atol=1e-6)

    def test_attached_adversary_is_built_saved_and_reloaded(self):
        # One CT term shared by both blocks, as `convert_backbone` attaches
        # it: built with the layers (a converted backbone is never called
        # symbolically), saved once and reloaded shared, with its weights.
        term = kav.KQAlignment(method="ct", name="align")
        converted = convert_backbone(
            tiny_bert(),
            kav.HybridAttention,
            hybrid_init=0.0,
            attention_losses=[term],
        )
        layers = self_attention_layers(converted)
        shared = layers[0].attention_losses[0]
        self.assertIs(layers[1].attention_losses[0], shared)
        self.assertTrue(shared.built)
        self.assertLen(shared.weights, 12)  # critic 4 + navigator 2 dense
        rng = np.random.default_rng(3)
        for variable in shared.weights:
            variable.assign(rng.normal(size=variable.shape))
        expected = [np.asarray(v) for v in shared.weights]
        path = os.path.join(self.get_temp_dir(), "aligned.keras")
        converted.save(path)
        reloaded = keras.saving.load_model(path)
        layers = self_attention_layers(reloaded)
        term = layers[0].attention_losses[0]
        self.assertIs(layers[1].attention_losses[0], term)
        self.assertLen(term.weights, 12)
        for got, want in zip(term.weights, expected):
            self.assertAllClose(np.asarray(got), want)
