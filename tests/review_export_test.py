"""SavedModels of every layer serve any batch size and sequence length.

The golden artifacts (`saved_models_test.py`) fix both at export time; a
serving model gets whatever the traffic brings, with padding.
"""

import keras
import numpy as np
import pytest

import keras_attnvariants as kav

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "tensorflow", reason="SavedModel needs TF"
)

VOCAB, DIM, MAX_LENGTH = 11, 8, 12


def _attention_model(make):
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, DIM, mask_zero=True)(tokens)
    return keras.Model(tokens, make()(x, x))


def _encoder_model():
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    encoder = kav.TwoStreamEncoder(
        vocab_size=VOCAB,
        max_length=MAX_LENGTH,
        num_layers=2,
        d_model=DIM,
        num_heads=2,
        d_ff=16,
        seed=3,
    )
    return keras.Model(tokens, encoder(tokens))


def _converted_bert(attention_class, **kwargs):
    from keras_attnvariants.backbones import convert_backbone
    from keras_attnvariants.backbones.pretrained import random_bert

    backbone = random_bert(VOCAB, MAX_LENGTH, seed=1)
    converted = convert_backbone(backbone, attention_class, **kwargs)
    inputs = {
        name: keras.Input((None,), dtype="int32", name=name)
        for name in ("token_ids", "padding_mask", "segment_ids")
    }
    return keras.Model(inputs, converted(inputs)["sequence_output"])


MODELS = {
    "doubly_normalized_attention": lambda: _attention_model(
        lambda: kav.DoublyNormalizedAttention(2, 4, iterations=2)
    ),
    "hybrid_attention": lambda: _attention_model(
        lambda: kav.HybridAttention(2, 4, hybrid_init=0.3)
    ),
    "gumbel_discrete_attention": lambda: _attention_model(
        lambda: kav.GumbelDiscreteAttention(2, 4, seed=3)
    ),
    "two_stream_encoder": _encoder_model,
    "converted_bert_hnas": lambda: _converted_bert(
        kav.HybridAttention, hybrid_init=0.3
    ),
    "converted_bert_gumbel": lambda: _converted_bert(
        kav.GumbelDiscreteAttention, seed=0
    ),
}


def _feed(name, tokens):
    import tensorflow as tf

    if not name.startswith("converted_bert"):
        return tf.constant(tokens)
    return {
        "token_ids": tf.constant(tokens),
        "padding_mask": tf.constant((tokens != 0).astype("int32")),
        "segment_ids": tf.constant(np.zeros_like(tokens)),
    }


@pytest.mark.parametrize("name", sorted(MODELS))
def test_export_serves_dynamic_shapes_with_padding(name, tmp_path):
    import tensorflow as tf

    if name.startswith("converted_bert"):
        pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(1)
    model = MODELS[name]()
    path = str(tmp_path / name)
    model.export(path, verbose=False)
    served = tf.saved_model.load(path)
    rng = np.random.default_rng(0)
    for batch, length in [(2, 5), (3, 9), (1, MAX_LENGTH)]:
        tokens = rng.integers(1, VOCAB, size=(batch, length)).astype("int32")
        tokens[0, length // 2 :] = 0
        feed = _feed(name, tokens)
        got = served.serve(feed).numpy()
        assert got.shape[:2] == (batch, length)
        want = keras.ops.convert_to_numpy(model(feed, training=False))
        np.testing.assert_allclose(got, want, atol=1e-6)
        # Inference is deterministic, Gumbel included (argmax).
        np.testing.assert_array_equal(served.serve(feed).numpy(), got)
    # Appending padding changes nothing on the real tokens.
    tokens = np.array([[3, 4, 5, 6, 0], [1, 2, 3, 4, 5]], "int32")
    longer = np.pad(tokens, ((0, 0), (0, 4)))
    short = served.serve(_feed(name, tokens)).numpy()
    padded = served.serve(_feed(name, longer)).numpy()[:, :5]
    real = tokens != 0
    np.testing.assert_allclose(padded[real], short[real], atol=1e-5)


@pytest.mark.parametrize(
    "name",
    [
        "doubly_normalized_attention",
        "hybrid_attention",
        "gumbel_discrete_attention",
        "two_stream_encoder",
    ],
)
def test_int8_quantized_model_exports_and_serves(name, tmp_path):
    # The way to ship a quantized model: Keras 3.15 does not reload one
    # holding MHA-type layers from `.keras` (Keras MHA included,
    # `tests/layers/mha_contract_test.py`), but its SavedModel serves.
    import tensorflow as tf

    keras.utils.set_random_seed(1)
    model = MODELS[name]()
    tokens = np.random.default_rng(0).integers(1, VOCAB, (3, 7))
    tokens = tokens.astype("int32")
    tokens[0, 4:] = 0
    before = keras.ops.convert_to_numpy(model(tokens, training=False))
    model.quantize("int8")
    want = keras.ops.convert_to_numpy(model(tokens, training=False))
    assert not np.array_equal(want, before)  # it did quantize
    path = str(tmp_path / name)
    model.export(path, verbose=False)
    served = tf.saved_model.load(path)
    np.testing.assert_allclose(
        served.serve(tf.constant(tokens)).numpy(), want, atol=1e-6
    )
