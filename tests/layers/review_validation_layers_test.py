"""Argument checks of the attention layers and the two-stream layers found
by a validation sweep (2026-11-26): each input here was accepted silently,
applied twice, broadcast, or failed deep in a backend op."""

import keras
import numpy as np
import pytest
from absl.testing import parameterized
from keras import ops

import keras_attnvariants as kav
from keras_attnvariants.layers.two_stream_block import TwoStreamBlock
from keras_attnvariants.layers.two_stream_encoder import TwoStreamEncoder
from keras_attnvariants.testing.test_case import TestCase

LAYERS = {
    "dnas": kav.DoublyNormalizedAttention,
    "hnas": kav.HybridAttention,
    "gumbel": kav.GumbelDiscreteAttention,
}


def _x(batch=2, length=3, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(batch, length, dim)).astype("float32")


class ConstructorTest(TestCase):
    @parameterized.parameters(*LAYERS)
    def test_a_term_listed_twice_is_rejected(self, name):
        # It added its value twice per call.
        term = kav.KQAlignment(method="mmd", weight=1.0)
        with self.assertRaisesRegex(ValueError, "each term once"):
            LAYERS[name](2, 2, attention_losses=[term, term])

    @parameterized.parameters(
        ("num_heads", {"num_heads": True}),
        ("num_heads", {"num_heads": 2.0}),
        ("key_dim", {"key_dim": True}),
        ("key_dim", {"key_dim": 0}),
        ("value_dim", {"value_dim": True}),
        ("use_bias", {"use_bias": "no"}),
        ("use_bias", {"use_bias": None}),
        # "no" built a gate.
        ("use_gate", {"use_gate": "no"}),
        ("sliding_window", {"sliding_window": 0}),
        ("sliding_window", {"sliding_window": 2.0}),
        ("output_shape", {"output_shape": 0}),
        ("output_shape", {"output_shape": (4, 0)}),
        ("output_shape", {"output_shape": ()}),
    )
    def test_bad_sizes_and_flags_raise_naming_the_argument(self, arg, bad):
        kwargs = dict({"num_heads": 2, "key_dim": 2}, **bad)
        for cls in LAYERS.values():
            with self.assertRaisesRegex(ValueError, f"`{arg}` must be"):
                cls(**kwargs)

    def test_numpy_ints_are_accepted_and_stored_as_python_ints(self):
        layer = kav.HybridAttention(
            np.int64(2),
            np.int32(3),
            value_dim=np.int64(4),
            output_shape=np.int64(5),
            use_bias=np.bool_(False),
            use_gate=np.bool_(False),
            sliding_window=np.int64(2),
        )
        config = layer.get_config()
        for key, want in (
            ("num_heads", 2),
            ("key_dim", 3),
            ("value_dim", 4),
            ("output_shape", (5,)),  # Keras MHA stores a tuple
            ("use_bias", False),
            ("use_gate", False),
            ("sliding_window", 2),
        ):
            self.assertIs(type(config[key]), type(want))
            self.assertEqual(config[key], want)
        out = layer(_x(), _x())
        self.assertEqual(tuple(out.shape), (2, 3, 5))

    def test_output_shape_tuple_round_trips(self):
        layer = kav.DoublyNormalizedAttention(2, 2, output_shape=[3, 2])
        self.assertEqual(layer.get_config()["output_shape"], (3, 2))
        out = layer(_x(), _x())
        self.assertEqual(tuple(out.shape), (2, 3, 3, 2))
        clone = kav.DoublyNormalizedAttention.from_config(layer.get_config())
        self.assertEqual(tuple(clone(_x(), _x()).shape), (2, 3, 3, 2))

    @parameterized.parameters(*LAYERS)
    def test_attention_axes_minus_two_is_the_sequence_axis(self, name):
        # Keras MHA takes it for `(B, T, dim)` inputs; it was refused.
        x = _x()
        plain = LAYERS[name](2, 2, seed=1)
        want = ops.convert_to_numpy(plain(x, x))
        for axes in (-2, (-2,), [-2]):
            layer = LAYERS[name](2, 2, seed=1, attention_axes=axes)
            layer(x, x)
            layer.set_weights(plain.get_weights())
            self.assertAllClose(ops.convert_to_numpy(layer(x, x)), want)
            clone = LAYERS[name].from_config(layer.get_config())
            self.assertEqual(tuple(clone(x, x).shape), want.shape)

    @parameterized.parameters(*LAYERS)
    def test_attention_axes_as_numpy_ints(self, name):
        # A NumPy 1 passed the check, then Keras MHA refused it with a
        # message that printed `attention_axes=1`; True counted as 1.
        for axes in (np.int64(1), (np.int64(1),), [np.int32(-2)]):
            layer = LAYERS[name](2, 2, attention_axes=axes)
            self.assertEqual(layer.get_config()["attention_axes"], (1,))
            self.assertIs(type(layer.get_config()["attention_axes"][0]), int)
        for axes in (True, (True,), np.True_):
            with self.assertRaisesRegex(
                ValueError, r"attention_axes=\(?(np\.)?True"
            ):
                LAYERS[name](2, 2, attention_axes=axes)

    def test_attention_axes_message_shows_the_repr(self):
        with self.assertRaisesRegex(ValueError, "attention_axes='x'"):
            kav.HybridAttention(2, 2, attention_axes="x")


