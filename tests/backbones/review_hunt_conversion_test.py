import re

import keras
import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants.backbones.attention_weights import attention_weights
from keras_attnvariants.backbones.conversion import convert_backbone
from keras_attnvariants.backbones.conversion import self_attention_layers
from keras_attnvariants.backbones.pretrained import first_layers
from keras_attnvariants.testing.test_case import TestCase

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)


def bert(dropout=0.1):
    return keras_hub.models.BertBackbone(
        vocabulary_size=30,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=6,
        dropout=dropout,
    )


def albert():
    keras.utils.set_random_seed(0)
    return keras_hub.models.AlbertBackbone(
        vocabulary_size=30,
        num_layers=4,
        num_groups=2,
        num_heads=2,
        hidden_dim=8,
        embedding_dim=8,
        intermediate_dim=16,
        max_sequence_length=6,
    )


def token_inputs():
    ids = np.array([[2, 5, 7, 9, 11, 3], [2, 4, 6, 3, 0, 0]], "int32")
    return {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": (ids != 0).astype("int32"),
    }


class ConversionReviewTest(TestCase):
    def test_first_layers_of_grouped_albert_keeps_the_first_depths(self):
        # Only `num_layers` was rewritten: 2 of 4 layers in 2 groups ran
        # group 0 then group 1 (the original runs group 0 twice), and 1
        # layer failed in keras-hub.
        original = albert()
        data = token_inputs()
        full = attention_weights(original, data)
        for count, groups in ((1, 1), (2, 1), (4, 2)):
            truncated = first_layers(original, count)
            self.assertEqual(truncated.num_groups, groups)
            got = attention_weights(truncated, data)
            self.assertLen(got, count)
            for layer_got, layer_full in zip(got, full):
                self.assertAllClose(layer_got, layer_full, atol=1e-6)
            paths = {v.path: v for v in original.weights}
            for variable in truncated.weights:
                self.assertAllClose(variable, paths[variable.path])
        # Four layers: the same outputs as the original.
        self.assertAllClose(
            first_layers(original, 4)(data)["sequence_output"],
            original(data)["sequence_output"],
            atol=1e-6,
        )

    def test_first_layers_of_grouped_albert_rejects_split_groups(self):
        # 3 layers would run group 0 twice and group 1 once.
        with self.assertRaisesRegex(
            ValueError,
            r"`num_layers` must be one of \[1, 2, 4\].*"
            r"Received: num_layers=3",
        ):
            first_layers(albert(), 3)

    def test_output_shape_must_match_the_hidden_size(self):
        # A wider or narrower output failed on a variable's shape,
        # naming no argument.
        backbone = bert()
        for bad in (4, (2, 4)):
            with self.assertRaisesRegex(
                ValueError,
                "`output_shape` must match the self-attention.*"
                rf"Received: output_shape={re.escape(repr(bad))}",
            ):
                convert_backbone(
                    backbone, kav.HybridAttention, output_shape=bad
                )
        with self.assertRaisesRegex(
            ValueError, "`output_shape` must be None, an int or a tuple"
        ):
            convert_backbone(backbone, kav.HybridAttention, output_shape="x")
        data = token_inputs()
        expected = backbone(data)["sequence_output"]
        # NumPy ints too: passed on as such, Keras's MultiHeadAttention
        # rejected them in the rebuild ("Invalid output_shape").
        for good in (None, 8, (8,), np.int64(8), [np.int32(8)]):
            converted = convert_backbone(
                backbone,
                keras.layers.MultiHeadAttention,
                output_shape=good,
            )
            self.assertAllClose(
                converted(data)["sequence_output"], expected, atol=1e-6
            )

    def test_adversary_paths_survive_from_config_and_first_layers(self):
        # The rebuilt term was built from its build_config at the top
        # level: its adversary's paths lost the block prefix, and
        # `first_layers` of a converted backbone raised KeyError.
        term = kav.KQAlignment(method="gan")
        converted = convert_backbone(
            bert(), kav.HybridAttention, attention_losses=[term]
        )
        rebuilt = type(converted).from_config(converted.get_config())
        self.assertEqual(
            sorted(v.path for v in rebuilt.weights),
            sorted(v.path for v in converted.weights),
        )
        truncated = first_layers(converted, 1)
        kernel = term.discriminator[0].kernel
        copied = [v for v in truncated.weights if v.path == kernel.path]
        self.assertLen(copied, 1)
        self.assertAllClose(copied[0], kernel)

    def test_numpy_integer_seed(self):
        # Keras's dropout SeedGenerator rejected the NumPy per-layer seeds
        # (Keras's own MultiHeadAttention passes its seed on as given).
        converted = convert_backbone(
            bert(), keras.layers.MultiHeadAttention, seed=np.int64(3)
        )
        seeds = [layer.seed for layer in self_attention_layers(converted)]
        self.assertEqual(seeds, [3, 4])
        self.assertEqual([type(s) for s in seeds], [int, int])

    def test_name_and_dtype_arguments_raise_value_error(self):
        # Both gave a TypeError "multiple values for keyword argument".
        for name, value in (("dtype", "float32"), ("name", "attention")):
            with self.assertRaisesRegex(
                ValueError, f"`{name}` cannot be.*Received: {name}='{value}'"
            ):
                convert_backbone(
                    bert(), keras.layers.MultiHeadAttention, **{name: value}
                )

    def test_single_term_not_in_a_list_raises_value_error(self):
        # `list(term)` raised TypeError: a Layer is not iterable.
        term = kav.KQAlignment(method="mmd")
        with self.assertRaisesRegex(
            ValueError, "`attention_losses` must be a list.*Received"
        ):
            convert_backbone(bert(), kav.HybridAttention, attention_losses=term)
