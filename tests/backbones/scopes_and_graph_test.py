"""Conversion and truncation of backbones built, converted or rebuilt in a
Keras name scope.

Weights are matched by path, and a name scope starts every path: a backbone
built in `keras.name_scope("outer")` (or in a layer's `build`, which Keras
runs in the layer's scope) failed to convert ("Could not carry the weights
over by name"), `first_layers` raised a bare KeyError, and a converted
backbone rebuilt in a scope gave its attention layers `outer/outer/...`
paths.

And a model built on a converted backbone's own graph, whose blocks'
keras-hub configs do not record the conversion, refuses a config.
"""

import keras
import numpy as np
import pytest
from conversion_serialization_test import inputs as _inputs
from conversion_serialization_test import tiny_bert as _bert

import keras_attnvariants as kav
from keras_attnvariants.backbones import convert_backbone
from keras_attnvariants.backbones import first_layers
from keras_attnvariants.backbones.conversion import self_attention_layers

pytest.importorskip("keras_hub")


def _sequence(backbone):
    out = backbone(_inputs(), training=False)["sequence_output"]
    return keras.ops.convert_to_numpy(out)


def _real(values):
    return values[_inputs()["padding_mask"].astype(bool)]


def _below(model, prefix):
    return sorted(v.path[len(prefix) :] for v in model.weights)


def test_backbone_built_in_a_scope_converts_and_truncates():
    with keras.name_scope("outer"):
        original = _bert()
        original.enable_lora(rank=2)
    original.get_layer("transformer_layer_1").trainable = False
    converted = convert_backbone(original, kav.HybridAttention, hybrid_init=0)
    np.testing.assert_allclose(
        _real(_sequence(converted)), _real(_sequence(original)), atol=1e-5
    )
    # The LoRA adapters and the frozen block came along.
    for layer in self_attention_layers(converted):
        assert layer._query_dense.lora_enabled
    assert not converted.get_layer("transformer_layer_1").trainable
    trainable = sorted(
        v.path[len("outer/") :] for v in original.trainable_weights
    )
    new = sorted(
        v.path
        for v in converted.trainable_weights
        if not v.path.endswith("hybrid_weight")
    )
    assert new == trainable
    truncated = first_layers(original, 1)
    assert truncated.num_layers == 1
    source = {v.path[len("outer/") :]: v for v in original.weights}
    for variable in truncated.weights:
        np.testing.assert_array_equal(
            np.asarray(variable), np.asarray(source[variable.path])
        )


def test_conversion_inside_a_layers_build():
    original = _bert()

    class Wrapper(keras.layers.Layer):
        def build(self, input_shape):
            # Keras runs `build` in the layer's name scope.
            self.backbone = convert_backbone(
                original, kav.HybridAttention, hybrid_init=0.0
            )

        def call(self, inputs):
            return self.backbone(inputs)["sequence_output"]

    wrapper = Wrapper(name="wrap")
    out = keras.ops.convert_to_numpy(wrapper(_inputs()))
    np.testing.assert_allclose(
        _real(out), _real(_sequence(original)), atol=1e-5
    )
    paths = [v.path for v in wrapper.backbone.weights]
    assert all(path.startswith("wrap/") for path in paths), paths
    assert _below(wrapper.backbone, "wrap/") == sorted(
        [v.path for v in original.weights]
        + [
            f"transformer_layer_{i}/self_attention_layer/hybrid_weight"
            for i in range(2)
        ]
    )
    with keras.name_scope("outer"):
        truncated = first_layers(original, 1)
    assert truncated.num_layers == 1


def test_rebuilt_in_a_scope_keeps_one_prefix():
    term = kav.KQAlignment(method="gan")
    converted = convert_backbone(
        _bert(), kav.HybridAttention, hybrid_init=0.0, attention_losses=[term]
    )
    with keras.name_scope("outer"):
        rebuilt = type(converted).from_config(converted.get_config())
    paths = [v.path for v in rebuilt.weights]
    assert not any(path.startswith("outer/outer") for path in paths), paths
    assert _below(rebuilt, "outer/") == sorted(
        v.path for v in converted.weights
    )


@pytest.mark.parametrize(
    "attention", [kav.DoublyNormalizedAttention, kav.HybridAttention]
)
def test_a_model_on_the_backbones_own_graph_refuses_a_config(
    attention, tmp_path
):
    # keras-hub's block config does not record the converted attention: a
    # model built on `backbone.input` / `backbone.output` came back from a
    # `.keras` file with stock MHA (DNAS silently, outputs 4.6e-3 off) or
    # failed to load (HNAS's extra variable).
    converted = convert_backbone(_bert(), attention)
    inner = keras.Model(converted.input, converted.output["sequence_output"])
    # It still trains and predicts.
    inner.compile("sgd", "mse")
    inner.fit(_inputs(), np.zeros((2, 6, 8)), verbose=0)
    message = "holds a converted .*backbone called as a layer"
    with pytest.raises(ValueError, match=message):
        inner.save(str(tmp_path / "inner.keras"))
    with pytest.raises(ValueError, match=message):
        inner.get_config()
    # On the backbone called as a layer, the round trip keeps the variant.
    inputs = {
        name: keras.Input((None,), dtype="int32", name=name)
        for name in _inputs()
    }
    outer = keras.Model(inputs, converted(inputs)["sequence_output"])
    outer.save(str(tmp_path / "outer.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "outer.keras"))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(_inputs())),
        keras.ops.convert_to_numpy(outer(_inputs())),
    )
    assert any(
        isinstance(layer, attention) for layer in loaded._flatten_layers()
    )


def test_every_weight_kind_is_carried_over():
    # A fresh keras-hub backbone has zero biases and unit LayerNorm scales,
    # which a fresh conversion has too: a copy that skipped them passed the
    # tests of untrained backbones (only the pretrained-checkpoint test,
    # skipped without it, saw it).
    original = _bert()
    rng = np.random.default_rng(0)
    for variable in original.weights:
        variable.assign(rng.normal(size=variable.shape).astype("float32") * 0.2)
    converted = convert_backbone(original, kav.HybridAttention, hybrid_init=0)
    source = {v.path: np.asarray(v) for v in original.weights}
    kinds = set()
    for variable in converted.weights:
        if variable.path.endswith("hybrid_weight"):
            continue
        np.testing.assert_array_equal(
            np.asarray(variable), source[variable.path]
        )
        kinds.add(variable.path.rsplit("/", 1)[-1])
    assert {"kernel", "bias", "gamma", "beta", "embeddings"} <= kinds, kinds
    np.testing.assert_allclose(
        _real(_sequence(converted)), _real(_sequence(original)), atol=1e-5
    )