class CallFlagsTest(TestCase):
    # "no" is truthy: `use_causal_mask="no"` made the Gumbel layer causal.
    @parameterized.product(
        name=list(LAYERS), flag=["use_causal_mask", "return_attention_scores"]
    )
    def test_non_bool_flag_raises(self, name, flag):
        layer = LAYERS[name](2, 2)
        with self.assertRaisesRegex(
            ValueError, f"`{flag}` must be a bool.*'no'"
        ):
            layer(_x(), _x(), **{flag: "no"})


class ListMaskTest(TestCase):
    # Keras MHA takes masks as nested lists (it casts them); the mask checks
    # read `.shape` and failed with AttributeError.
    @parameterized.product(
        name=list(LAYERS),
        arg=["query_mask", "value_mask", "key_mask", "attention_mask"],
    )
    def test_list_masks_act_as_arrays(self, name, arg):
        query, value = _x(length=3), _x(length=4, seed=1)
        masks = {
            "query_mask": np.array([[1, 1, 0], [1, 0, 0]], bool),
            "value_mask": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool),
            "key_mask": np.array([[1, 0, 1, 1], [1, 1, 1, 0]], bool),
            "attention_mask": np.random.default_rng(2).random((2, 3, 4)) > 0.3,
        }
        layer = LAYERS[name](2, 2, seed=3)
        want = layer(query, value, **{arg: masks[arg]}, training=False)
        got = layer(query, value, **{arg: masks[arg].tolist()}, training=False)
        self.assertAllClose(got, want)
        # And a wrong list still gets the shape error.
        with self.assertRaisesRegex(ValueError, f"`{arg}`.*Received"):
            layer(query, value, **{arg: masks[arg][:, :2].tolist()})


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="JAX and PyTorch trace with known sizes",
)
class GraphShapeTest(TestCase):
    """In a TensorFlow graph with unknown sizes (an exported model), the
    static checks see `None`: the mismatch is checked when it runs."""

    @parameterized.parameters(*LAYERS)
    def test_batch_mismatch_raises_when_the_graph_runs(self, name):
        import tensorflow as tf

        layer = LAYERS[name](2, 2)
        layer(_x(), _x())
        spec = tf.TensorSpec((None, None, 4), tf.float32)
        fn = tf.function(lambda q, v: layer(q, v), input_signature=[spec] * 2)
        # Equal batches run; a value batch of 1 was broadcast before.
        self.assertEqual(tuple(fn(_x(2), _x(2, 5)).shape), (2, 3, 4))
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError, "same batch size"
        ):
            fn(_x(2), _x(1, 5))

    @parameterized.parameters(*LAYERS)
    def test_key_length_mismatch_raises_when_the_graph_runs(self, name):
        import tensorflow as tf

        layer = LAYERS[name](2, 2)
        layer(_x(), _x(), _x())
        spec = tf.TensorSpec((None, None, 4), tf.float32)
        fn = tf.function(
            lambda q, v, k: layer(q, v, k), input_signature=[spec] * 3
        )
        self.assertEqual(tuple(fn(_x(), _x(2, 5), _x(2, 5)).shape), (2, 3, 4))
        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError, "same length"
        ):
            fn(_x(), _x(2, 5), _x(2, 4))

    def test_self_attention_graph_keeps_no_assertion(self):
        """One tensor passed as query, value and key always agrees with
        itself: its graph has no `Assert` (about 27 ops per call before);
        cross-attention's keeps one."""
        import tensorflow as tf

        layer = LAYERS["hnas"](2, 2)
        layer(_x(), _x())
        spec = tf.TensorSpec((None, None, 4), tf.float32)

        def asserts(fn, n):
            graph = tf.function(fn, input_signature=[spec] * n)
            ops_ = graph.get_concrete_function().graph.get_operations()
            return sum(op.type == "Assert" for op in ops_)

        self.assertEqual(asserts(lambda x: layer(x, x), 1), 0)
        self.assertEqual(asserts(lambda x: layer(x, x, x), 1), 0)
        self.assertGreater(asserts(lambda q, v: layer(q, v), 2), 0)
        self.assertGreater(asserts(lambda q, v: layer(q, v, v), 2), 0)

    def test_jit_compiled_fit_still_runs(self):
        # XLA drops the assertion; it must not stop compilation.
        x = keras.Input((None, 4))
        model = keras.Model(x, kav.HybridAttention(2, 2)(x, x))
        model.compile("sgd", "mse", jit_compile=True)
        history = model.fit(_x(4), np.zeros((4, 3, 4)), epochs=1, verbose=0)
        self.assertTrue(np.isfinite(history.history["loss"][0]))


