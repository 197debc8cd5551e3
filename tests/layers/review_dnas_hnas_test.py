"""Review checks of `DoublyNormalizedAttention` and `HybridAttention`."""

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

import keras_attnvariants as kav
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.test_case import TestCase

INIT = {"num_heads": 2, "key_dim": 3}
CLASSES = (kav.DoublyNormalizedAttention, kav.HybridAttention)


class FusedMixedPrecisionTest(TestCase):
    @parameterized.parameters(
        *[(cls, masked) for cls in CLASSES for masked in (False, True)]
    )
    def test_fused_float16_gradients_finite_with_extreme_logits(
        self, cls, masked
    ):
        # The fused path runs float16 in float32. The DNAS bias and the
        # kernel each upcast the float16 projections on their own, so each
        # branch's large (mutually cancelling) gradient was cast back to
        # float16 apart: inf - inf = NaN for logits near 1e5.
        if keras.config.backend() == "torch":
            self.skipTest("Torch CPU kernels lack float16 matmuls.")
        rng = np.random.default_rng(4)
        x = (rng.normal(size=(2, 5, 6)) * 1e3).astype("float32")
        upstream = rng.normal(size=(2, 5, 6)).astype("float32")
        mask = None
        if masked:
            mask = rng.random((2, 5, 5)) < 0.7
            mask[0, 1] = False  # a query with no valid key
            mask[1] = False  # a fully masked example
        layer = cls(**INIT, attention_path="fused", dtype="mixed_float16")
        layer(x, x)

        def attend(q):
            out = layer(q, q, attention_mask=mask, training=True)
            self.assertEqual(
                keras.backend.standardize_dtype(out.dtype), "float16"
            )
            return ops.cast(out, "float32")

        self.assertTrue(np.all(np.isfinite(ops.convert_to_numpy(attend(x)))))
        (grad,) = gradients(attend, upstream, x)
        self.assertTrue(np.all(np.isfinite(grad)))
        if masked:
            self.assertEqual(float(np.abs(grad[1]).max()), 0.0)


def paired_layers(cls, query, value, **kwargs):
    """An explicit-path and a fused-path layer with the same weights."""
    layers = {}
    for path in ("explicit", "fused"):
        layer = cls(**INIT, attention_path=path, **kwargs)
        layer(query, value)
        layers[path] = layer
    layers["fused"].set_weights(layers["explicit"].get_weights())
    return layers


class PathAndPaddingTest(TestCase):
    @parameterized.parameters(
        *[(cls, path) for cls in CLASSES for path in ("explicit", "fused")]
    )
    def test_cross_attention_padding_never_changes_real_outputs(
        self, cls, path
    ):
        # Keras masks on both inputs: padded queries stay out of every
        # key's normalization over queries, padded keys get no weight.
        rng = np.random.default_rng(7)
        query = rng.normal(size=(1, 3, 4)).astype("float32") * 2
        value = rng.normal(size=(1, 4, 4)).astype("float32") * 2
        layer = cls(**INIT, attention_path=path)
        outputs = []
        for pad in (0, 2, 5):
            padded_q = np.concatenate([query, np.full((1, pad, 4), 7.0)], 1)
            padded_v = np.concatenate([value, np.full((1, pad + 1, 4), 7.0)], 1)
            out = layer(
                keras.layers.Masking(7.0)(padded_q.astype("float32")),
                keras.layers.Masking(7.0)(padded_v.astype("float32")),
            )
            outputs.append(ops.convert_to_numpy(out)[:, :3])
        self.assertAllClose(outputs[0], outputs[1], atol=1e-6)
        self.assertAllClose(outputs[0], outputs[2], atol=1e-6)

    @parameterized.parameters(*CLASSES)
    def test_fused_gradients_equal_explicit(self, cls):
        rng = np.random.default_rng(8)
        query = rng.normal(size=(2, 4, 6)).astype("float32")
        value = rng.normal(size=(2, 5, 6)).astype("float32")
        upstream = rng.normal(size=(2, 4, 6)).astype("float32")
        mask = rng.random((2, 4, 5)) < 0.7
        mask[1, 2] = False  # a query with no valid key
        layers = paired_layers(cls, query, value)
        got = {}
        for path, layer in layers.items():

            def attend(q, v, layer=layer):
                return layer(q, v, attention_mask=mask, training=True)

            got[path] = gradients(attend, upstream, query, value)
        for g, w in zip(got["fused"], got["explicit"]):
            self.assertTrue(np.all(np.isfinite(g)))
            self.assertAllClose(g, w, atol=1e-5)
