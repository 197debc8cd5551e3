"""`attention_path="auto"`: the per-backend choice and its equivalence."""

from unittest import mock

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.layers.doubly_normalized_attention import (
    DoublyNormalizedAttention,
)
from keras_attnvariants.layers.gumbel_discrete_attention import (
    GumbelDiscreteAttention,
)
from keras_attnvariants.layers.hybrid_attention import HybridAttention
from keras_attnvariants.layers.variant_attention import prefer_fused_path
from keras_attnvariants.losses.attention_loss import AttentionLoss
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.layer_zoo import WeightSquareLoss
from keras_attnvariants.testing.test_case import TestCase


class AttentionPathTest(TestCase):
    def test_auto_choice_per_backend(self):
        # Measured on CPU and an H100 (docs/benchmarks.md): explicit under
        # TensorFlow and JAX, fused under PyTorch.
        want = keras.config.backend() == "torch"
        self.assertEqual(prefer_fused_path(), want)
        layer = DoublyNormalizedAttention(num_heads=2, key_dim=3)
        self.assertEqual(layer._use_fused(need_weights=False), want)
        self.assertFalse(layer._use_fused(need_weights=True))

    @parameterized.parameters(
        (DoublyNormalizedAttention, True),
        (DoublyNormalizedAttention, False),
        (HybridAttention, True),
        (HybridAttention, False),
    )
    def test_fused_path_asks_jax_for_no_flash_kernel(self, cls, padded):
        # keras's JAX TPU flash kernel drops `bias` and uses the first batch
        # element's mask for all: a biased or masked call must not reach it.
        rng = np.random.default_rng(0)
        x = rng.normal(size=(2, 5, 4)).astype("float32")
        mask = np.ones((2, 5, 5), bool)
        mask[1, :, 3:] = False
        layer = cls(num_heads=2, key_dim=3, attention_path="fused")
        with mock.patch.object(
            keras.ops,
            "dot_product_attention",
            wraps=keras.ops.dot_product_attention,
        ) as spy:
            layer(x, x, attention_mask=mask if padded else None)
        self.assertGreater(spy.call_count, 0)
        for call in spy.call_args_list:
            kwargs = call.kwargs
            masked = kwargs["bias"] is not None or kwargs["mask"] is not None
            backend = keras.config.backend()
            # PyTorch: always False (its SDPA picks flash itself; keras's
            # check for it breaks torch.compile's graph).
            want = (
                False
                if (backend == "jax" and masked) or backend == "torch"
                else None
            )
            self.assertIs(kwargs["flash_attention"], want)

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


def _layer_pair(cls, **kwargs):
    """Two built layers of `cls` with the same weights."""
    query = np.zeros((1, 3, 4), "float32")
    layers = []
    for _ in range(2):
        layer = cls(num_heads=2, key_dim=3, seed=1, **kwargs)
        layer(query, query)
        layers.append(layer)
    layers[1].set_weights(layers[0].get_weights())
    return layers