class TwoStreamArgumentsTest(TestCase):
    def test_padding_mask_with_another_batch_raises(self):
        g = _x()
        mask = np.ones((3, 3), bool)
        with self.assertRaisesRegex(
            ValueError, r"`padding_mask` must be `\(B=2, T=3\)`"
        ):
            TwoStreamBlock(4, 2, 8)((g, g), padding_mask=mask)
        # A batch of 1 still broadcasts.
        (g2, _), _ = TwoStreamBlock(4, 2, 8)(
            (g, g), padding_mask=np.ones((1, 3), bool)
        )
        self.assertEqual(tuple(g2.shape), (2, 3, 4))

    def test_list_padding_mask_acts_as_an_array(self):
        # A nested list is checked by its NumPy shape, like the masks of
        # the attention layers, and then used as the array would be.
        g, h = _x(), _x(seed=1)
        mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
        block = TwoStreamBlock(4, 2, 8, seed=0)
        (_, want), _ = block((g, h), padding_mask=mask)
        (_, got), _ = block((g, h), padding_mask=mask.tolist())
        self.assertAllClose(got, want)
        with self.assertRaisesRegex(
            ValueError, r"`padding_mask`.*Received: padding_mask.shape=\(2, 2\)"
        ):
            block((g, h), padding_mask=mask[:, :2].tolist())

    def test_integer_streams_raise(self):
        # They failed in a backend matmul (InvalidArgumentError, ...).
        ids = np.ones((2, 3, 4), "int32")
        with self.assertRaisesRegex(
            ValueError, "streams must be float.*dtype int32"
        ):
            TwoStreamBlock(4, 2, 8)((ids, ids))
        with self.assertRaisesRegex(ValueError, "streams must be float"):
            TwoStreamBlock(4, 2, 8, mode="single_stream")(ids)
        # float64 streams are cast to the policy, as before.
        (g, _), _ = TwoStreamBlock(4, 2, 8)((_x().astype("float64"),) * 2)
        self.assertEqual(tuple(g.shape), (2, 3, 4))

    def test_non_bool_flags_raise(self):
        g = _x()
        with self.assertRaisesRegex(ValueError, "`use_causal_mask` must be"):
            TwoStreamBlock(4, 2, 8)((g, g), use_causal_mask="no")
        encoder = TwoStreamEncoder(10, 6, 1, d_model=4, num_heads=2, d_ff=8)
        tokens = np.array([[3, 4, 5, 0]])
        with self.assertRaisesRegex(ValueError, "`use_causal_mask` must be"):
            encoder(tokens, use_causal_mask="no")
        with self.assertRaisesRegex(ValueError, "`return_attention` must be"):
            encoder(tokens, return_attention="no")

    def test_numpy_int_view_is_the_python_int_view(self):
        tokens = np.array([[3, 4, 5, 0], [1, 2, 0, 0]])
        encoder = TwoStreamEncoder(
            10, 6, 1, d_model=4, num_heads=2, d_ff=8, num_views=2, seed=0
        )
        self.assertAllClose(
            encoder(tokens, view=np.int64(1)), encoder(tokens, view=1)
        )
        block = TwoStreamBlock(4, 2, 8, num_controllers=2)
        g = _x()
        (_, h_numpy), _ = block((g, g), view=np.int64(1))
        (_, h_int), _ = block((g, g), view=1)
        self.assertAllClose(h_numpy, h_int)
