"""Serving edge cases found by a review acting as a user (2026-11-26).

- An empty batch or sequence, which keras MHA serves in eager mode: the
  layers' row maxima raised "Cannot compute the max of an empty tensor"
  (TensorFlow), and the argmax path failed on JAX and PyTorch.
- `model.export` on JAX of a DNAS / HNAS model with a Keras mask failed:
  the custom gradients closed over the mask, which JAX's shape-polymorphic
  export cannot take as a constant of symbolic shape.
- A `TwoStreamEncoder` exported with a dynamic length lost its
  `max_length` check.
"""

import keras
import numpy as np
import pytest

import keras_attnvariants as kav

LAYERS = {
    "dnas": lambda: kav.DoublyNormalizedAttention(2, 4),
    "dnas_2_iterations": lambda: kav.DoublyNormalizedAttention(
        2, 4, iterations=2
    ),
    "hnas": lambda: kav.HybridAttention(2, 4, hybrid_init=0.3),
    "gumbel_argmax": lambda: kav.GumbelDiscreteAttention(2, 4, seed=0),
    "gumbel_soft": lambda: kav.GumbelDiscreteAttention(
        2, 4, seed=0, inference_mode="soft"
    ),
    "gumbel_sample": lambda: kav.GumbelDiscreteAttention(
        2, 4, seed=0, inference_mode="sample"
    ),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("shape", [(0, 5, 8), (2, 0, 8)])
def test_empty_batch_or_sequence_is_served_like_mha(name, shape):
    x = np.zeros(shape, "float32")
    expected = keras.layers.MultiHeadAttention(2, 4)(x, x)
    for training in (False, True):
        out = LAYERS[name]()(x, x, training=training)
        assert tuple(out.shape) == tuple(expected.shape)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_no_keys_with_scores_is_served_like_mha(name):
    # Cross-attention to an empty key sequence with the weights returned:
    # PyTorch's one_hot raised for the argmax and sample modes.
    query = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    value = np.zeros((2, 0, 8), "float32")
    _, want = keras.layers.MultiHeadAttention(2, 4)(
        query, value, return_attention_scores=True
    )
    out, scores = LAYERS[name]()(query, value, return_attention_scores=True)
    assert tuple(scores.shape) == tuple(want.shape) == (2, 2, 3, 0)
    assert tuple(out.shape) == (2, 3, 8)
    assert not np.any(keras.ops.convert_to_numpy(out))


def test_empty_sequence_through_the_two_stream_block_and_one_hot_argmax():
    streams = [np.zeros((2, 0, 8), "float32")] * 2
    block = kav.TwoStreamBlock(d_model=8, num_heads=2, d_ff=16, seed=1)
    for training in (False, True):
        out = keras.tree.flatten(block(streams, training=training))
        assert [tuple(x.shape) for x in out] == [
            (2, 0, 8),
            (2, 0, 8),
            (2, 2, 0, 0),
        ]
    got = kav.ops.one_hot_argmax(np.zeros((2, 3, 0), "float32"))
    assert tuple(got.shape) == (2, 3, 0)
    with pytest.raises(ValueError, match="`scores` must have shape"):
        kav.ops.one_hot_argmax(np.float32(1.0))


def _masked_model(make):
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(11, 8, mask_zero=True)(tokens)
    return keras.Model(tokens, make()(x, x))


@pytest.mark.skipif(keras.config.backend() != "jax", reason="JAX's export path")
@pytest.mark.parametrize("name", ["dnas", "dnas_2_iterations", "hnas"])
def test_jax_export_with_keras_mask_serves_same_outputs(name, tmp_path):
    tf = pytest.importorskip("tensorflow")
    keras.utils.set_random_seed(0)
    model = _masked_model(LAYERS[name])
    model.export(str(tmp_path), verbose=False)
    served = tf.saved_model.load(str(tmp_path))
    for length in (5, 9):
        tokens = np.random.default_rng(length).integers(1, 11, (3, length))
        tokens[:, -2:] = 0
        tokens = tokens.astype("int32")
        np.testing.assert_allclose(
            np.asarray(served.serve(tf.constant(tokens))),
            np.asarray(model(tokens)),
            atol=1e-5,
        )


def _encoder_model():
    """A `TwoStreamEncoder` (max_length 6) on token ids of any length."""
    tokens = keras.Input((None,), dtype="int32")
    encoder = kav.TwoStreamEncoder(
        vocab_size=11,
        max_length=6,
        num_layers=1,
        d_model=8,
        num_heads=2,
        d_ff=16,
        seed=3,
    )
    return keras.Model(tokens, encoder(tokens))


@pytest.mark.skipif(
    keras.config.backend() != "tensorflow", reason="dynamic-length graphs"
)
def test_exported_encoder_rejects_inputs_longer_than_max_length(tmp_path):
    import tensorflow as tf

    model = _encoder_model()
    model.export(str(tmp_path), verbose=False)
    served = tf.saved_model.load(str(tmp_path))
    ok = np.ones((2, 6), "int32")
    np.testing.assert_allclose(
        served.serve(tf.constant(ok)).numpy(), model(ok), atol=1e-5
    )
    # The first length over the limit too: an off-by-one check let T=7
    # through to the position-embedding gather (zero rows on a GPU).
    for length in (7, 9):
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="max_length=6"
        ):
            served.serve(tf.constant(np.ones((2, length), "int32")))


@pytest.mark.skipif(keras.config.backend() != "jax", reason="JAX's export path")
def test_jax_export_of_the_encoder_with_a_symbolic_length(tmp_path):
    """`_check_shape` compared the symbolic length with `max_length`:
    JAX's export raised `InconclusiveDimensionOperation`."""
    tf = pytest.importorskip("tensorflow")
    model = _encoder_model()
    model.export(str(tmp_path), verbose=False)
    served = tf.saved_model.load(str(tmp_path))
    for length in (4, 6):
        ids = np.ones((2, length), "int32")
        np.testing.assert_allclose(
            np.asarray(served.serve(tf.constant(ids))),
            np.asarray(model(ids)),
            atol=1e-5,
        )