class FoldedPathTest(TestCase):
    """Without returned weights the explicit path folds them into `A V`
    (`normalize_and_attend`); it must equal the materialized path in
    output and in the gradients of the inputs."""

    @parameterized.parameters(
        (DoublyNormalizedAttention, {}),
        (HybridAttention, {"hybrid_init": 0.4}),
        (GumbelDiscreteAttention, {"inference_mode": "soft"}),
    )
    def test_folded_equals_materialized(self, cls, kwargs):
        rng = np.random.default_rng(0)
        query = rng.normal(size=(2, 5, 4)).astype("float32")
        value = rng.normal(size=(2, 7, 4)).astype("float32")
        upstream = rng.normal(size=(2, 5, 4)).astype("float32")
        mask = np.ones((2, 5, 7), bool)
        mask[1, 3:] = False
        mask[1, :, 5:] = False
        layer = _layer_pair(cls, attention_path="explicit", **kwargs)[0]

        def folded(q, v):
            return layer(q, v, attention_mask=mask)

        def materialized(q, v):
            out, _ = layer(
                q, v, attention_mask=mask, return_attention_scores=True
            )
            return out

        self.assertAllClose(
            ops.convert_to_numpy(folded(query, value)),
            ops.convert_to_numpy(materialized(query, value)),
            atol=1e-6,
        )
        got = gradients(folded, upstream, query, value)
        want = gradients(materialized, upstream, query, value)
        for g, w in zip(got, want):
            self.assertAllClose(g, w, atol=1e-5)

    @parameterized.parameters(
        (DoublyNormalizedAttention, {}),
        (HybridAttention, {}),
        (GumbelDiscreteAttention, {}),
        (GumbelDiscreteAttention, {"straight_through": True}),
        (GumbelDiscreteAttention, {"inference_mode": "soft"}),
    )
    def test_weights_are_materialized_only_when_needed(self, cls, kwargs):
        x = np.random.default_rng(5).normal(size=(2, 4, 6)).astype("float32")
        layer = cls(num_heads=2, key_dim=3, attention_path="explicit", **kwargs)
        layer(x, x, return_attention_scores=True)
        materialize = layer._attend

        def refuse(*args, **kwargs):
            raise AssertionError("materialized the weights")

        layer._attend = refuse
        for training in (False, True):
            layer(x, x, training=training)
        with self.assertRaisesRegex(AssertionError, "materialized"):
            layer(x, x, return_attention_scores=True, training=True)
        layer._attend = materialize
        dropped = cls(num_heads=2, key_dim=3, dropout=0.5, **kwargs)
        dropped(x, x)
        dropped._attend = refuse
        dropped(x, x, training=False)  # no dropout at inference
        if kwargs.get("straight_through"):
            # One-hot rows are gathered: dropout needs their weights.
            with self.assertRaisesRegex(AssertionError, "materialized"):
                dropped(x, x, training=True)
        else:
            # Dropout multiplies the folded operand (`keep=`).
            dropped(x, x, training=True)

    @parameterized.product(
        cls=(DoublyNormalizedAttention, HybridAttention),
        path=("explicit", "fused", "auto"),
        override=("normalize", "attention_logits"),
    )
    def test_subclass_overriding_normalize_is_not_bypassed(
        self, cls, path, override
    ):
        # The fused kernels computed the parent's logits and weights:
        # plain inference on PyTorch ("auto") ignored the subclass.
        if override == "normalize":

            class Sharpened(cls):
                def normalize(self, scores, mask):
                    return super().normalize(3.0 * scores, mask)

        else:

            class Sharpened(cls):
                def attention_logits(self, query, key):
                    return 3.0 * super().attention_logits(query, key)

        x = np.random.default_rng(6).normal(size=(2, 4, 6)).astype("float32")
        base, sharp = (
            k(num_heads=2, key_dim=3, attention_path=path, seed=1)
            for k in (cls, Sharpened)
        )
        base(x, x)
        sharp(x, x)
        sharp.set_weights(base.get_weights())
        out = ops.convert_to_numpy(sharp(x, x))
        want, _ = sharp(x, x, return_attention_scores=True)
        self.assertAllClose(out, ops.convert_to_numpy(want), atol=1e-6)
        self.assertFalse(
            np.allclose(out, ops.convert_to_numpy(base(x, x)), atol=1e-3)
        )

    @parameterized.parameters(
        (DoublyNormalizedAttention, {}),
        (HybridAttention, {"hybrid_init": 0.6}),
        (GumbelDiscreteAttention, {}),
        (GumbelDiscreteAttention, {"straight_through": True}),
    )
    def test_folded_path_trains_compiled(self, cls, kwargs):
        rng = np.random.default_rng(3)
        x = rng.normal(size=(4, 5, 6)).astype("float32")
        mask = np.ones((4, 5, 5), bool)
        mask[1, 3:] = False
        mask[1, :, 3:] = False

        def build(inputs):
            layer = cls(num_heads=2, key_dim=3, seed=1, **kwargs)
            return layer(inputs[0], inputs[0], attention_mask=inputs[1])

        jit = keras.config.backend() != "torch"
        model, _ = self.run_multi_input_training_step(
            build, [x, mask], jit_compile=jit
        )
        if cls is HybridAttention:
            (layer,) = [m for m in model.layers if isinstance(m, cls)]
            self.assertFalse(np.allclose(layer.hybrid_weights, 0.6))

    @parameterized.parameters(
        DoublyNormalizedAttention, HybridAttention, GumbelDiscreteAttention
    )
    def test_folded_gradients_finite_in_mixed_precision(self, cls):
        rng = np.random.default_rng(4)
        x = (rng.normal(size=(2, 5, 6)) * 1e3).astype("float32")
        upstream = rng.normal(size=(2, 5, 6)).astype("float32")
        mask = rng.random((2, 5, 5)) < 0.7
        mask[1] = False  # a fully masked example
        for policy in ("mixed_float16", "mixed_bfloat16"):
            if policy == "mixed_float16" and keras.config.backend() == "torch":
                continue  # Torch CPU kernels lack float16 matmuls.
            layer = cls(num_heads=2, key_dim=3, seed=1, dtype=policy)
            layer(x, x)

            def attend(q):
                out = layer(q, q, attention_mask=mask, training=True)
                return ops.cast(out, "float32")

            (grad,) = gradients(attend, upstream, x)
            self.assertTrue(np.all(np.isfinite(grad)), policy)
            self.assertEqual(float(np.abs(grad[1]).max()), 0.0)

    @parameterized.parameters(
        (False, False, 0.7),
        (True, False, 0.7),
        (False, True, 0.7),
        (True, True, 0.7),
        # The relaxed weights round to ties in float32: the materialized
        # path took their argmax (the first valid key) where the folded one
        # takes the logits' (the Gumbel-max sample); outputs 0.3 apart.
        (True, True, 1e8),
    )
    def test_gumbel_training_folded_equals_sample(
        self, masked, straight, temperature
    ):
        # Same seed, same noise: the folded relaxed sample equals the
        # returned sample times the values.
        rng = np.random.default_rng(1)
        query = rng.normal(size=(2, 5, 4)).astype("float32")
        mask = None
        if masked:
            mask = rng.random((2, 5, 5)) < 0.7
            mask[0, 2] = False
        folded, materialized = _layer_pair(
            GumbelDiscreteAttention,
            temperature=temperature,
            straight_through=straight,
        )
        for _ in range(2):  # the seed generators advance together
            out = folded(query, query, attention_mask=mask, training=True)
            want, weights = materialized(
                query,
                query,
                attention_mask=mask,
                training=True,
                return_attention_scores=True,
            )
            self.assertAllClose(
                ops.convert_to_numpy(out), ops.convert_to_numpy(want), atol=1e-6
            )
        weights = ops.convert_to_numpy(weights)
        one_hot = np.all((weights == 0) | (weights == 1))
        self.assertEqual(one_hot, straight)
        if temperature > 1e6:
            rows = mask.any(-1)[:, None] & np.ones(weights.shape[:3], bool)
            picks = np.argmax(weights, -1)[rows]
            first = np.broadcast_to(np.argmax(mask, -1)[:, None], rows.shape)
            self.assertLess(np.mean(picks == first[rows]), 0.6)


