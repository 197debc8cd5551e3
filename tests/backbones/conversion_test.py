import os
import re
import sys
from unittest import mock

import keras
import numpy as np
import pytest
from absl.testing import parameterized

import keras_attnvariants as kav
from keras_attnvariants.backbones import conversion
from keras_attnvariants.backbones.conversion import convert_backbone
from keras_attnvariants.backbones.conversion import self_attention_layers
from keras_attnvariants.layers.variant_attention import VariantAttention
from keras_attnvariants.ops.normalization import masked_softmax
from keras_attnvariants.testing.test_case import TestCase

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)

SMALL = {"num_layers": 2, "num_heads": 2, "hidden_dim": 8}
ENCODERS = {
    "bert": lambda: keras_hub.models.BertBackbone(
        vocabulary_size=50, intermediate_dim=16, max_sequence_length=8, **SMALL
    ),
    "roberta": lambda: keras_hub.models.RobertaBackbone(
        vocabulary_size=50, intermediate_dim=16, max_sequence_length=8, **SMALL
    ),
    # 3 depths share one encoder layer (one group, one inner layer).
    "albert": lambda: keras_hub.models.AlbertBackbone(
        vocabulary_size=50,
        num_layers=3,
        num_heads=2,
        embedding_dim=4,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=8,
    ),
    "distil_bert": lambda: keras_hub.models.DistilBertBackbone(
        vocabulary_size=50, intermediate_dim=16, max_sequence_length=8, **SMALL
    ),
    "electra": lambda: keras_hub.models.ElectraBackbone(
        vocab_size=50,
        embedding_dim=4,
        intermediate_dim=16,
        max_sequence_length=8,
        **SMALL,
    ),
}
ENCODER_CASES = [{"testcase_name": name, "name": name} for name in ENCODERS]


def gpt2(**kwargs):
    return keras_hub.models.GPT2Backbone(
        vocabulary_size=50,
        intermediate_dim=16,
        max_sequence_length=8,
        **SMALL,
        **kwargs,
    )


def backbone_inputs(backbone, lengths=(6, 4), total=6, seed=0):
    """Token ids with right padding; only the inputs `backbone` takes."""
    rng = np.random.default_rng(seed)
    valid = np.arange(total)[None] < np.array(lengths)[:, None]
    ids = rng.integers(1, 50, size=(len(lengths), total)).astype("int32")
    data = {
        "token_ids": np.where(valid, ids, 0).astype("int32"),
        "segment_ids": np.zeros_like(ids),
        "padding_mask": valid.astype("int32"),
    }
    names = [x.name for x in keras.tree.flatten(backbone.input)]
    return {k: v for k, v in data.items() if k in names}


def hybrid_weight_table(backbone):
    """The `(layers, heads)` HNAS mixing weights, as NumPy."""
    return np.stack(
        [np.asarray(x.hybrid_weight) for x in self_attention_layers(backbone)]
    )


def sequence_output(backbone, data):
    out = backbone(data)
    if isinstance(out, dict):
        out = out["sequence_output"]
    return keras.ops.convert_to_numpy(out)


