"""Argument checks of the losses, backbones, analysis and tools, found by a
validation review: bad input raises a `ValueError` naming the argument (not
a NaN later, a silent broadcast, or an AttributeError / TypeError deep in
the code).
"""

import keras
import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants import evaluation
from keras_attnvariants.analysis import interpretability
from keras_attnvariants.callbacks import TemperatureSchedule
from keras_attnvariants.datasets import tokenize
from keras_attnvariants.layers.recording import record_attention
from keras_attnvariants.losses import AttentionGuidanceRegularizer
from keras_attnvariants.losses import KQAlignment
from keras_attnvariants.losses import attention_layers
from keras_attnvariants.losses import batch_mean
from keras_attnvariants.losses import guidance_attention_bias
from keras_attnvariants.losses import key_query_mmd
from keras_attnvariants.losses import kq_projections

RNG = np.random.default_rng(0)
WEIGHTS = RNG.random((2, 2, 3, 3)).astype("float32")
MASK = np.array([[1, 1, 0], [1, 1, 1]], bool)


@pytest.fixture(scope="module")
def bert():
    pytest.importorskip(
        "keras_hub", reason="keras-hub (optional extra) is not installed"
    )
    from keras_attnvariants.backbones import random_bert

    # 2 layers of 4 heads, hidden size 32 (key_dim 8).
    return random_bert(20, 8)


# 1. guidance_attention_bias(strength=...)


@pytest.mark.parametrize("strength", [float("nan"), float("inf"), True, "x"])
def test_guidance_attention_bias_rejects_non_finite_strength(strength):
    with pytest.raises(ValueError, match="`strength` must be a finite float"):
        guidance_attention_bias({0: "next"}, 2, MASK, strength=strength)


# 2. AttentionGuidanceRegularizer(layer_index=...)


@pytest.mark.parametrize("layer_index", [True, 1.7, -1, "a"])
def test_guidance_rejects_bad_layer_index(layer_index):
    reg = AttentionGuidanceRegularizer({0: "next"}, alpha=1.0)
    with pytest.raises(ValueError, match="`layer_index` must be an int >= 0"):
        reg(WEIGHTS, layer_index=layer_index)


def test_guidance_rejects_bad_positional_layer_index():
    reg = AttentionGuidanceRegularizer({0: "next"}, alpha=1.0)
    with pytest.raises(ValueError, match="Received: layer_index=True"):
        reg(WEIGHTS, None, None, True)


# 3. expected_calibration_error with NaN


def test_ece_rejects_nan_probabilities():
    with pytest.raises(ValueError, match="`probabilities` must be finite"):
        evaluation.expected_calibration_error(
            np.array([[np.nan, 0.5], [0.2, 0.8]]), np.array([0, 1])
        )


# 4. / 13. convert_backbone arguments


@pytest.mark.parametrize("trainable", ["yes", 1])
def test_convert_backbone_rejects_non_bool_trainable(bert, trainable):
    from keras_attnvariants.backbones import convert_backbone

    with pytest.raises(ValueError, match="Received: trainable="):
        convert_backbone(bert, kav.HybridAttention, trainable=trainable)


def test_convert_backbone_rejects_non_term_attention_losses(bert):
    from keras_attnvariants.backbones import convert_backbone

    with pytest.raises(ValueError, match="`attention_losses` must be a list"):
        convert_backbone(bert, kav.HybridAttention, attention_losses=["x"])


@pytest.mark.parametrize(
    "name, value, original",
    [("num_heads", 2, 4), ("key_dim", 4, 8), ("value_dim", 4, 8)],
)
def test_convert_backbone_names_a_weight_shape_override(
    bert, name, value, original
):
    from keras_attnvariants.backbones import convert_backbone

    with pytest.raises(
        ValueError,
        match=rf"`{name}` must match .*{name}={original} .*"
        rf"Received: {name}={value}",
    ):
        convert_backbone(bert, kav.HybridAttention, **{name: value})


# 5. random_bert arguments


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"sequence_length": 0}, "sequence_length"),
        ({"vocabulary_size": 2.5}, "vocabulary_size"),
        ({"seed": -1}, "seed"),
    ],
)
def test_random_bert_rejects_bad_arguments(kwargs, name):
    pytest.importorskip("keras_hub")
    from keras_attnvariants.backbones import random_bert

    args = {"vocabulary_size": 20, "sequence_length": 8, **kwargs}
    with pytest.raises(ValueError, match=f"Received: {name}="):
        random_bert(**args)


def test_random_bert_takes_numpy_ints():
    pytest.importorskip("keras_hub")
    from keras_attnvariants.backbones import random_bert

    backbone = random_bert(np.int64(20), np.int64(8), seed=np.int64(1))
    assert backbone.max_sequence_length == 8


# 6. attention_importance


def test_attention_importance_rejects_a_single_array():
    with pytest.raises(ValueError, match="for one layer pass `\\[weights\\]`"):
        interpretability.attention_importance(WEIGHTS)


def test_attention_importance_rejects_none():
    with pytest.raises(ValueError, match="Received: attentions=None"):
        interpretability.attention_importance(None)


@pytest.mark.parametrize("other", [WEIGHTS[:1], WEIGHTS[..., :2]])
def test_attention_importance_rejects_layers_of_other_sizes(other):
    with pytest.raises(ValueError, match="same batch B and keys S"):
        interpretability.attention_importance([WEIGHTS, other])


# 7. kq_projections


def test_kq_projections_rejects_a_non_mha_layer():
    x = np.ones((2, 3, 4), "float32")
    with pytest.raises(ValueError, match="`mha` must be a"):
        kq_projections(keras.layers.Dense(2), x)


