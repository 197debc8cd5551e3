"""`attention_path="auto"`: the per-backend choice and its equivalence."""

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.layers.doubly_normalized_attention import (
    DoublyNormalizedAttention,
)
from keras_attnvariants.layers.hybrid_attention import HybridAttention
from keras_attnvariants.layers.variant_attention import accelerator_available
from keras_attnvariants.layers.variant_attention import prefer_fused_path
from keras_attnvariants.testing.test_case import TestCase


class AttentionPathTest(TestCase):
    def test_auto_choice_per_backend(self):
        # Measured on CPU (docs/benchmarks.md): explicit under TensorFlow
        # and JAX, fused under PyTorch; fused on accelerators.
        want = keras.config.backend() == "torch" or accelerator_available()
        self.assertEqual(prefer_fused_path(), want)
        layer = DoublyNormalizedAttention(num_heads=2, key_dim=3)
        self.assertEqual(layer._use_fused(need_weights=False), want)
        self.assertFalse(layer._use_fused(need_weights=True))

    @parameterized.parameters(DoublyNormalizedAttention, HybridAttention)
    def test_auto_equals_explicit_and_fused(self, cls):
        rng = np.random.default_rng(0)
        query = rng.normal(size=(2, 5, 4)).astype("float32")
        value = rng.normal(size=(2, 7, 4)).astype("float32")
        mask = np.ones((2, 5, 7), bool)
        mask[1, 3:] = False
        mask[1, :, 5:] = False
        weights = None
        outputs = []
        for path in ("auto", "explicit", "fused"):
            layer = cls(num_heads=2, key_dim=3, attention_path=path, seed=1)
            layer(query, value)
            if weights is None:
                weights = layer.get_weights()
            layer.set_weights(weights)
            out = layer(query, value, attention_mask=mask)
            outputs.append(ops.convert_to_numpy(out))
        self.assertAllClose(outputs[0], outputs[1], atol=1e-6)
        self.assertAllClose(outputs[0], outputs[2], atol=1e-5)
