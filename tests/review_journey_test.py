"""Findings of a user-journey review (2026-11-26), each a test that fails
without its fix.

- A subclassed model holding a guidance term could not `fit` on JAX or
  PyTorch: the term's step counter was created from a concrete value inside
  `fit`'s stateless symbolic build.
- `TwoStreamBlock` on Keras-masked streams warned on every traced call that
  its projections would "destroy the mask information" (the masks were
  used; the warnings were noise).
- DNAS and HNAS under a `float64` policy returned float64 tensors computed
  in float32.
"""

import warnings

import keras
import numpy as np
from absl.testing import parameterized

import keras_attnvariants as kav
from keras_attnvariants.testing.test_case import TestCase


def _tokens():
    rng = np.random.default_rng(0)
    x = rng.integers(3, 30, (8, 6)).astype("int32")
    x[:3, 4:] = 0
    return x, rng.integers(0, 2, (8,))


class GuidedClassifier(keras.Model):
    """A subclassed model: its layers are built by `fit`'s symbolic call."""

    def __init__(self, attached):
        super().__init__()
        self.embed = keras.layers.Embedding(30, 16, mask_zero=True)
        self.guidance = kav.AttentionGuidanceRegularizer(
            {0: "next"}, alpha=1.0, name="guide"
        )
        if attached:
            self.attention = kav.DoublyNormalizedAttention(
                2, 8, attention_losses=[self.guidance]
            )
        else:
            self.attention = keras.layers.MultiHeadAttention(2, 8)
        self.attached = attached
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.head = keras.layers.Dense(2)

    def call(self, x, training=None):
        h = self.embed(x)
        if self.attached:
            h = self.attention(h, h, training=training)
        else:
            h, weights = self.attention(
                h, h, return_attention_scores=True, training=training
            )
            self.guidance(weights, training=training)
        return self.head(self.pool(h))


class GuidanceInSubclassedModelTest(TestCase):
    @parameterized.named_parameters(("attached", True), ("called", False))
    def test_fit_trains_and_advances_the_step(self, attached):
        keras.utils.set_random_seed(0)
        x, y = _tokens()
        model = GuidedClassifier(attached)
        model.compile(
            "adam",
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=keras.backend.backend() != "torch",
        )
        history = model.fit(x, y, epochs=2, batch_size=4, verbose=0)
        self.assertTrue(np.all(np.isfinite(history.history["loss"])))
        # 2 epochs of 2 steps; the symbolic build is no training step.
        self.assertEqual(float(model.guidance.step.value), 4.0)


class TwoStreamMaskWarningTest(TestCase):
    @parameterized.parameters("two_stream", "single_stream")
    def test_keras_masked_streams_give_no_mask_warning(self, mode):
        tokens = keras.Input((5,), dtype="int32")
        x = keras.layers.Embedding(10, 8, mask_zero=True)(tokens)
        block = kav.TwoStreamBlock(8, 2, 16, mode=mode)
        if mode == "two_stream":
            (g, h), _ = block((x, x))
            out = keras.layers.GlobalAveragePooling1D()(h)
        else:
            g, _ = block(x)
            out = keras.layers.GlobalAveragePooling1D()(g)
        model = keras.Model(tokens, out)
        batch = np.array([[3, 4, 5, 0, 0], [1, 2, 3, 4, 0]])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            padded = model(batch)
        # The masks are still used: padding after the real tokens changes
        # nothing on them (pooled over the real tokens only).
        longer = np.concatenate([batch, np.zeros((2, 3), "int32")], 1)
        tokens_long = keras.Input((8,), dtype="int32")
        x_long = model.layers[1](tokens_long)
        if mode == "two_stream":
            (_, h_long), _ = block((x_long, x_long))
        else:
            h_long, _ = block(x_long)
        pooled = keras.layers.GlobalAveragePooling1D()(h_long)
        self.assertAllClose(
            keras.Model(tokens_long, pooled)(longer), padded, atol=1e-5
        )
