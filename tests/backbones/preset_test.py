"""keras-hub presets of converted backbones: `save_to_preset`, then
`ConvertedBackbone.from_preset`.

keras-hub's own `Backbone.from_preset` finds a preset's class by its
registered name, which every converted class shares, and in a fresh
process it refused the preset ("Call `from_preset` directly on
`ConvertedBackbone`"), a call that did not exist.
"""

import os
import textwrap

import keras
import numpy as np
import pytest
from conversion_serialization_test import converted_bert
from conversion_serialization_test import inputs
from conversion_serialization_test import tiny_bert

import keras_attnvariants as kav
from keras_attnvariants.backbones import ConvertedBackbone
from keras_attnvariants.backbones import convert_backbone
from keras_attnvariants.backbones import self_attention_layers
from keras_attnvariants.testing.subprocesses import run_json_script

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)


def _sequence(backbone):
    output = backbone(inputs(), training=False)["sequence_output"]
    return keras.ops.convert_to_numpy(output)


def _weights_by_path(model):
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def test_preset_round_trip_keeps_attention_terms_and_weights(tmp_path):
    term = kav.KQAlignment(method="gan", weight=0.5)
    backbone = convert_backbone(
        tiny_bert(), kav.HybridAttention, attention_losses=[term], seed=3
    )
    for i, layer in enumerate(self_attention_layers(backbone)):
        layer.hybrid_weight.assign([0.3 + 0.2 * i, 0.9])
    expected = _sequence(backbone)  # also builds the term's adversary
    preset = os.path.join(tmp_path, "preset")
    backbone.save_to_preset(preset)

    loaded = ConvertedBackbone.from_preset(preset)

    assert type(loaded) is type(backbone)
    layers = self_attention_layers(loaded)
    assert all(type(layer) is kav.HybridAttention for layer in layers)
    terms = [layer.attention_losses for layer in layers]
    assert terms[0][0] is terms[1][0]  # still one shared term
    assert isinstance(terms[0][0], kav.KQAlignment)
    assert terms[0][0].method == "gan"
    np.testing.assert_allclose(_sequence(loaded), expected, atol=1e-6)
    saved, reloaded = _weights_by_path(backbone), _weights_by_path(loaded)
    assert saved.keys() == reloaded.keys()
    for path, value in saved.items():
        np.testing.assert_array_equal(reloaded[path], value, err_msg=path)


def test_from_preset_on_a_converted_class(tmp_path):
    backbone = converted_bert()
    preset = os.path.join(tmp_path, "preset")
    backbone.save_to_preset(preset)

    loaded = type(backbone).from_preset(preset)
    np.testing.assert_allclose(
        _sequence(loaded), _sequence(backbone), atol=1e-6
    )
    without_weights = ConvertedBackbone.from_preset(preset, load_weights=False)
    assert type(without_weights) is type(backbone)


def test_from_preset_of_another_class_names_both(tmp_path):
    distil = keras_hub.models.DistilBertBackbone(
        vocabulary_size=50,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=8,
    )
    preset = os.path.join(tmp_path, "distil")
    convert_backbone(distil, kav.HybridAttention).save_to_preset(preset)
    bert_class = type(converted_bert())
    with pytest.raises(ValueError, match="DistilBertBackbone.*BertBackbone"):
        bert_class.from_preset(preset)


def test_plain_preset_is_refused_with_keras_hub_message(tmp_path):
    preset = os.path.join(tmp_path, "plain")
    tiny_bert().save_to_preset(preset)
    with pytest.raises(ValueError, match="not a subclass"):
        ConvertedBackbone.from_preset(preset)


def test_preset_loads_in_a_fresh_process(tmp_path):
    """The preset is read where no converted class was ever made: the
    registry then holds only the mixin, which keras-hub's own
    `BertBackbone.from_preset` refuses."""
    backbone = converted_bert()
    preset = os.path.join(tmp_path, "preset")
    backbone.save_to_preset(preset)
    script = textwrap.dedent(
        f"""
        import json
        import keras
        import keras_hub
        from keras_attnvariants.backbones import ConvertedBackbone
        from keras_attnvariants.backbones import self_attention_layers
        try:
            keras_hub.models.BertBackbone.from_preset({preset!r})
            refused = False
        except ValueError:
            refused = True
        loaded = ConvertedBackbone.from_preset({preset!r})
        print(json.dumps({{
            "refused": refused,
            "bases": [c.__name__ for c in type(loaded).__mro__[:3]],
            "attention": [
                type(layer).__name__
                for layer in self_attention_layers(loaded)
            ],
            "hybrid": [
                keras.ops.convert_to_numpy(layer.hybrid_weight).tolist()
                for layer in self_attention_layers(loaded)
            ],
        }}))
        """
    )
    result = run_json_script(script, KERAS_BACKEND=keras.backend.backend())
    assert result["refused"], "keras-hub now loads it: simplify the docs"
    assert result["bases"] == ["BertBackbone", "ConvertedBackbone"] + [
        "BertBackbone"
    ]
    assert result["attention"] == ["HybridAttention"] * 2
    expected = [
        keras.ops.convert_to_numpy(layer.hybrid_weight).tolist()
        for layer in self_attention_layers(backbone)
    ]
    np.testing.assert_allclose(result["hybrid"], expected)
