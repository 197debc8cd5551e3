import keras
import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants.backbones.attention_weights import attention_weights
from keras_attnvariants.backbones.attention_weights import hybrid_weights
from keras_attnvariants.backbones.conversion import convert_backbone
from keras_attnvariants.backbones.conversion import self_attention_layers
from keras_attnvariants.backbones.pretrained import first_layers
from keras_attnvariants.backbones.pretrained import random_bert
from keras_attnvariants.layers.recording import record_attention
from keras_attnvariants.losses.attention_loss import AttentionLoss
from keras_attnvariants.testing.test_case import TestCase

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)


def bert(num_layers=2):
    return keras_hub.models.BertBackbone(
        vocabulary_size=50,
        num_layers=num_layers,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=8,
    )


def inputs(lengths=(6, 4), total=6):
    rng = np.random.default_rng(0)
    valid = np.arange(total)[None] < np.array(lengths)[:, None]
    ids = rng.integers(1, 50, size=valid.shape)
    return {
        "token_ids": np.where(valid, ids, 0).astype("int32"),
        "segment_ids": np.zeros(valid.shape, "int32"),
        "padding_mask": valid.astype("int32"),
    }


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class AttentionWeightsTest(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.bert = bert()

    def test_first_layer_matches_numpy_reference(self):
        backbone = self.bert
        data = inputs()
        weights = attention_weights(backbone, data)
        self.assertLen(weights, 2)
        self.assertEqual(weights[0].shape, (2, 2, 6, 6))
        # Reference: the first layer's input from the embedding layers,
        # then softmax(Q K^T / sqrt(H)) over unpadded keys in NumPy.
        tokens = backbone.token_embedding(data["token_ids"])
        x = backbone.embeddings_layer_norm(
            backbone.embeddings_add(
                (
                    tokens,
                    backbone.position_embedding(tokens),
                    backbone.segment_embedding(data["segment_ids"]),
                )
            )
        )
        x = keras.ops.convert_to_numpy(x)
        mha = backbone.transformer_layers[0]._self_attention_layer
        wq, bq = mha._query_dense.get_weights()
        wk, bk = mha._key_dense.get_weights()
        q = np.einsum("btd,dnh->btnh", x, wq) + bq
        k = np.einsum("bsd,dnh->bsnh", x, wk) + bk
        scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(4.0)
        key_valid = data["padding_mask"].astype(bool)[:, None, None, :]
        expected = softmax(np.where(key_valid, scores, -1e9))
        self.assertAllClose(weights[0], expected, atol=1e-5)

    def test_dnas_weights_per_layer_and_head(self):
        backbone = convert_backbone(self.bert, kav.DoublyNormalizedAttention)
        data = inputs(lengths=(6, 3))
        for layer_weights in attention_weights(backbone, data):
            for b, length in enumerate((6, 3)):
                w = layer_weights[b, :, :length, :length]
                # Rows of valid queries sum to 1, padded rows and columns 0.
                self.assertAllClose(w.sum(-1), np.ones((2, length)))
                self.assertAllClose(layer_weights[b, :, length:], 0.0)
                self.assertAllClose(layer_weights[b, :, :, length:], 0.0)
                # Theorem 2: every valid key receives >= 1/S in total.
                self.assertTrue(np.all(w.sum(-2) >= 1.0 / length - 1e-6))

    def test_albert_records_each_depth_of_a_shared_layer(self):
        backbone = keras_hub.models.AlbertBackbone(
            vocabulary_size=50,
            num_layers=3,
            num_heads=2,
            embedding_dim=4,
            hidden_dim=8,
            intermediate_dim=16,
            max_sequence_length=8,
        )
        weights = attention_weights(backbone, inputs())
        self.assertLen(weights, 3)
        self.assertFalse(np.allclose(weights[0], weights[1]))
        # The temporary recorder is removed afterwards.
        layer = backbone.transformer_layers[0][0]._self_attention_layer
        self.assertNotIn("_compute_attention", vars(layer))

    def test_record_attention_sees_projections_and_restores_layers(self):
        layers = self_attention_layers(self.bert)
        with self.assertRaisesRegex(RuntimeError, "stop"):
            with record_attention(layers) as calls:
                self.bert(inputs())
                raise RuntimeError("stop")
        self.assertEqual([c.layer for c in calls], layers)
        self.assertEqual(tuple(calls[0].query.shape), (2, 6, 2, 4))
        self.assertEqual(tuple(calls[0].key.shape), (2, 6, 2, 4))
        mask = keras.ops.convert_to_numpy(calls[0].attention_mask)
        self.assertAllEqual(
            np.broadcast_to(mask, (2, 6, 6))[:, 0],
            inputs()["padding_mask"].astype(bool),
        )
        for layer in layers:
            self.assertNotIn("_compute_attention", vars(layer))
        with self.assertRaisesRegex(ValueError, "MultiHeadAttention"):
            with record_attention([keras.layers.Dense(2)]):
                pass

    def test_hybrid_weights_per_layer(self):
        backbone = convert_backbone(
            bert(3), kav.HybridAttention, hybrid_init=0.2
        )
        self.assertAllClose(hybrid_weights(backbone), np.full((3, 2), 0.2))
        with self.assertRaisesRegex(ValueError, "HybridAttention"):
            hybrid_weights(self.bert)

    def test_gpt2_weights_are_causal(self):
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=50,
            num_layers=1,
            num_heads=2,
            hidden_dim=8,
            intermediate_dim=16,
            max_sequence_length=8,
        )
        data = inputs(lengths=(5, 3), total=5)
        del data["segment_ids"]
        (weights,) = attention_weights(backbone, data)
        self.assertEqual(weights.shape, (2, 2, 5, 5))
        self.assertAllClose(weights.sum(-1), np.ones((2, 2, 5)), atol=1e-5)
        upper = np.triu(np.ones((5, 5), bool), 1)
        self.assertAllClose(weights[:, :, upper], 0.0)
        self.assertAllClose(weights[1, :, :, 3:], 0.0)  # padded keys

    def test_backbone_without_blocks_raises(self):
        # DeBERTa-v3 has its own encoder blocks: an empty list before.
        token_ids = keras.Input(shape=(4,), dtype="int32", name="token_ids")
        dense = keras_hub.models.Backbone(
            inputs=token_ids, outputs=keras.layers.Embedding(50, 2)(token_ids)
        )
        with self.assertRaisesRegex(
            ValueError, "TransformerEncoder.*Received: backbone of class"
        ):
            attention_weights(dense, {"token_ids": np.ones((1, 4), "int32")})

    def test_first_layers_keeps_the_first_blocks(self):
        data = inputs()
        full = attention_weights(self.bert, data)
        for count in (1, np.int64(2)):
            truncated = first_layers(self.bert, count)
            self.assertIs(type(truncated.num_layers), int)
            got = attention_weights(truncated, data)
            self.assertLen(got, int(count))
            for layer_got, layer_full in zip(got, full):
                self.assertAllClose(layer_got, layer_full, atol=1e-6)
        for bad in (0, 3, True, 1.5):
            with self.assertRaisesRegex(ValueError, "num_layers"):
                first_layers(self.bert, bad)

    def test_first_layers_keeps_trainable_flags(self):
        # The copy was rebuilt from the config: frozen layers came back
        # trainable.
        bert = random_bert(50, 8)
        bert.token_embedding.trainable = False
        bert.transformer_layers[0].trainable = False
        truncated = first_layers(bert, 1)
        self.assertFalse(truncated.token_embedding.trainable)
        self.assertFalse(truncated.transformer_layers[0].trainable)
        self.assertTrue(truncated.position_embedding.trainable)
        self.assertLen(
            truncated.trainable_weights,
            len(truncated.weights)
            - len(bert.token_embedding.weights)
            - len(bert.transformer_layers[0].weights),
        )


