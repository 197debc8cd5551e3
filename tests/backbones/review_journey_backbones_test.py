"""Backbone findings of a user-journey review (2026-11-26), each a test
that fails without its fix. CI runs this file on JAX too, where the first
one failed.

- On JAX, fitting a converted backbone (or a `first_layers` copy) with a
  compiled train step deleted the original backbone's weights: `assign`
  kept the source's buffers, which the step donated.
- `convert_backbone(..., trainable=False)` was overwritten by the original
  layers' flags, and honoured only after a `.keras` reload.
- `convert_backbone` wrapped an out-of-range `seed` into another valid
  seed instead of raising the layers' `ValueError`.
"""

import keras
import numpy as np
import pytest
from absl.testing import parameterized
from conversion_serialization_test import inputs
from conversion_serialization_test import numpy_outputs
from conversion_serialization_test import tiny_bert

import keras_attnvariants as kav
from keras_attnvariants.backbones.conversion import convert_backbone
from keras_attnvariants.backbones.conversion import self_attention_layers
from keras_attnvariants.backbones.pretrained import first_layers
from keras_attnvariants.testing.test_case import TestCase

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)


def _classifier(backbone):
    features = {
        name: keras.Input((None,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    hidden = backbone(features)["sequence_output"]
    logits = keras.layers.Dense(2)(keras.ops.mean(hidden, axis=1))
    model = keras.Model(features, logits)
    model.compile(
        "adam",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=keras.backend.backend() != "torch",
    )
    return model


class IndependentCopyTest(TestCase):
    @parameterized.named_parameters(
        ("converted", "convert"), ("first_layers", "first_layers")
    )
    def test_fitting_the_copy_leaves_the_original_intact(self, how):
        keras.utils.set_random_seed(0)
        original = tiny_bert()
        before = numpy_outputs(original(inputs()))

        def converted_outputs():
            converted = convert_backbone(
                original, kav.HybridAttention, hybrid_init=0.0
            )
            return numpy_outputs(converted(inputs()))

        converted_before = converted_outputs()
        if how == "convert":
            copy = convert_backbone(
                original, kav.HybridAttention, hybrid_init=0.0
            )
        else:
            copy = first_layers(original, 1)
        _classifier(copy).fit(inputs(), np.array([0, 1]), epochs=2, verbose=0)
        after = numpy_outputs(original(inputs()))
        # And it converts again, to what it converted to before.
        converted_after = converted_outputs()
        for name in before:
            self.assertAllClose(after[name], before[name], atol=0, rtol=0)
            self.assertAllClose(
                converted_after[name], converted_before[name], atol=0, rtol=0
            )


class ConversionArgumentsTest(TestCase):
    def test_trainable_false_holds_at_conversion_and_after_reload(self):
        converted = convert_backbone(
            tiny_bert(), kav.HybridAttention, trainable=False
        )
        layers = self_attention_layers(converted)
        self.assertEqual([layer.trainable for layer in layers], [False] * 2)
        self.assertTrue(
            all(not v.trainable for layer in layers for v in layer.weights)
        )
        path = self.get_temp_dir() + "/frozen.keras"
        converted.save(path)
        reloaded = keras.saving.load_model(path)
        self.assertEqual(
            [layer.trainable for layer in self_attention_layers(reloaded)],
            [False] * 2,
        )

    @parameterized.parameters(-1, 2**31, 2**40)
    def test_out_of_range_seed_raises(self, seed):
        with self.assertRaisesRegex(ValueError, f"seed={seed}"):
            convert_backbone(tiny_bert(), kav.HybridAttention, seed=seed)

    def test_largest_seed_is_accepted_and_layers_get_their_own(self):
        converted = convert_backbone(
            tiny_bert(), kav.HybridAttention, seed=2**31 - 1
        )
        seeds = [layer.seed for layer in self_attention_layers(converted)]
        self.assertEqual(seeds, [2**31 - 1, 0])