@pytest.mark.parametrize(
    "query, match",
    [
        (np.ones((3, 4), "float32"), r"Received: query.shape=\(3, 4\)"),
        (np.ones((2, 3, 4)).tolist(), "Received: query of type list"),
    ],
)
def test_kq_projections_rejects_bad_query(query, match):
    with pytest.raises(ValueError, match=match):
        kq_projections(keras.layers.MultiHeadAttention(2, 2), query)


# 8. batch_mean


def test_batch_mean_takes_lists_and_int_arrays():
    np.testing.assert_allclose(batch_mean([1.0, 2.0]), 1.5)
    np.testing.assert_allclose(batch_mean(np.array([1, 2])), 1.5)


def test_batch_mean_rejects_a_scalar():
    with pytest.raises(ValueError, match=r"Received: values.shape=\(\)"):
        batch_mean(keras.ops.convert_to_tensor(1.0))


# 9. key_query_mmd / attention_layers / record_attention


def _mha_model():
    inputs = keras.Input((3, 4))
    return keras.Model(inputs, kav.HybridAttention(2, 2)(inputs, inputs))


@pytest.mark.parametrize("model", [None, "x"])
def test_attention_layers_rejects_a_non_model(model):
    with pytest.raises(ValueError, match="`model` must be a Keras model"):
        attention_layers(model)


def test_key_query_mmd_rejects_a_none_model():
    with pytest.raises(ValueError, match="Received: model=None"):
        key_query_mmd(None, [np.ones((2, 3, 4), "float32")])


@pytest.mark.parametrize("dataset", [None, 5])
def test_key_query_mmd_rejects_a_non_iterable_dataset(dataset):
    with pytest.raises(ValueError, match=f"Received: dataset={dataset}"):
        key_query_mmd(_mha_model(), dataset)


def test_key_query_mmd_names_a_layer_attending_over_two_axes():
    # Image-like attention over rows and columns: projected queries of
    # rank 5 failed in the backend's transpose.
    inputs = keras.Input((3, 4, 8))
    mha = keras.layers.MultiHeadAttention(
        2, 4, attention_axes=(1, 2), name="mha2d"
    )
    model = keras.Model(inputs, mha(inputs, inputs))
    x = RNG.random((2, 3, 4, 8)).astype("float32")
    with pytest.raises(
        ValueError,
        match=r"attend over one axis.*Received: layer 'mha2d' with "
        r"attention_axes=\(1, 2\) and projected queries of shape "
        r"\(2, 3, 4, 2, 4\)",
    ):
        key_query_mmd(model, [x])


def test_record_attention_rejects_none():
    with pytest.raises(ValueError, match="Received: layers=None"):
        with record_attention(None):
            pass


# 10. backbone helpers given None


def test_backbone_helpers_reject_none():
    pytest.importorskip("keras_hub")
    from keras_attnvariants.backbones import attention_weights
    from keras_attnvariants.backbones import first_layers
    from keras_attnvariants.backbones import hybrid_weights

    for call in (
        lambda: first_layers(None, 1),
        lambda: hybrid_weights(None),
        lambda: attention_weights(None, {}),
    ):
        with pytest.raises(ValueError, match="Received: backbone=None"):
            call()


# 11. tokenize


def test_tokenize_decodes_bytes():
    np.testing.assert_array_equal(
        tokenize([b"1+2", np.bytes_(b"(3 * 4)")]),
        tokenize(["1+2", "(3 * 4)"]),
    )


@pytest.mark.parametrize(
    "expressions, match",
    [
        ([12], r"Received: expressions\[0\]=12"),
        (["1", None], r"Received: expressions\[1\]=None"),
        (None, "Received: expressions=None"),
    ],
)
def test_tokenize_rejects_non_strings(expressions, match):
    with pytest.raises(ValueError, match=match):
        tokenize(expressions)


# 12. pick_strategy(cpu_replicas=...) beyond the devices


@pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="tf.distribute needs the TensorFlow backend",
)
def test_pick_strategy_names_too_many_cpu_replicas():
    import tensorflow as tf

    from keras_attnvariants import distribute

    if tf.config.list_logical_devices("GPU"):
        pytest.skip("GPUs are picked before `cpu_replicas` is read")
    with pytest.raises(ValueError, match="Received: cpu_replicas=1000"):
        distribute.pick_strategy(cpu_replicas=1000)


# 14. KQAlignment key mask (documented as (B, S): not broadcast)


def test_kq_alignment_says_a_one_row_key_mask_is_not_broadcast():
    query = RNG.random((2, 3, 2, 4)).astype("float32")
    key = RNG.random((2, 5, 2, 4)).astype("float32")
    with pytest.raises(
        ValueError, match=r"not broadcast.*Received: key_mask.shape=\(1, 5\)"
    ):
        KQAlignment(method="mmd")(query, key, key_mask=np.ones((1, 5), bool))


def test_kq_alignment_refuses_a_one_row_mask_for_an_unknown_batch():
    # Symbolic (batch unknown): the (1, T) mask was broadcast, where the
    # eager call with a known batch refuses it.
    query = keras.Input((3, 2, 4))
    key = keras.Input((5, 2, 4))
    with pytest.raises(
        ValueError,
        match=r"\(batch, length\) = \(None, 5\).*not broadcast.*"
        r"Received: key_mask.shape=\(1, 5\)",
    ):
        KQAlignment(method="mmd")(query, key, key_mask=np.ones((1, 5), bool))


# 15. TemperatureSchedule.from_config


def test_temperature_schedule_from_config_lists_accepted_keys():
    config = {**TemperatureSchedule().get_config(), "x": 1}
    with pytest.raises(ValueError, match=r"`config` must hold only.*\['x'\]"):
        TemperatureSchedule.from_config(config)
