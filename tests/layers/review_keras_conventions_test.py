"""Keras conventions of the two-stream layers (review of 2026-11-26):
`compute_output_shape` raised `NotImplementedError`, and NumPy booleans
for their flags raised `ValueError` while the attention layers took
them."""

import keras
import numpy as np
import pytest

from keras_attnvariants.layers import TwoStreamBlock
from keras_attnvariants.layers import TwoStreamEncoder

X = np.random.default_rng(0).random((2, 4, 8)).astype("float32")
TOKENS = np.array([[1, 2, 3, 0], [4, 5, 0, 0]], "int32")


def _shapes(outputs):
    return keras.tree.map_structure(
        lambda t: tuple(t.shape), outputs, none_is_leaf=False
    )


def _as_lists(structure):
    """Tuples of shapes as lists, so output structures compare."""
    if isinstance(structure, (list, tuple)) and not all(
        isinstance(d, (int, type(None))) for d in structure
    ):
        return [_as_lists(s) for s in structure]
    return tuple(structure)


@pytest.mark.parametrize("mode", ["two_stream", "single_stream"])
def test_block_compute_output_shape_matches_its_outputs(mode):
    block = TwoStreamBlock(8, 2, 16, mode=mode, seed=0)
    inputs = (X, X) if mode == "two_stream" else X
    shape = ((2, 4, 8), (2, 4, 8)) if mode == "two_stream" else (2, 4, 8)
    assert _as_lists(block.compute_output_shape(shape)) == _as_lists(
        _shapes(block(inputs))
    )


@pytest.mark.parametrize("return_attention", [False, True])
def test_encoder_compute_output_shape_matches_its_outputs(return_attention):
    encoder = TwoStreamEncoder(
        10, 6, 2, d_model=8, num_heads=2, d_ff=16, seed=0
    )
    expected = _shapes(encoder(TOKENS, return_attention=return_attention))
    got = encoder.compute_output_shape(
        (2, 4), return_attention=return_attention
    )
    assert _as_lists(got) == _as_lists(expected)


def test_compute_output_shape_rejects_bad_shapes():
    with pytest.raises(ValueError, match="d_model"):
        TwoStreamBlock(8, 2, 16).compute_output_shape(((2, 4, 6), (2, 4, 6)))
    encoder = TwoStreamEncoder(10, 3, 1, d_model=8, num_heads=2, d_ff=16)
    with pytest.raises(ValueError, match="max_length=3"):
        encoder.compute_output_shape((2, 4))


def test_numpy_bool_flags_are_taken_as_bools():
    block = TwoStreamBlock(8, 2, 16, seed=0)
    causal = block((X, X), use_causal_mask=np.True_)[1]
    z = keras.ops.convert_to_numpy(causal)
    assert np.all(
        z[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0
    )
    encoder = TwoStreamEncoder(10, 6, 1, d_model=8, num_heads=2, d_ff=16)
    h, attention = encoder(TOKENS, return_attention=np.True_)
    assert len(attention) == 1
    encoder(TOKENS, use_causal_mask=np.bool_(False))


def test_guidance_on_cross_attention_raises_when_the_model_is_built():
    # Passed functional-model construction and failed only in `fit`.
    import keras_attnvariants as kav

    term = kav.AttentionGuidanceRegularizer({0: "first"}, alpha=1.0)
    layer = kav.HybridAttention(2, 4, attention_losses=[term])
    query, value = keras.Input((3, 8)), keras.Input((5, 8))
    with pytest.raises(ValueError, match="attention_losses.*self-attention"):
        layer(query, value)
    # Self-attention, and unknown lengths, build.
    x = keras.Input((None, 8))
    kav.HybridAttention(2, 4, attention_losses=[term])(x, x)


def test_guidance_of_a_missing_head_raises_when_the_model_is_built():
    import keras_attnvariants as kav

    term = kav.AttentionGuidanceRegularizer({3: "next"}, alpha=1.0)
    x = keras.Input((5, 8))
    with pytest.raises(ValueError, match="guides head 3.*2 heads"):
        kav.DoublyNormalizedAttention(2, 4, attention_losses=[term])(x, x)


def test_per_layer_guidance_maps_fit_layers_of_different_heads():
    # Each map guides a head of its own layer: the build-time check
    # compared every map with every layer (head 3 against 2 heads).
    import keras_attnvariants as kav

    term = kav.AttentionGuidanceRegularizer(
        [{3: "next"}, {1: "prev"}], alpha=1.0
    )
    x = keras.Input((5, 8))
    h = kav.HybridAttention(4, 2, attention_losses=[term])(x, x)
    h = kav.HybridAttention(2, 4, attention_losses=[term])(h, h)
    model = keras.Model(x, h)
    model.compile("sgd", "mse")
    data = np.random.default_rng(0).random((2, 5, 8)).astype("float32")
    model.fit(data, data, epochs=1, verbose=0)
    assert float(keras.ops.convert_to_numpy(term.step)) == 1.0