@keras.saving.register_keras_serializable(package="kav_backbone_tests")
class RecordingLoss(AttentionLoss):
    """A loss term that checks what an attention layer hands to it."""

    seen = []

    def compute_loss_value(self, weights, query, key, query_mask, token_ids):
        # Mean attention on the first key of each valid query.
        first = weights[:, :, :, 0]
        mask = keras.ops.cast(query_mask[:, None, :], "float32")
        return keras.ops.sum(first * mask) / keras.ops.sum(mask) + 0.0 * (
            keras.ops.sum(keras.ops.cast(token_ids, "float32"))
        )

    def from_attention(self, context):
        self.seen.append(
            {
                name: context[name]
                for name in (
                    "attention_weights",
                    "query",
                    "key",
                    "attention_mask",
                    "query_mask",
                    "key_mask",
                    "token_ids",
                )
            }
        )
        return self(
            context["attention_weights"],
            context["query"],
            context["key"],
            context["query_mask"],
            context["token_ids"],
        )


class AttentionLossesTest(TestCase):
    def test_terms_receive_context_and_show_as_metrics_in_fit(self):
        if keras.backend.backend() != "tensorflow":
            self.skipTest("metrics from layer losses: TensorFlow backend")
        first = RecordingLoss(name="first_key")
        second = RecordingLoss(name="first_key_again")
        backbone = convert_backbone(
            bert(),
            kav.HybridAttention,
            hybrid_init=0.5,
            dropout=0.5,
            attention_losses=[first, second],
        )
        data = inputs(lengths=(6, 4))
        # Eager training call: the context holds real tensors.
        RecordingLoss.seen.clear()
        backbone(data, training=True)
        self.assertLen(RecordingLoss.seen, 4)  # 2 layers x 2 terms
        seen = RecordingLoss.seen[0]
        weights = keras.ops.convert_to_numpy(seen["attention_weights"])
        self.assertEqual(weights.shape, (2, 2, 6, 6))
        # Before dropout (rate 0.5): valid rows still sum to exactly 1.
        self.assertAllClose(weights[1, :, :4].sum(-1), np.ones((2, 4)))
        self.assertEqual(tuple(seen["query"].shape), (2, 6, 2, 4))
        self.assertEqual(tuple(seen["key"].shape), (2, 6, 2, 4))
        self.assertEqual(tuple(seen["attention_mask"].shape), (2, 6, 6))
        self.assertAllEqual(
            keras.ops.convert_to_numpy(seen["query_mask"]),
            data["padding_mask"].astype(bool),
        )
        self.assertAllEqual(
            keras.ops.convert_to_numpy(seen["key_mask"]),
            data["padding_mask"].astype(bool),
        )
        self.assertAllEqual(
            keras.ops.convert_to_numpy(seen["token_ids"]), data["token_ids"]
        )
        # No terms at inference.
        RecordingLoss.seen.clear()
        backbone(data, training=False)
        self.assertEmpty(RecordingLoss.seen)
        # Each term is its own metric in `fit`, and adds to the loss.
        classifier = keras_hub.models.BertTextClassifier(
            backbone=backbone, num_classes=2, preprocessor=None
        )
        classifier.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            # A traced train step, without XLA's compile time.
            jit_compile=False,
        )
        before = hybrid_weights(backbone)
        history = classifier.fit(
            data, np.array([0, 1]), batch_size=1, epochs=2, verbose=0
        )
        self.assertTrue(np.all(np.isfinite(history.history["loss"])))
        self.assertIn("first_key", history.history)
        self.assertIn("first_key_again", history.history)
        self.assertGreater(history.history["first_key"][-1], 0.0)
        self.assertLen(classifier.losses, 4)
        # The task model trains the mixing weights (kept in [0, 1]).
        after = hybrid_weights(backbone)
        self.assertGreater(np.abs(after - before).max(), 0.0)
        self.assertTrue(np.all((after >= 0.0) & (after <= 1.0)))


