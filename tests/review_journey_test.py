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
import pytest
from absl.testing import parameterized

# The examples' tiny BERT (pytest puts `tests/` on the path).
from examples_test import _tiny_bert

import keras_attnvariants as kav
from keras_attnvariants.ops.combine import doubly_normalized_attend
from keras_attnvariants.testing import autodiff_reference
from keras_attnvariants.testing import numpy_reference as reference
from keras_attnvariants.testing.gradients import gradients
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


class Float64PolicyTest(TestCase):
    """A float64 layer or float64 scores compute in float64 (half types
    still compute in float32). They returned float64 tensors with float32
    accuracy: errors near 5e-8 where keras MHA's are near 1e-16."""

    def setUp(self):
        super().setUp()
        if keras.backend.backend() == "jax":
            import jax

            if not jax.config.jax_enable_x64:
                self.skipTest("JAX computes float64 as float32 without x64")

    def _layer(self, name, **kwargs):
        classes = {
            "dnas": kav.DoublyNormalizedAttention,
            "hnas": kav.HybridAttention,
            "mha": keras.layers.MultiHeadAttention,
        }
        return classes[name](2, 4, dtype="float64", seed=0, **kwargs)

    @parameterized.parameters("explicit", "auto", "fused")
    def test_dnas_and_hnas_match_a_float64_reference(self, path):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(2, 5, 8)) * 3.0
        mask = np.ones((2, 5, 5), bool)
        mask[1, :, 3:] = False
        references = {
            "dnas": reference.doubly_normalized_attention,
            "hnas": lambda s, m: reference.hybrid_attention(s, 0.3, m),
        }
        for name, normalize in references.items():
            kwargs = {"attention_path": path}
            if name == "hnas":
                kwargs["hybrid_init"] = 0.3
            layer = self._layer(name, **kwargs)
            # Returned scores take the explicit path on any request.
            out, weights = layer(
                x, x, attention_mask=mask, return_attention_scores=True
            )
            self.assertEqual(
                keras.backend.standardize_dtype(out.dtype), "float64"
            )
            want_out, want_weights = reference.multi_head_attention(
                layer, x, x, normalize, mask
            )
            # Padded queries of example 1 have no valid key only where the
            # whole row is masked; none is here.
            self.assertAllClose(weights, want_weights, atol=1e-12, rtol=1e-12)
            self.assertAllClose(out, want_out, atol=1e-12, rtol=1e-12)
            # Without them a fused request runs the kernel, whose float64
            # results had float32 accuracy on JAX and PyTorch (1e-7;
            # PyTorch's "auto" is fused, and JAX's input gradients were
            # off by up to 1.5e-3 relative with large logits): float64
            # layers take the explicit path.
            plain = layer(x, x, attention_mask=mask)
            self.assertEqual(
                keras.backend.standardize_dtype(plain.dtype), "float64"
            )
            self.assertAllClose(plain, out, atol=1e-13, rtol=1e-13)
            upstream = rng.normal(size=out.shape)
            (got_grad,) = gradients(
                lambda q: layer(q, q, attention_mask=mask), upstream, x
            )
            (want_grad,) = gradients(
                lambda q: layer(
                    q, q, attention_mask=mask, return_attention_scores=True
                )[0],
                upstream,
                x,
            )
            self.assertAllClose(got_grad, want_grad, atol=1e-12, rtol=1e-12)

    def test_hybrid_at_zero_equals_float64_mha(self):
        x = np.random.default_rng(1).normal(size=(2, 6, 8))
        mha = self._layer("mha")
        hnas = self._layer("hnas", hybrid_init=0.0)
        mha(x, x)
        hnas(x, x)
        # Same paths below the layer name; HNAS adds `hybrid_weight` (0).
        own = {v.path.split("/", 1)[1]: v for v in hnas.weights}
        for source in mha.weights:
            own[source.path.split("/", 1)[1]].assign(source)
        got = hnas(x, x)
        want, _ = reference.multi_head_attention(
            hnas, x, x, reference.softmax_attention
        )
        self.assertAllClose(got, want, atol=1e-12, rtol=1e-12)
        if keras.backend.backend() == "tensorflow":
            self.assertAllClose(got, mha(x, x), atol=1e-13, rtol=1e-13)
        else:
            # Keras MHA runs `ops.dot_product_attention`, which computes
            # float64 to float32 accuracy on JAX and PyTorch (Keras 3.15);
            # the explicit path these layers take for float64 does not.
            self.assertNotAllClose(mha(x, x), want, atol=1e-12, rtol=1e-12)

    def test_folded_gradient_in_float64(self):
        # The folded backward (explicit path, no weights kept) against
        # autodiff of the log-space formula, both in float64.
        rng = np.random.default_rng(2)
        scores = rng.normal(size=(2, 2, 4, 5)) * 3.0
        value = rng.normal(size=(2, 5, 2, 3))
        upstream = rng.normal(size=(2, 4, 2, 3))
        mask = np.ones((2, 1, 4, 5), bool)
        mask[0, :, :, 4] = False

        def plain(s, v):
            w = autodiff_reference.autodiff_dnas(s, mask)
            return keras.ops.einsum("bnts,bsnh->btnh", w, v)

        def folded(s, v):
            return doubly_normalized_attend(s, v, mask)

        got = gradients(folded, upstream, scores, value)
        want = gradients(plain, upstream, scores, value)
        for g, w in zip(got, want):
            self.assertEqual(g.dtype, np.float64)
            self.assertAllClose(g, w, atol=1e-12, rtol=1e-12)

    def test_ops_keep_float64_and_half_types_compute_in_float32(self):
        scores = np.random.default_rng(3).normal(size=(1, 2, 4, 5)) * 3.0
        want = reference.doubly_normalized_attention(scores)
        got = kav.ops.doubly_normalize(keras.ops.convert_to_tensor(scores))
        self.assertEqual(keras.backend.standardize_dtype(got.dtype), "float64")
        self.assertAllClose(got, want, atol=1e-14, rtol=1e-12)
        # bfloat16 in and out, float32 inside: on rows of 256 keys the
        # result is the exact weights of the rounded scores, rounded once
        # (half an ulp of bfloat16 is 2^-9 relative).
        long = np.random.default_rng(4).normal(size=(1, 2, 4, 256)) * 3.0
        long = keras.ops.convert_to_tensor(long, "bfloat16")
        half = kav.ops.doubly_normalize(long)
        self.assertEqual(
            keras.backend.standardize_dtype(half.dtype), "bfloat16"
        )
        rounded = keras.ops.convert_to_numpy(keras.ops.cast(long, "float64"))
        want = reference.doubly_normalized_attention(rounded)
        half = keras.ops.convert_to_numpy(keras.ops.cast(half, "float64"))
        np.testing.assert_array_less(
            np.abs(half - want), 2.0**-8 * np.abs(want) + 1e-30
        )


