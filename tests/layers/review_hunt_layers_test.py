"""Regression tests from a bug hunt over the layers package.

Each test fails without the fix it names.
"""

import keras
import numpy as np
from absl.testing import parameterized

import keras_attnvariants as kav
from keras_attnvariants.layers.gumbel_discrete_attention import (
    GumbelDiscreteAttention,
)
from keras_attnvariants.layers.two_stream_block import TwoStreamBlock
from keras_attnvariants.layers.two_stream_encoder import TwoStreamEncoder
from keras_attnvariants.losses import AttentionGuidanceRegularizer
from keras_attnvariants.testing.test_case import TestCase

LAYERS = {
    "dnas": (kav.DoublyNormalizedAttention, {}),
    "hnas": (kav.HybridAttention, {"hybrid_init": 0.3}),
    "gumbel": (GumbelDiscreteAttention, {}),
}
CASES = [{"testcase_name": name, "name": name} for name in LAYERS]


def make(name, **kwargs):
    cls, init = LAYERS[name]
    return cls(num_heads=2, key_dim=3, **init, **kwargs)


class AttentionArgumentsTest(TestCase, parameterized.TestCase):
    @parameterized.named_parameters(("single_term", "term"), ("int", 5))
    def test_attention_losses_not_a_list_raises_value_error(self, value):
        # A single term (not in a list) raised `TypeError: ... not
        # iterable`.
        if value == "term":
            value = AttentionGuidanceRegularizer({0: "prev"}, alpha=0.1)
        for name in LAYERS:
            with self.assertRaisesRegex(
                ValueError, "`attention_losses` must be a list.*Received"
            ):
                make(name, attention_losses=value)

    @parameterized.named_parameters(*CASES)
    def test_attention_losses_tuple_is_accepted(self, name):
        term = AttentionGuidanceRegularizer({0: "prev"}, alpha=0.1)
        layer = make(name, attention_losses=(term,))
        self.assertEqual(layer.attention_losses, [term])

    @parameterized.named_parameters(
        ("negative", -1), ("too_large", 2**31), ("bool", True), ("float", 1.5)
    )
    def test_bad_seed_raises_at_construction(self, seed):
        # DNAS and HNAS passed `seed` to Keras's dropout generator
        # unchecked: -1 and 2**31 failed only at the first training call
        # on JAX and PyTorch (OverflowError / RuntimeError) and 2**32 drew
        # seed 0's masks on TensorFlow; `True` was taken as 1 on JAX.
        for name in LAYERS:
            with self.assertRaisesRegex(
                ValueError, r"`seed` must be an int in \[0, 2\*\*31\)"
            ):
                make(name, dropout=0.5, seed=seed)

    @parameterized.named_parameters(*CASES)
    def test_numpy_int_seed_trains_and_serializes(self, name):
        # Keras's SeedGenerator rejected a NumPy int seed.
        layer = make(name, dropout=0.5, seed=np.int64(3))
        config = layer.get_config()
        self.assertIs(type(config["seed"]), int)
        self.assertEqual(config["seed"], 3)
        x = np.random.default_rng(0).normal(size=(2, 4, 6)).astype("float32")
        out = keras.ops.convert_to_numpy(layer(x, x, training=True))
        self.assertTrue(np.isfinite(out).all())

    @parameterized.named_parameters(*CASES)
    def test_flash_attention_true_raises(self, name):
        # Keras MHA's `flash_attention=True` was silently ignored (scores
        # were returned where MHA raises), and with `dropout > 0` MHA's
        # constructor raised "Dropout is not supported when flash attention
        # is enabled" although these layers' dropout works.
        for dropout in (0.0, 0.1):
            with self.assertRaisesRegex(
                ValueError,
                "`flash_attention` must be None or False.*attention_path.*"
                "Received: flash_attention=True",
            ):
                make(name, flash_attention=True, dropout=dropout)
        # `None` and `False` are accepted (and have no effect: the kernel
        # is chosen with `attention_path`).
        make(name, flash_attention=False, dropout=0.1)
        make(name, flash_attention=None, dropout=0.1)


