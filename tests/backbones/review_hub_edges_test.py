"""Converted-backbone findings of a keras-hub user review (2026-11-26),
each a test that fails without its fix (CI runs `tests/backbones` on all
three backends).

- `convert_backbone(..., trainable=False)` lost its effect on TensorFlow
  after `from_config` or a `.keras` reload: the attention layers said
  `trainable == False` but their variables trained.
- Freezing one block after conversion froze the loss term shared by every
  block (Keras's recursive `trainable` setter reached it).
- `keras.models.clone_model` of a converted backbone raised a `TypeError`
  about `attention_config`.
- Re-converting an HNAS backbone with `hybrid_init=0.0` kept its old `u`.
"""

import os

import keras
import numpy as np
import pytest
from conversion_serialization_test import inputs
from conversion_serialization_test import numpy_outputs
from conversion_serialization_test import tiny_bert

import keras_attnvariants as kav
from keras_attnvariants.backbones.conversion import convert_backbone
from keras_attnvariants.backbones.conversion import self_attention_layers

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)


def _attention_variables_trainable(backbone, index=None):
    """Trainable flags of the attention layers' own variables (not those
    of attached terms), of every layer or of layer `index`."""
    layers = self_attention_layers(backbone)
    if index is not None:
        layers = layers[index : index + 1]
    flags = []
    for layer in layers:
        terms = (
            {id(v) for term in layer.attention_losses for v in term.weights}
            if hasattr(layer, "attention_losses")
            else set()
        )
        flags += [v.trainable for v in layer.weights if id(v) not in terms]
    return flags


def test_frozen_conversion_stays_frozen_after_rebuild_and_reload(tmp_path):
    converted = convert_backbone(
        tiny_bert(), kav.HybridAttention, hybrid_init=0.0, trainable=False
    )
    count = len(converted.trainable_weights)
    path = os.path.join(tmp_path, "frozen.keras")
    converted.save(path)
    for rebuilt in (
        type(converted).from_config(converted.get_config()),
        keras.saving.load_model(path),
    ):
        assert len(rebuilt.trainable_weights) == count
        flags = _attention_variables_trainable(rebuilt)
        assert flags and not any(flags)


def _converted_with_shared_term():
    """`(term, backbone)`: a GAN `KQAlignment` shared by every block."""
    term = kav.KQAlignment("gan", weight=0.1)
    converted = convert_backbone(
        tiny_bert(),
        kav.HybridAttention,
        hybrid_init=0.0,
        attention_losses=[term],
    )
    return term, converted


def test_freezing_a_block_after_conversion_keeps_the_shared_term():
    term, converted = _converted_with_shared_term()
    count = len(term.trainable_weights)
    assert count > 0
    converted.get_layer("transformer_layer_0").trainable = False
    assert term.trainable and len(term.trainable_weights) == count
    frozen = _attention_variables_trainable(converted, 0)
    thawed = _attention_variables_trainable(converted, 1)
    assert frozen and not any(frozen)
    assert thawed and all(thawed)
    # The term is frozen where the caller says so.
    term.trainable = False
    assert not term.trainable_weights


def test_clone_model_names_the_way_to_clone():
    converted = convert_backbone(
        tiny_bert(), kav.HybridAttention, hybrid_init=0.3
    )
    with pytest.raises(ValueError, match="from_config"):
        keras.models.clone_model(converted)
    # The way the message gives.
    clone = type(converted).from_config(converted.get_config())
    clone.set_weights(converted.get_weights())
    assert all(
        isinstance(layer, kav.HybridAttention)
        for layer in self_attention_layers(clone)
    )
    np.testing.assert_allclose(
        numpy_outputs(clone(inputs()))["sequence_output"],
        numpy_outputs(converted(inputs()))["sequence_output"],
        atol=1e-6,
    )


def test_reconverting_hnas_with_hybrid_init_resets_u():
    original = tiny_bert()
    expected = numpy_outputs(original(inputs()))["sequence_output"]
    hnas = convert_backbone(original, kav.HybridAttention, hybrid_init=0.3)
    again = convert_backbone(hnas, kav.HybridAttention, hybrid_init=0.0)
    for layer in self_attention_layers(again):
        np.testing.assert_array_equal(layer.hybrid_weights, 0.0)
    # u = 0 is softmax attention: the original backbone again.
    # (On real tokens: converted layers keep padded queries out.)
    valid = inputs()["padding_mask"].astype(bool)
    np.testing.assert_allclose(
        numpy_outputs(again(inputs()))["sequence_output"][valid],
        expected[valid],
        atol=1e-5,
    )
    # Without `hybrid_init` the converted `u` is kept.
    kept = convert_backbone(hnas, kav.HybridAttention)
    for layer in self_attention_layers(kept):
        np.testing.assert_allclose(layer.hybrid_weights, 0.3, rtol=1e-6)


def test_converting_to_the_abstract_base_class_raises():
    with pytest.raises(ValueError, match="concrete attention"):
        convert_backbone(tiny_bert(), kav.VariantAttention)


@pytest.mark.parametrize("value", [0, 1, 1.5, "64", 513])
def test_load_minilm_checks_sequence_length(value):
    from keras_attnvariants.backbones.pretrained import load_minilm
    from keras_attnvariants.backbones.pretrained import minilm_path

    if value == 513 and minilm_path() is None:
        pytest.skip("the MiniLM package is not installed")
    with pytest.raises(ValueError, match="sequence_length"):
        load_minilm(value)


def test_freezing_the_whole_backbone_freezes_its_terms():
    """Keeping a shared term trainable when one block is frozen must not
    leave it training inside a frozen backbone (`backbone.trainable =
    False`, keras-hub's way to train only a task's head)."""
    term, converted = _converted_with_shared_term()
    features = {
        name: keras.Input((None,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    hidden = converted(features)["sequence_output"]
    model = keras.Model(features, keras.layers.Dense(2)(hidden))
    converted.trainable = False
    term_ids = {id(v) for v in term.weights}
    assert not term.trainable_weights
    assert not term_ids & {id(v) for v in model.trainable_variables}
    assert len(model.trainable_variables) == 2  # the head
    converted.trainable = True
    assert len(term.trainable_weights) == len(term.weights)