class DemoJourneyTest(TestCase):
    def test_demo_on_another_backend_is_a_one_line_error(self):
        # It failed with a traceback after creating its output folders.
        from unittest import mock

        from keras_attnvariants import __main__ as cli
        from keras_attnvariants.testing.usage_errors import one_line_usage_error

        with mock.patch.object(keras.config, "backend", return_value="jax"):
            line = one_line_usage_error(cli.parse, ["demo", "--quick"])
        self.assertIn("KERAS_BACKEND='jax'", line)

    def test_demo_classifier_trains_without_gradient_warnings(self):
        # The unused pooler warned "Gradients do not exist" on every run.
        if keras.backend.backend() == "jax":
            # JAX differentiates every variable (zeros where unused), so
            # the warning cannot fire there: the test passed on JAX with
            # the pooler trainable again, and took 28 s.
            pytest.skip("JAX never has missing gradients")
        pytest.importorskip("keras_hub")
        from keras_attnvariants import demo

        model = demo.build_classifier(_tiny_bert(8), 1e-3, jit_compile=False)
        features = {
            "token_ids": np.array([[3, 4, 5, 0], [6, 7, 0, 0]], "int32"),
            "segment_ids": np.zeros((2, 4), "int32"),
            "padding_mask": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], "int32"),
        }
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(features, np.array([0, 1]), verbose=0)
        messages = [str(w.message) for w in caught]
        self.assertFalse(
            [m for m in messages if "Gradients do not exist" in m], messages
        )


class SmallerFindingsTest(TestCase):
    def test_receptive_fields_reject_a_mask_of_another_shape(self):
        from keras_attnvariants.ops.receptive_field import receptive_fields

        z = np.full((2, 2, 4, 4), 0.25, "float32")
        with self.assertRaisesRegex(ValueError, r"mask.*\(2, 4\).*\(2, 3\)"):
            receptive_fields([z], np.ones((2, 3), bool))
        with self.assertRaisesRegex(ValueError, r"mask.*\(4,\)"):
            receptive_fields([z], np.ones((4,), bool))
        # The right shape still works, padding rows and columns at 0.
        mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
        fields = keras.ops.convert_to_numpy(receptive_fields([z], mask))
        self.assertAllClose(fields[0, 3], np.zeros(4))
        self.assertAllClose(fields[0, :, 3], np.zeros(4))

    def test_key_query_mmd_rejects_one_batch_for_a_dataset(self):
        from keras_attnvariants.losses.kq_diagnostics import key_query_mmd

        x = keras.Input((5, 8))
        model = keras.Model(
            x, kav.DoublyNormalizedAttention(2, 4, seed=0)(x, x)
        )
        batch = np.random.default_rng(0).normal(size=(2, 5, 8))
        self.assertGreater(key_query_mmd(model, [batch])["total"], 0.0)
        with self.assertRaisesRegex(ValueError, "dataset.*\\[inputs\\]"):
            key_query_mmd(model, batch)
        with self.assertRaisesRegex(ValueError, "dataset.*dict"):
            key_query_mmd(model, {"x": batch})
        # One `(inputs, labels)` batch ran the labels through the model as
        # a second batch, into the total.
        labels = np.ones((2, 5, 8))
        with self.assertRaisesRegex(ValueError, r"\[\(inputs, labels\)\]"):
            key_query_mmd(model, (batch, labels))
        self.assertAllClose(
            key_query_mmd(model, [(batch, labels)])["total"],
            key_query_mmd(model, [batch])["total"],
        )

    def test_variant_attention_base_class_says_what_to_do(self):
        layer = kav.layers.VariantAttention(2, 4)
        x = np.zeros((1, 3, 8), "float32")
        with self.assertRaisesRegex(NotImplementedError, "base class"):
            layer(x, x)

    def test_rotten_tomatoes_seed_message_does_not_offer_none(self):
        from keras_attnvariants.datasets.offline import rotten_tomatoes

        for seed in (-1, None):
            with self.assertRaisesRegex(
                ValueError, r"`seed` must be an int >= 0\. Received"
            ):
                rotten_tomatoes(4, seed=seed)
