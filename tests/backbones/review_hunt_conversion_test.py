import keras
import numpy as np
import pytest

import keras_attnvariants as kav
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


class ConversionReviewTest(TestCase):
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
