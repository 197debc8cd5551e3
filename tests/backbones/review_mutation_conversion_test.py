"""Conversion behaviour a mutation review of `backbones/conversion.py`
found unpinned (2026-12-02): each test fails on a mutation the suite let
through (weight-presence overrides, non-attention self-attention layers,
subclasses of keras-hub's cached attention, safe class resolution on a
direct `from_config`, LoRA alpha, terms on a Keras attention)."""

import sys

import keras
import numpy as np
import pytest
from conversion_serialization_test import inputs
from conversion_serialization_test import numpy_outputs
from conversion_serialization_test import tiny_bert
from conversion_test import gpt2
from review_safety_reconvert_test import USER_MODULE
from review_safety_reconvert_test import user_module  # noqa: F401

import keras_attnvariants as kav

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)
from keras_attnvariants.backbones import convert_backbone  # noqa: E402
from keras_attnvariants.backbones import self_attention_layers  # noqa: E402


def _sequence(backbone, data=None):
    data = inputs() if data is None else data
    outputs = numpy_outputs(backbone(data))
    if isinstance(outputs, dict):
        outputs = outputs["sequence_output"]
    return outputs


def _gpt2_inputs():
    data = inputs()
    return {k: data[k] for k in ("token_ids", "padding_mask")}


# conversion_test.py / review_validation_api_test.py: weight-shape checks.


@pytest.mark.parametrize(
    "name, value, original",
    [("use_bias", False, True), ("use_gate", True, False)],
)
def test_weight_presence_override_names_the_argument(name, value, original):
    # Without `use_bias` the copy failed naming no argument; without
    # `use_gate` an untrained gate was added silently.
    with pytest.raises(
        ValueError,
        match=rf"`{name}` must match the self-attention .*"
        rf"{name}={original} .*Received: {name}={value}",
    ):
        convert_backbone(tiny_bert(), kav.HybridAttention, **{name: value})


def test_a_self_attention_that_is_no_attention_layer_is_named():
    backbone = tiny_bert()
    block = backbone.transformer_layers[0]
    object.__setattr__(block, "_self_attention_layer", keras.layers.Identity())
    with pytest.raises(
        ValueError,
        match="has a Identity self-attention.*"
        "Received: backbone of class BertBackbone",
    ):
        self_attention_layers(backbone)


# conversion_test.py: decoders.


def test_decoder_takes_a_subclass_of_keras_hubs_cached_attention():
    class MyCachedAttention(keras_hub.layers.CachedMultiHeadAttention):
        pass

    original = gpt2()
    converted = convert_backbone(original, MyCachedAttention)
    layers = self_attention_layers(converted)
    assert all(type(x) is MyCachedAttention for x in layers)
    np.testing.assert_allclose(
        _sequence(converted, _gpt2_inputs()),
        _sequence(original, _gpt2_inputs()),
        atol=0,
    )


def test_decoder_refuses_an_attention_that_overrides_call():
    class CallingAttention(keras.layers.MultiHeadAttention):
        def call(self, *args, **kwargs):
            return super().call(*args, **kwargs)

    with pytest.raises(
        ValueError, match="overrides `call`.*Override `_compute_attention`"
    ):
        convert_backbone(gpt2(), CallingAttention)


# review_safety_reconvert_test.py: class resolution.


def test_direct_from_config_imports_no_module_not_yet_imported(user_module):  # noqa: F811
    import kav_review_user_attention

    converted = convert_backbone(
        tiny_bert(), kav_review_user_attention.UserAttention
    )
    config = converted.get_config()
    del sys.modules[USER_MODULE]
    # Outside any deserialization scope: importing a module this process
    # has not imported would run its import-time code.
    with pytest.raises(ValueError, match="Refusing to import"):
        type(converted).from_config(config)
    assert USER_MODULE not in sys.modules


# review_lora_quantize_test.py: LoRA.


def test_lora_alpha_carries_over():
    backbone = tiny_bert()
    for layer in self_attention_layers(backbone):
        layer._query_dense.enable_lora(2, lora_alpha=8.0)
        layer._query_dense.lora_kernel_b.assign(
            keras.random.normal(layer._query_dense.lora_kernel_b.shape, seed=1)
        )
    converted = convert_backbone(backbone, kav.HybridAttention, hybrid_init=0.0)
    for layer in self_attention_layers(converted):
        assert layer._query_dense.lora_alpha == 8.0
    valid = inputs()["padding_mask"].astype(bool)
    np.testing.assert_allclose(
        _sequence(converted)[valid], _sequence(backbone)[valid], atol=1e-5
    )


def test_terms_on_a_keras_attention_name_the_requirement():
    # keras MHA's own "Unrecognized keyword arguments" error matched the
    # looser "attention_losses" of test_invalid_arguments.
    with pytest.raises(
        ValueError,
        match="`attention_losses` needs an attention class of "
        "keras_attnvariants.*Received: attention_class=MultiHeadAttention",
    ):
        convert_backbone(
            tiny_bert(),
            keras.layers.MultiHeadAttention,
            attention_losses=[kav.KQAlignment(method="mmd")],
        )