class SymbolicCallValidationTest(TestCase, parameterized.TestCase):
    @parameterized.named_parameters(("dnas", "dnas"), ("hnas", "hnas"))
    def test_functional_causal_call_of_non_causal_layer_raises(self, name):
        # A functional model was built with `use_causal_mask=True` and
        # failed only when it ran.
        query = keras.Input((None, 6))
        with self.assertRaisesRegex(ValueError, "is not causal"):
            make(name)(query, query, use_causal_mask=True)

    def test_functional_causal_call_of_gumbel_still_builds(self):
        query = keras.Input((None, 6))
        out, scores = make("gumbel")(
            query, query, use_causal_mask=True, return_attention_scores=True
        )
        self.assertEqual(tuple(out.shape), (None, None, 6))
        self.assertEqual(tuple(scores.shape), (None, 2, None, None))

    def test_two_stream_block_functional_bad_view_raises(self):
        g = keras.Input((None, 8))
        h = keras.Input((None, 8))
        with self.assertRaisesRegex(ValueError, "`view` must be an int"):
            TwoStreamBlock(8, 2, 16)((g, h), view=1)

    def test_two_stream_block_functional_bad_padding_mask_raises(self):
        g = keras.Input((5, 8))
        h = keras.Input((5, 8))
        for shape in ((5, 1), (4,)):
            mask = keras.Input(shape, dtype="bool")
            with self.assertRaisesRegex(ValueError, "`padding_mask` must be"):
                TwoStreamBlock(8, 2, 16)((g, h), padding_mask=mask)

    def test_two_stream_block_functional_valid_call_runs(self):
        g = keras.Input((None, 8))
        h = keras.Input((None, 8))
        mask = keras.Input((None,), dtype="bool")
        block = TwoStreamBlock(8, 2, 16, num_controllers=2)
        (g2, h2), z = block((g, h), padding_mask=mask, view=1)
        model = keras.Model([g, h, mask], [g2, h2, z])
        rng = np.random.default_rng(0)
        x = rng.normal(size=(2, 5, 8)).astype("float32")
        valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
        outputs = model.predict([x, x, valid], verbose=0)
        self.assertEqual(outputs[2].shape, (2, 2, 5, 5))

    def test_two_stream_encoder_functional_bad_view_raises(self):
        tokens = keras.Input((None,), dtype="int32")
        encoder = TwoStreamEncoder(10, 6, 1, d_model=8, num_heads=2, d_ff=16)
        with self.assertRaisesRegex(ValueError, "`view` must be an int"):
            encoder(tokens, view=1)
        out = TwoStreamEncoder(
            10, 6, 1, d_model=8, num_heads=2, d_ff=16, num_views=2
        )(tokens, view=1)
        self.assertEqual(tuple(out.shape), (None, None, 8))

    def test_two_stream_encoder_functional_bad_flags_raise(self):
        # Built without complaint, they failed only when the model ran.
        tokens = keras.Input((None,), dtype="int32")
        encoder = TwoStreamEncoder(10, 6, 1, d_model=8, num_heads=2, d_ff=16)
        with self.assertRaisesRegex(ValueError, "`return_attention` must"):
            encoder(tokens, return_attention=1)
        with self.assertRaisesRegex(ValueError, "`use_causal_mask` must"):
            encoder(tokens, use_causal_mask="no")


class TwoStreamBlockBuildTest(TestCase):
    def test_failed_build_leaves_no_variable_behind(self):
        # `build` added the temperature before checking the input shapes:
        # after a rejected build, the next one added a second temperature
        # (weights no longer matched a fresh block's, for loading).
        block = TwoStreamBlock(8, 2, 16)
        with self.assertRaisesRegex(ValueError, "`inputs` must be"):
            block.build(((2, 5, 7), (2, 5, 7)))
        self.assertEqual(block.weights, [])
        block.build(((2, 5, 8), (2, 5, 8)))
        fresh = TwoStreamBlock(8, 2, 16)
        fresh.build(((2, 5, 8), (2, 5, 8)))
        self.assertEqual(
            [w.name for w in block.weights], [w.name for w in fresh.weights]
        )

    def test_padding_mask_may_be_a_nested_list(self):
        # The shape check now runs before the cast: a list still works.
        x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
        valid = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
        block = TwoStreamBlock(8, 2, 16)
        (_, h1), _ = block((x, x), padding_mask=valid)
        (_, h2), _ = block((x, x), padding_mask=np.array(valid, bool))
        self.assertAllClose(h1, h2)
        with self.assertRaisesRegex(ValueError, "`padding_mask` must be"):
            block((x, x), padding_mask=[[1, 1, 1, 0]] * 2)


class LegacySeedTest(TestCase, parameterized.TestCase):
    @parameterized.named_parameters(("dnas", "dnas"), ("hnas", "hnas"))
    def test_saved_config_with_a_seed_outside_the_range_loads(self, name):
        # DNAS and HNAS took any int seed before seeds were checked (on
        # TensorFlow they trained and saved with seed=-1); such configs
        # must still load, with the seed wrapped into [0, 2**31).
        layer = make(name, dropout=0.1)
        config = dict(layer.get_config(), seed=-1)
        with self.assertWarnsRegex(UserWarning, "seed=-1.*seed=2147483647"):
            loaded = type(layer).from_config(config)
        self.assertEqual(loaded.get_config()["seed"], 2**31 - 1)
        x = np.ones((1, 3, 6), "float32")
        out = keras.ops.convert_to_numpy(loaded(x, x, training=True))
        self.assertTrue(np.isfinite(out).all())