class _QueryProbe(AttentionLoss):
    """Reads only the queries; records the weights its context held."""

    needs_attention_weights = False

    def compute_loss_value(self, query):
        return ops.mean(ops.square(query))

    def from_attention(self, context):
        self.seen_weights = context["attention_weights"]
        return self(context["query"])


class AttentionLossPathTest(TestCase):
    @parameterized.parameters(
        DoublyNormalizedAttention, HybridAttention, GumbelDiscreteAttention
    )
    def test_terms_without_weights_keep_the_folded_path(self, cls):
        x = np.random.default_rng(0).normal(size=(2, 4, 6)).astype("float32")
        probe = _QueryProbe()
        layer = cls(num_heads=2, key_dim=3, attention_losses=[probe])
        out = layer(x, x, training=True)
        self.assertIsNone(probe.seen_weights)
        self.assertEqual(len(layer.losses), 1)
        self.assertTrue(np.isfinite(float(layer.losses[0])))
        # A term that reads the weights makes the layer materialize them.
        needy = WeightSquareLoss()
        both = cls(num_heads=2, key_dim=3, attention_losses=[probe, needy])
        both(x, x)
        both.set_weights(layer.get_weights())
        both_out = both(x, x, training=True)
        self.assertIsNotNone(probe.seen_weights)
        self.assertEqual(len(both.losses), 2)
        if cls is not GumbelDiscreteAttention:  # a fresh noise draw
            self.assertAllClose(
                ops.convert_to_numpy(out),
                ops.convert_to_numpy(both_out),
                atol=1e-6,
            )