class ConvertBackboneTest(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Built once; tests convert them (conversion copies, never mutates).
        cls.originals = {name: build() for name, build in ENCODERS.items()}
        cls.gpt2 = gpt2()

    def test_converted_backbones_keep_the_weight_order(self):
        # The new attention layer took the end of its block's sublayers:
        # `weights` listed it after the layer norms and the feedforward, and
        # `set_weights(original.get_weights())` failed on the shapes.
        for name, original in self.originals.items():
            converted = convert_backbone(
                original, kav.DoublyNormalizedAttention
            )
            self.assertEqual(
                [v.path for v in converted.weights],
                [v.path for v in original.weights],
                name,
            )
            values = [
                np.full(v.shape, i, v.dtype)
                for i, v in enumerate(original.weights)
            ]
            converted.set_weights(values)
            for want, v in zip(values, converted.weights):
                self.assertAllEqual(np.asarray(v), want)
        # A decoder too (Gumbel adds its temperature, after the carried
        # weights of its layer).
        converted = convert_backbone(self.gpt2, kav.GumbelDiscreteAttention)
        paths = [v.path for v in self.gpt2.weights]
        self.assertEqual(
            [v.path for v in converted.weights if v.path in paths], paths
        )

    @parameterized.named_parameters(ENCODER_CASES)
    def test_hybrid_at_zero_is_lossless_and_adds_one_weight_per_layer(
        self, name
    ):
        original = self.originals[name]
        converted = convert_backbone(
            original, kav.HybridAttention, hybrid_init=0.0
        )
        self.assertIsInstance(converted, type(original))
        self.assertEqual(type(converted).__name__, type(original).__name__)
        self.assertEqual(
            converted.get_config()["num_layers"], original.num_layers
        )
        layers = self_attention_layers(converted)
        self.assertTrue(all(isinstance(x, kav.HybridAttention) for x in layers))
        # One new (num_heads,) mixing weight per distinct attention layer;
        # no variable is duplicated (ALBERT's shared layer counts once).
        num_distinct = 1 if name == "albert" else 2
        self.assertLen(layers, num_distinct)
        self.assertLen(converted.weights, len(original.weights) + num_distinct)
        ids = [id(v) for v in converted.weights]
        self.assertLen(set(ids), len(ids))
        # Every original weight is carried over by path.
        originals = {v.path: np.asarray(v) for v in original.weights}
        for v in converted.weights:
            if v.path.endswith("hybrid_weight"):
                self.assertAllClose(np.asarray(v), np.zeros(2))
            else:
                self.assertAllClose(np.asarray(v), originals[v.path])
        # Parity: everywhere without padding; on real tokens with padding
        # (padded queries get zero attention in the converted layers).
        full = backbone_inputs(original, lengths=(6, 6))
        self.assertAllClose(
            sequence_output(converted, full),
            sequence_output(original, full),
            atol=1e-5,
        )
        padded = backbone_inputs(original, lengths=(6, 3))
        valid = padded["padding_mask"].astype(bool)
        self.assertAllClose(
            sequence_output(converted, padded)[valid],
            sequence_output(original, padded)[valid],
            atol=1e-5,
        )

    def test_seed_gives_each_layer_its_own_seed(self):
        # One seed for every layer made them all draw the same dropout
        # masks and the same Gumbel noise (the demo converted with seed=0).
        converted = convert_backbone(
            ENCODERS["bert"](), kav.GumbelDiscreteAttention, seed=5
        )
        layers = self_attention_layers(converted)
        self.assertEqual([x.seed for x in layers], [5, 6])
        noise_seeds = [
            int(keras.ops.convert_to_numpy(x.seed_generator.state)[0])
            for x in layers
        ]
        self.assertNotEqual(noise_seeds[0], noise_seeds[1])
        # With the same weights, the two layers draw different samples.
        layers[1].set_weights(layers[0].get_weights())
        x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32")
        draws = [
            keras.ops.convert_to_numpy(
                layer(x, x, training=True, return_attention_scores=True)[1]
            )
            for layer in layers
        ]
        self.assertGreater(np.abs(draws[0] - draws[1]).max(), 1e-3)
        path = os.path.join(self.get_temp_dir(), "gumbel.keras")
        converted.save(path)
        reloaded = self_attention_layers(keras.saving.load_model(path))
        self.assertEqual([x.seed for x in reloaded], [5, 6])

    @parameterized.named_parameters(ENCODER_CASES)
    def test_keras_and_saved_model_round_trips(self, name):
        original = self.originals[name]
        converted = convert_backbone(
            original, kav.DoublyNormalizedAttention, iterations=2
        )
        data = backbone_inputs(original)
        expected = sequence_output(converted, data)
        path = os.path.join(self.get_temp_dir(), f"{name}.keras")
        converted.save(path)
        reloaded = keras.saving.load_model(path)
        self.assertIsInstance(reloaded, type(original))
        layers = self_attention_layers(reloaded)
        self.assertTrue(
            all(type(x) is kav.DoublyNormalizedAttention for x in layers)
        )
        self.assertTrue(all(x.iterations == 2 for x in layers))
        self.assertAllClose(sequence_output(reloaded, data), expected, atol=0)
        if keras.backend.backend() != "tensorflow":
            return
        import tensorflow as tf

        export_dir = os.path.join(self.get_temp_dir(), f"{name}_saved")
        converted.export(export_dir, verbose=False)
        loaded = tf.saved_model.load(export_dir)
        served = loaded.serve({k: tf.constant(v) for k, v in data.items()})
        if isinstance(served, dict):
            served = served["sequence_output"]
        self.assertAllClose(np.asarray(served), expected, atol=1e-6)

    @parameterized.named_parameters(ENCODER_CASES)
    def test_padding_invariance_dnas_and_hnas(self, name):
        # Sharpened scores: with the near-uniform attention of a random
        # init, padded queries leaking into DNAS's column step moved the
        # outputs by less than the tolerance.
        original = ENCODERS[name]()
        for v in original.weights:
            if v.path.endswith(("query/kernel", "key/kernel")):
                v.assign(v * 30.0)
        for cls, kwargs in (
            (kav.DoublyNormalizedAttention, {}),
            (kav.HybridAttention, {"hybrid_init": 0.7}),
        ):
            converted = convert_backbone(original, cls, **kwargs)
            short = backbone_inputs(original, lengths=(5, 3), total=5)
            long = backbone_inputs(original, lengths=(5, 3), total=8)
            long["token_ids"][:, :5] = short["token_ids"]
            out_short = sequence_output(converted, short)
            out_long = sequence_output(converted, long)
            valid = short["padding_mask"].astype(bool)
            self.assertAllClose(
                out_long[:, :5][valid], out_short[valid], atol=1e-5
            )

    def test_padded_queries_would_leak_without_self_attention_padding(self):
        # The trap `self_attention_padding` avoids: keras-hub masks only
        # keys, so padded queries join DNAS's normalization over queries.
        original = ENCODERS["bert"]()
        # Sharpen the scores: near-uniform attention hides the leak.
        for v in original.weights:
            if v.path.endswith(("query/kernel", "key/kernel")):
                v.assign(v * 30.0)
        leaky = convert_backbone(
            original,
            kav.DoublyNormalizedAttention,
            self_attention_padding=False,
        )
        short = backbone_inputs(original, lengths=(5, 3), total=5)
        long = backbone_inputs(original, lengths=(5, 3), total=8)
        long["token_ids"][:, :5] = short["token_ids"]
        valid = short["padding_mask"].astype(bool)
        diff = np.abs(
            sequence_output(leaky, long)[:, :5][valid]
            - sequence_output(leaky, short)[valid]
        )
        # 10x above the tolerance of the invariance test.
        self.assertGreater(diff.max(), 1e-4)

    def test_albert_groups_keep_sharing(self):
        original = keras_hub.models.AlbertBackbone(
            vocabulary_size=50,
            num_layers=4,
            num_heads=2,
            embedding_dim=4,
            hidden_dim=8,
            intermediate_dim=16,
            num_groups=2,
            num_inner_repetitions=1,
            max_sequence_length=8,
        )
        converted = convert_backbone(original, kav.DoublyNormalizedAttention)
        # DNAS adds no variable: counts are equal, layers still shared.
        self.assertLen(converted.weights, len(original.weights))
        self.assertLen(self_attention_layers(converted), 2)
        for group in converted.transformer_layers:
            self.assertIsInstance(
                group[0]._self_attention_layer, kav.DoublyNormalizedAttention
            )

    def test_decoder_rejects_non_causal_variants(self):
        original = self.gpt2
        for cls in (kav.DoublyNormalizedAttention, kav.HybridAttention):
            with self.assertRaisesRegex(ValueError, "not causal"):
                convert_backbone(original, cls)

    def test_decoder_with_user_subclass_keeps_cache_path(self):
        original = self.gpt2
        converted = convert_backbone(original, ScaledLogitsAttention)
        layers = self_attention_layers(converted)
        self.assertIsInstance(layers[0], ScaledLogitsAttention)
        self.assertIsInstance(
            layers[0], keras_hub.layers.CachedMultiHeadAttention
        )
        self.assertLen(converted.weights, len(original.weights))
        data = backbone_inputs(original, lengths=(6, 4))
        valid = data["padding_mask"].astype(bool)
        # scale=1 reproduces keras MHA with the carried-over weights.
        self.assertAllClose(
            sequence_output(converted, data)[valid],
            sequence_output(original, data)[valid],
            atol=1e-5,
        )
        # The decoder's KV-cache call path still works.
        block = converted.transformer_layers[0]
        x = np.random.default_rng(0).normal(size=(2, 1, 8)).astype("float32")
        cache = np.zeros((2, 2, 4, 2, 4), "float32")
        out, new_cache = block(
            x, self_attention_cache=cache, self_attention_cache_update_index=0
        )
        self.assertEqual(tuple(out.shape), (2, 1, 8))
        self.assertEqual(tuple(new_cache.shape), cache.shape)

    def test_decoder_accepts_keras_hub_cached_attention(self):
        # The decoders' own class was refused: its `call` is the cached
        # call path itself, not one that path would skip.
        original = self.gpt2
        converted = convert_backbone(
            original, keras_hub.layers.CachedMultiHeadAttention
        )
        layers = self_attention_layers(converted)
        self.assertTrue(
            all(
                type(x) is keras_hub.layers.CachedMultiHeadAttention
                for x in layers
            )
        )
        data = backbone_inputs(original)
        self.assertAllClose(
            sequence_output(converted, data),
            sequence_output(original, data),
            atol=0,
        )

    def test_unregistered_class_from_a_script_converts(self):
        # Only reloading needs a registered class; a class defined in a
        # script (`__main__`) or a function was refused at conversion.
        class LocalAttention(keras.layers.MultiHeadAttention):
            pass

        original = self.originals["bert"]
        converted = convert_backbone(original, LocalAttention)
        layers = self_attention_layers(converted)
        self.assertTrue(all(type(x) is LocalAttention for x in layers))
        data = backbone_inputs(original)
        self.assertAllClose(
            sequence_output(converted, data),
            sequence_output(original, data),
            atol=0,
        )
        reference = converted.get_config()["attention_config"]
        self.assertEqual(
            reference["attention_class"]["class_name"],
            LocalAttention.__qualname__,
        )

    def test_frozen_layers_stay_frozen(self):
        # A frozen backbone: the converted attention was trainable, so a
        # task model on top trained it.
        frozen = ENCODERS["bert"]()
        frozen.trainable = False
        converted = convert_backbone(
            frozen, kav.HybridAttention, hybrid_init=0.0
        )
        self.assertFalse(converted.trainable)
        self.assertEqual([v.path for v in converted.weights if v.trainable], [])
        # Rebuilt from its config (as in a `.keras` reload), the attention
        # is frozen like its sibling layers (which keras-hub leaves
        # trainable under PyTorch, with only the backbone's flag off).
        reloaded = type(converted).from_config(converted.get_config())
        for block in reloaded.transformer_layers:
            sibling = block._feedforward_output_dense.kernel.trainable
            attention = block._self_attention_layer
            self.assertEqual(
                {v.trainable for v in attention.weights}, {sibling}
            )
        # Frozen sublayers: their flags were reset to trainable.
        partly = ENCODERS["bert"]()
        partly.token_embedding.trainable = False
        partly.transformer_layers[0].trainable = False
        converted = convert_backbone(
            partly, kav.HybridAttention, hybrid_init=0.0
        )
        self.assertFalse(converted.token_embedding.trainable)
        self.assertFalse(converted.transformer_layers[0].trainable)
        self.assertEqual(
            sorted(v.path for v in converted.trainable_weights),
            sorted(
                [v.path for v in partly.trainable_weights]
                + ["transformer_layer_1/self_attention_layer/hybrid_weight"]
            ),
        )

    def test_frozen_block_leaves_the_shared_terms_trainable(self):
        # Keras's `trainable` setter recurses: copying a frozen block's
        # flag reached the term shared by every block, so the adversary of
        # the unfrozen blocks never trained.
        partly = ENCODERS["bert"]()
        partly.transformer_layers[0].trainable = False
        term = kav.KQAlignment(method="gan")
        converted = convert_backbone(
            partly, kav.HybridAttention, [term], hybrid_init=0.0
        )
        self.assertFalse(converted.transformer_layers[0].trainable)
        self.assertTrue(term.trainable)
        self.assertEqual(len(term.trainable_weights), len(term.weights))
        self.assertGreater(len(term.weights), 0)
        # A term the caller froze stays frozen.
        frozen_term = kav.KQAlignment(method="gan")
        frozen_term.trainable = False
        convert_backbone(
            ENCODERS["bert"](),
            kav.HybridAttention,
            [frozen_term],
            hybrid_init=0.0,
        )
        self.assertEqual(frozen_term.trainable_weights, [])

    def test_guidance_terms_have_their_own_step_paths(self):
        # Every guidance term's counter had the bare path "step": two terms
        # could not be attached (duplicate path), and converting again with
        # a new term copied the old term's count into it.
        first = kav.AttentionGuidanceRegularizer({0: "next"}, 1.0, name="next")
        second = kav.AttentionGuidanceRegularizer({1: "prev"}, 1.0, name="prev")
        converted = convert_backbone(
            self.originals["bert"],
            kav.HybridAttention,
            [first, second],
            hybrid_init=0.0,
        )
        self.assertNotEqual(first.step.path, second.step.path)
        first.step.assign(80.0)
        fresh = kav.AttentionGuidanceRegularizer({0: "next"}, 1.0, name="fresh")
        convert_backbone(
            converted, kav.HybridAttention, [fresh], hybrid_init=0.0
        )
        self.assertEqual(float(keras.ops.convert_to_numpy(fresh.step)), 0.0)

    def test_blocks_with_model_specific_attention_raise(self):
        # Whisper's attention has no key bias, Moonshine's blocks keep a
        # rotary attention elsewhere: an obscure weight-name error and an
        # AttributeError before.
        whisper = keras_hub.models.WhisperBackbone(
            vocabulary_size=50,
            num_layers=1,
            num_heads=2,
            hidden_dim=8,
            intermediate_dim=16,
            num_mels=4,
            max_encoder_sequence_length=8,
            max_decoder_sequence_length=8,
        )
        with self.assertRaisesRegex(
            ValueError,
            "WhisperCachedMultiHeadAttention.*"
            "Received: backbone of class WhisperBackbone",
        ):
            convert_backbone(whisper, keras.layers.MultiHeadAttention)
        moonshine = keras_hub.models.MoonshineBackbone(
            vocabulary_size=50,
            filter_dim=8,
            encoder_num_layers=1,
            decoder_num_layers=1,
            hidden_dim=8,
            intermediate_dim=16,
            encoder_num_heads=2,
            decoder_num_heads=2,
        )
        message = "MoonshineEncoderBlock.*Received: backbone of class Moon"
        with self.assertRaisesRegex(ValueError, message):
            convert_backbone(moonshine, keras.layers.MultiHeadAttention)
        with self.assertRaisesRegex(ValueError, message):
            self_attention_layers(moonshine)

    def test_decoder_alignment_term_ignores_padding(self):
        # A causal decoder with right padding lets padded queries attend
        # the real keys before them; they must still stay out of the query
        # cloud, so the term does not depend on how much padding follows.
        original = gpt2(dropout=0.0)
        term = kav.KQAlignment(method="mmd", weight=1.0)
        converted = convert_backbone(
            original, SoftmaxAttention, attention_losses=[term]
        )
        values = []
        padded = backbone_inputs(original, lengths=(4, 3), total=8)
        for total in (4, 6, 8):
            data = {key: value[:, :total] for key, value in padded.items()}
            converted(data, training=True)
            values.append(
                float(
                    sum(keras.ops.convert_to_numpy(x) for x in converted.losses)
                )
            )
        self.assertGreater(values[0], 0.0)
        self.assertAllClose(values[1:], [values[0]] * 2, atol=1e-6)

    def test_key_query_mmd_ignores_padding(self):
        # keras-hub blocks mask only padded keys (encoders) or let padded
        # queries attend earlier real keys (decoders): the diagnostic must
        # still leave padded queries out, for original models too.
        from keras_attnvariants.losses.kq_diagnostics import key_query_mmd

        models = {
            "bert": self.originals["bert"],
            "bert_converted": convert_backbone(
                self.originals["bert"], kav.HybridAttention, hybrid_init=0.0
            ),
            "gpt2": self.gpt2,
        }
        for name, model in models.items():
            padded = backbone_inputs(model, lengths=(5, 3), total=8)
            totals = [
                key_query_mmd(
                    model, [{k: v[:, :total] for k, v in padded.items()}]
                )["total"]
                for total in (5, 8)
            ]
            self.assertGreater(totals[0], 0.0, name)
            self.assertAllClose(totals[1], totals[0], atol=1e-5, msg=name)

    def test_user_subclass_in_encoder_changes_outputs_as_defined(self):
        original = self.originals["bert"]
        same = convert_backbone(original, ScaledLogitsAttention)
        sharper = convert_backbone(original, ScaledLogitsAttention, scale=300.0)
        data = backbone_inputs(original, lengths=(6, 6))
        self.assertAllClose(
            sequence_output(same, data),
            sequence_output(original, data),
            atol=1e-5,
        )
        self.assertGreater(
            np.abs(
                sequence_output(sharper, data) - sequence_output(same, data)
            ).max(),
            1e-4,
        )

    def test_reconversion_starts_from_the_original_class(self):
        original = self.originals["bert"]
        hnas = convert_backbone(original, kav.HybridAttention, hybrid_init=0.3)
        dnas = convert_backbone(hnas, kav.DoublyNormalizedAttention)
        self.assertIs(type(dnas).__mro__[2], keras_hub.models.BertBackbone)
        self.assertLen(dnas.weights, len(original.weights))

    def test_invalid_arguments(self):
        original = self.originals["bert"]
        with self.assertRaisesRegex(ValueError, "attention_class"):
            convert_backbone(original, keras.layers.Dense)
        with self.assertRaisesRegex(ValueError, "attention_losses"):
            convert_backbone(
                original,
                keras.layers.MultiHeadAttention,
                attention_losses=[kav.AttentionLoss()],
            )
        with self.assertRaisesRegex(ValueError, "hybrid_init"):
            convert_backbone(original, kav.HybridAttention, hybrid_init=2.0)
        with self.assertRaisesRegex(ValueError, "TransformerEncoder"):
            inputs = keras.Input(shape=(4,))
            dense = keras_hub.models.Backbone(
                inputs=inputs, outputs=keras.layers.Dense(2)(inputs)
            )
            convert_backbone(dense, kav.HybridAttention)

    def test_non_backbone_raises(self):
        # A task model was silently rebuilt as a converted task of a
        # generated class; a preset name or None gave AttributeError.
        task = keras_hub.models.BertTextClassifier(
            backbone=self.originals["bert"], num_classes=2, preprocessor=None
        )
        for bad in (task, "bert_base_en", None):
            with self.assertRaisesRegex(
                ValueError,
                re.escape("`backbone` must be a `keras_hub.models.Backbone`")
                + ".*Received: backbone=",
            ):
                convert_backbone(bad, kav.HybridAttention)

    def test_masked_lm_task_model_fits(self):
        # BertTextClassifier fits in attention_weights_test.py (traced,
        # with attention losses); here BertMaskedLM, eagerly where that is
        # cheap (JAX's eager ops compile one by one: 43 s against 4 s).
        backbone = convert_backbone(
            self.originals["bert"], kav.HybridAttention, hybrid_init=0.5
        )
        model = keras_hub.models.BertMaskedLM(
            backbone=backbone, preprocessor=None
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            run_eagerly=keras.backend.backend() != "jax",
        )
        data = backbone_inputs(backbone, lengths=(6, 4, 5, 2))
        data["mask_positions"] = np.array(
            [[1, 3], [0, 2], [4, 1], [0, 1]], "int32"
        )
        labels = np.take_along_axis(
            data["token_ids"], data["mask_positions"], axis=1
        )
        before = hybrid_weight_table(backbone)
        history = model.fit(data, labels, batch_size=4, epochs=3, verbose=0)
        losses = history.history["loss"]
        self.assertTrue(np.all(np.isfinite(losses)))
        self.assertLess(losses[-1], losses[0])
        # The mixing weights are trained (and stay in [0, 1]).
        after = hybrid_weight_table(backbone)
        self.assertGreater(np.abs(after - before).max(), 0.0)
        self.assertTrue(np.all((after >= 0.0) & (after <= 1.0)))

    def test_missing_keras_hub_raises_install_hint(self):
        # `import keras_hub` raises ImportError while its entry is None.
        with mock.patch.dict(sys.modules, {"keras_hub": None}):
            with self.assertRaisesRegex(
                ImportError, re.escape(conversion.INSTALL_HINT)
            ):
                convert_backbone(None, None)
        self.assertEqual(
            conversion.INSTALL_HINT,
            "pip install 'keras-attnvariants[keras-hub]'",
        )


@keras.saving.register_keras_serializable(package="kav_backbone_tests")
class SoftmaxAttention(VariantAttention):
    """Plain softmax through `VariantAttention` (causal, takes losses)."""

    def normalize(self, scores, mask):
        return masked_softmax(scores, mask)


class ScaledLogitsAttention(keras.layers.MultiHeadAttention):
    """A user's own MHA subclass: softmax of `scale * QK^T / sqrt(H)`."""

    def __init__(self, num_heads, key_dim, scale=1.0, **kwargs):
        super().__init__(num_heads=num_heads, key_dim=key_dim, **kwargs)
        self.scale = scale

    def _compute_attention(self, query, key, value, *args, **kwargs):
        return super()._compute_attention(
            query * self.scale, key, value, *args, **kwargs
        )

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}