class AttentionWeightsContractsTest(TestCase):
    # Contracts a mutation sweep found untested.
    def test_training_flag_reaches_the_attention(self):
        backbone = convert_backbone(
            bert(1), kav.GumbelDiscreteAttention, seed=3, temperature=1.0
        )
        data = inputs()
        hard = attention_weights(backbone, data)[0]
        relaxed = attention_weights(backbone, data, training=True)[0]
        # Inference: one-hot rows for the real queries; training: relaxed
        # samples, not one-hot (padded queries' rows are 0 in both).
        rows = np.broadcast_to(
            data["padding_mask"].astype("float32")[:, None], hard.shape[:-1]
        )
        self.assertAllEqual(hard.max(-1), rows)
        self.assertAllEqual(hard.sum(-1), rows)
        self.assertAllClose(relaxed.sum(-1), rows)
        self.assertLess(relaxed.max(), 1.0)

    def test_weights_are_float32_under_mixed_precision(self):
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy("mixed_float16")
        try:
            backbone = bert(1)
            weights = attention_weights(backbone, inputs())
        finally:
            keras.config.set_dtype_policy(previous)
        self.assertEqual(weights[0].dtype, np.float32)
        self.assertAllClose(weights[0].sum(-1), np.ones((2, 2, 6)), atol=1e-2)
