"""keras-hub's LoRA and Keras's quantization with this package's layers
(review of 2026-11-26).

- `convert_backbone` of a backbone with LoRA enabled raised "Could not
  carry the weights over by name" (MHA's config does not hold the
  projections' LoRA): the adapters now carry over.
- `model.quantize()` raised "Cannot quantize a layer that isn't yet built"
  for a model holding a user-written weightless `AttentionLoss` that had
  not trained yet.
"""

import os

import keras
import numpy as np
import pytest
from conversion_serialization_test import tiny_bert

import keras_attnvariants as kav
from keras_attnvariants.testing import layer_zoo

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)
from keras_attnvariants.backbones import convert_backbone  # noqa: E402
from keras_attnvariants.backbones import self_attention_layers  # noqa: E402


def _bert(seed=0):
    keras.utils.set_random_seed(seed)
    return tiny_bert()


def _inputs():
    rng = np.random.default_rng(0)
    valid = np.arange(8)[None] < np.array([8, 6, 5, 3])[:, None]
    ids = np.where(valid, rng.integers(1, 50, (4, 8)), 0).astype("int32")
    return {
        "token_ids": ids,
        "segment_ids": np.zeros((4, 8), "int32"),
        "padding_mask": valid.astype("int32"),
    }


def _sequence(backbone):
    output = backbone(_inputs(), training=False)["sequence_output"]
    return keras.ops.convert_to_numpy(output)


def _lora_bert(seed=0):
    backbone = _bert(seed)
    backbone.enable_lora(rank=4)
    for i, layer in enumerate(self_attention_layers(backbone)):
        # Non-zero adapters (B starts at 0), so losing them shows.
        for sub in (layer._query_dense, layer._value_dense):
            sub.lora_kernel_b.assign(
                keras.random.normal(sub.lora_kernel_b.shape, seed=i)
            )
    return backbone


def _trainable(model):
    return sorted(v.path for v in model.trainable_weights)


def test_lora_carries_over_through_conversion(tmp_path):
    original = _lora_bert()
    converted = convert_backbone(original, kav.HybridAttention, hybrid_init=0)
    for layer in self_attention_layers(converted):
        assert layer._query_dense.lora_enabled
        assert layer._value_dense.lora_enabled
        assert not layer._key_dense.lora_enabled
    # Real tokens (converted encoders also keep padded queries out).
    valid = _inputs()["padding_mask"].astype(bool)
    np.testing.assert_allclose(
        _sequence(converted)[valid], _sequence(original)[valid], atol=1e-5
    )
    # The adapters train, the kernels under them stay frozen, as before.
    assert _trainable(converted) == _trainable(original)
    assert any("lora_kernel_a" in path for path in _trainable(converted))
    # keras-hub's LoRA files still work: into another conversion.
    path = os.path.join(tmp_path, "adapters.lora.h5")
    converted.save_lora_weights(path)
    other = convert_backbone(_lora_bert(), kav.HybridAttention, hybrid_init=0)
    for layer in self_attention_layers(other):
        layer._query_dense.lora_kernel_b.assign(
            np.zeros(layer._query_dense.lora_kernel_b.shape)
        )
    other.load_lora_weights(path)
    np.testing.assert_allclose(
        _sequence(other), _sequence(converted), atol=1e-6
    )


def test_lora_on_feedforward_layers_carries_over():
    # keras-hub's `enable_lora(target_layer_names=...)` reaches any layer;
    # only the attention projections were carried.
    original = _bert()
    original.enable_lora(
        rank=2, target_layer_names=["query", "feedforward_intermediate_dense"]
    )
    converted = convert_backbone(original, kav.HybridAttention, hybrid_init=0)
    lora = sorted(
        layer.path
        for layer in converted._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
    )
    assert lora == sorted(
        layer.path
        for layer in original._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
    )
    assert any("feedforward" in path for path in lora)
    assert _trainable(converted) == _trainable(original)


def test_lora_after_conversion_trains_only_the_adapters():
    term = kav.KQAlignment("gan", 0.1)
    converted = convert_backbone(
        _bert(), kav.DoublyNormalizedAttention, attention_losses=[term]
    )
    before = _sequence(converted)
    converted.enable_lora(rank=4)
    np.testing.assert_allclose(_sequence(converted), before, atol=1e-6)
    kernels = {
        v.path
        for layer in self_attention_layers(converted)
        for sub in (layer._query_dense, layer._key_dense, layer._value_dense)
        for v in [sub._kernel]
    }
    trainable = set(_trainable(converted))
    assert not kernels & trainable
    assert {p for p in trainable if "lora_kernel" in p}


def test_quantize_before_training_with_a_custom_term():
    # DNAS with a weightless user-written term, never trained.
    model = layer_zoo.build_model("dnas_with_attention_loss")
    x, _ = layer_zoo.training_data(8)
    expected = keras.ops.convert_to_numpy(model.predict(x, verbose=0))
    model.quantize("int8")
    got = keras.ops.convert_to_numpy(model.predict(x, verbose=0))
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() < 0.05 * scale
    assert not np.array_equal(got, expected)  # it did quantize
