"""Regression tests from a review of the DNAS / HNAS layers."""

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

import keras_attnvariants as kav
from keras_attnvariants.losses.attention_loss import AttentionLoss
from keras_attnvariants.testing.test_case import TestCase

LAYERS = {
    "dnas": (kav.DoublyNormalizedAttention, {}),
    "hnas": (kav.HybridAttention, {"hybrid_init": 0.3}),
}
CASES = [{"testcase_name": name, "name": name} for name in LAYERS]


def make(name, **kwargs):
    cls, init = LAYERS[name]
    return cls(num_heads=2, key_dim=3, seed=1, **init, **kwargs)


def numpy_out(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


class MaskValidationTest(TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("keras_mask", "keras_mask"), ("query_mask", "query_mask")
    )
    def test_wrong_rank_attention_mask_raises_beside_a_query_mask(self, how):
        # With batch == length, a (B, S) `attention_mask` ANDed with the
        # (B, T, 1) query mask broadcast to a valid-looking (B, T, S) one
        # and was used silently; alone it raised.
        rng = np.random.default_rng(0)
        x = rng.normal(size=(5, 5, 4)).astype("float32")
        valid = np.arange(5)[None] < np.array([5, 4, 3, 5, 2])[:, None]
        layer = make("dnas")
        bad = np.ones((5, 5), bool)
        with self.assertRaisesRegex(ValueError, "attention_mask"):
            if how == "keras_mask":
                masked = keras.layers.Masking(0.0)(
                    np.where(valid[..., None], x, 0.0).astype("float32")
                )
                layer(masked, masked, attention_mask=bad)
            else:
                layer(x, x, attention_mask=bad, query_mask=valid)

    def test_rank_2_attention_mask_raises_saying_how_to_share_it(self):
        # Keras MHA reads (T, S) as shared by the batch; the docs said
        # "broadcastable to (B, T, S)", which (T, S) is, yet it raised
        # without saying what to pass.
        x = np.random.default_rng(1).normal(size=(2, 5, 4)).astype("float32")
        causal = np.tril(np.ones((5, 5), bool))
        layer = make("dnas")
        with self.assertRaisesRegex(
            ValueError, r"rank-3.*`mask\[None\]`.*shape \(5, 5\)"
        ):
            layer(x, x, attention_mask=causal)
        np.testing.assert_allclose(
            numpy_out(layer(x, x, attention_mask=causal[None])),
            numpy_out(
                layer(x, x, attention_mask=np.broadcast_to(causal, (2, 5, 5)))
            ),
            atol=1e-6,
        )

    @parameterized.named_parameters(
        ("query_rank", "query_mask", (2, 3, 1)),
        ("query_length", "query_mask", (2, 4)),
        ("value_length", "value_mask", (2, 6)),
        ("key_batch", "key_mask", (3, 5)),
    )
    def test_keyword_padding_masks_of_wrong_shape_raise(self, arg, shape):
        query = np.zeros((2, 3, 4), "float32")
        value = np.zeros((2, 5, 4), "float32")
        layer = make("dnas")
        with self.assertRaisesRegex(
            ValueError, rf"`{arg}` must be .*\(batch, length\).*Received"
        ):
            layer(query, value, key=value, **{arg: np.ones(shape, bool)})
        # Symbolic inputs are checked when the model is built.
        with self.assertRaisesRegex(ValueError, arg):
            layer(
                keras.Input((3, 4), batch_size=2),
                keras.Input((5, 4), batch_size=2),
                **{arg: keras.Input(shape[1:], batch_size=shape[0])},
            )

    def test_valid_keyword_masks_still_pass(self):
        query = np.zeros((2, 3, 4), "float32")
        value = np.zeros((2, 5, 4), "float32")
        out = make("dnas")(
            query,
            value,
            key=value,
            query_mask=np.ones((2, 3), bool),
            value_mask=np.ones((1, 5), bool),
            key_mask=np.ones((2, 5), bool),
            attention_mask=np.ones((1, 3, 5), bool),
        )
        self.assertEqual(tuple(out.shape), (2, 3, 4))


class ConstructorArgumentsTest(TestCase, parameterized.TestCase):
    def test_numpy_float_hybrid_init_is_accepted(self):
        layer = kav.HybridAttention(2, 3, hybrid_init=np.float32(0.25))
        self.assertIsInstance(layer.get_config()["hybrid_init"], float)
        layer(np.zeros((1, 2, 4), "float32"), np.zeros((1, 2, 4), "float32"))
        self.assertAllClose(layer.hybrid_weights, [0.25, 0.25])

    @parameterized.named_parameters(
        ("string", "0.1"), ("none", None), ("bool", True), ("nan", np.nan)
    )
    def test_non_numeric_dropout_raises_value_error(self, dropout):
        with self.assertRaisesRegex(ValueError, "dropout.*Received: dropout"):
            kav.DoublyNormalizedAttention(2, 3, dropout=dropout)

    def test_numpy_dropout_config_is_a_python_float(self):
        layer = kav.DoublyNormalizedAttention(2, 3, dropout=np.float32(0.25))
        self.assertIs(type(layer.get_config()["dropout"]), float)

    @parameterized.named_parameters(
        ("dnas", "DoublyNormalizedAttention", {}),
        ("hnas", "HybridAttention", {"hybrid_init": 0.5}),
    )
    def test_self_attention_padding_must_be_a_bool(self, name, kwargs):
        # `bool("false")` turned the padding rule on without a word.
        cls = getattr(kav, name)
        for bad in ("false", 1, None):
            with self.assertRaisesRegex(
                ValueError,
                r"`self_attention_padding` must be a bool\. "
                "Received: self_attention_padding=",
            ):
                cls(2, 3, self_attention_padding=bad, **kwargs)
        layer = cls(2, 3, self_attention_padding=np.bool_(True), **kwargs)
        config = layer.get_config()
        self.assertIs(config["self_attention_padding"], True)
        self.assertIs(cls.from_config(config).self_attention_padding, True)


class FusedPathTest(TestCase, parameterized.TestCase):
    @parameterized.named_parameters(CASES)
    def test_fused_path_with_value_dim_other_than_key_dim(self, name):
        # JAX's `dot_product_attention` raised for value_dim != key_dim.
        rng = np.random.default_rng(1)
        query = rng.normal(size=(2, 3, 4)).astype("float32")
        value = rng.normal(size=(2, 6, 4)).astype("float32")
        mask = np.ones((2, 3, 6), bool)
        mask[1, :, 4:] = False
        outputs = []
        weights = None
        for path in ("explicit", "fused"):
            layer = make(name, value_dim=5, attention_path=path)
            layer(query, value)
            if weights is None:
                weights = layer.get_weights()
            layer.set_weights(weights)
            out = layer(query, value, attention_mask=mask)
            outputs.append(numpy_out(out))
        self.assertAllClose(outputs[0], outputs[1], atol=1e-5)

    @parameterized.named_parameters(CASES)
    def test_fused_float16_matches_explicit_at_large_logits(self, name):
        if keras.config.backend() == "torch":
            self.skipTest("Torch CPU kernels lack float16 matmuls.")
        # Logits near 2e4 (35% output error before) and above 65504 (NaN
        # before): the fused kernel ran in float16.
        rng = np.random.default_rng(2)
        x = rng.normal(size=(2, 5, 6)).astype("float32")
        mask = np.ones((2, 5, 5), bool)
        mask[1, 3:] = False
        mask[1, :, 3:] = False
        layers = {
            path: make(name, attention_path=path, dtype="mixed_float16")
            for path in ("explicit", "fused")
        }
        for layer in layers.values():
            layer(x, x)
        layers["fused"].set_weights(layers["explicit"].get_weights())
        for scale in (100.0, 300.0):
            outs = {}
            for path, layer in layers.items():
                out = layer(x * scale, x * scale, attention_mask=mask)
                self.assertEqual(
                    keras.backend.standardize_dtype(out.dtype), "float16"
                )
                outs[path] = numpy_out(out)
                self.assertTrue(np.all(np.isfinite(outs[path])), (path, scale))
            err = np.abs(outs["fused"] - outs["explicit"]).max()
            self.assertLess(err / np.abs(outs["explicit"]).max(), 2e-2)


class SharedMaskedInputTest(TestCase, parameterized.TestCase):
    """Keras MHA clears its inputs' Keras masks in place (keras 3.15): a
    second layer on the same masked tensor ran unmasked."""

    @parameterized.named_parameters(CASES)
    def test_two_layers_on_one_masked_embedding_stay_padding_free(self, name):
        tokens = np.array([[3, 4, 5, 0, 0, 0]])
        inputs = keras.Input((None,), dtype="int32")
        x = keras.layers.Embedding(20, 8, mask_zero=True)(inputs)
        first = make(name, self_attention_padding=True)(x, x)
        second = make(name, self_attention_padding=True)(x, x)
        model = keras.Model(inputs, [first, second])
        padded = model(tokens)
        short = model(tokens[:, :3])
        for got, want in zip(padded, short):
            self.assertAllClose(
                numpy_out(got)[:, :3], numpy_out(want), atol=1e-6
            )

    @parameterized.named_parameters(CASES)
    def test_eager_call_keeps_the_input_mask(self, name):
        tokens = np.array([[3, 4, 5, 0, 0]])
        x = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
        layer = make(name)
        first = numpy_out(layer(x, x))
        # A second call on the same tensor saw no mask before.
        self.assertAllClose(numpy_out(layer(x, x)), first, atol=1e-6)
        # And the mask is applied: the same as an explicit attention mask
        # on a mask-free copy of the embeddings, on the real rows.
        plain = keras.ops.convert_to_tensor(numpy_out(x))
        real = tokens != 0
        explicit = layer(
            plain, plain, attention_mask=real[:, :, None] & real[:, None, :]
        )
        self.assertAllClose(first[:, :3], numpy_out(explicit)[:, :3], atol=1e-6)
        unmasked = numpy_out(layer(plain, plain))
        self.assertGreater(np.abs(first[:, :3] - unmasked[:, :3]).max(), 1e-4)


class ContextRecorder(AttentionLoss):
    """Keeps the last context it was handed; adds 0."""

    needs_attention_weights = False

    def compute_loss_value(self, query):
        return ops.mean(ops.cast(query, "float32")) * 0.0

    def from_attention(self, context):
        self.context = context
        return self(context["query"])


class VariantAttentionTermContextTest(TestCase):
    """Pinned after a mutation review (2026-12-02): the term context of a
    layer that is not a converted self-attention, dropout only in
    training, scores returned before dropout."""

    def test_plain_layer_keeps_causal_padded_queries_in_the_context(self):
        # Not a converted self-attention layer: `query_mask` is any(mask, -1)
        # (padded query 2 attends key 0), only keys are padding.
        term = ContextRecorder()
        layer = kav.GumbelDiscreteAttention(
            2, 4, seed=1, attention_losses=[term]
        )
        x = np.random.default_rng(0).normal(size=(1, 4, 8)).astype("float32")
        keys = np.array([[1, 1, 0, 0]], bool)
        layer(x, x, value_mask=keys, use_causal_mask=True, training=True)
        self.assertAllEqual(term.context["query_mask"], np.ones((1, 4), bool))
        self.assertAllEqual(term.context["key_mask"], keys)

    def test_returned_scores_are_taken_before_dropout(self):
        layer = kav.HybridAttention(2, 4, hybrid_init=0.0, dropout=0.5, seed=3)
        x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
        _, scores = layer(x, x, return_attention_scores=True, training=True)
        self.assertAllClose(
            ops.sum(scores, axis=-1), np.ones((2, 2, 6)), atol=1e-5
        )

    def test_dropout_is_off_at_inference(self):
        x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
        plain = kav.HybridAttention(2, 4, hybrid_init=0.0)
        dropping = kav.HybridAttention(2, 4, hybrid_init=0.0, dropout=0.5)
        plain(x, x)
        dropping(x, x)
        dropping.set_weights(plain.get_weights())
        self.assertAllClose(
            dropping(x, x, training=False), plain(x, x), atol=1e-6
        )
