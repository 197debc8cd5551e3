"""Contracts that a mutation sweep (2026-12-02) found untested: each test
passes on the code and fails with the bug named in its comment."""

import numpy as np
import pytest
from keras import ops

import keras_attnvariants as kav
from keras_attnvariants.ops.gumbel import argmax_indices
from keras_attnvariants.ops.gumbel import one_hot_argmax
from keras_attnvariants.ops.gumbel import relaxed_sample
from keras_attnvariants.ops.gumbel import selection_logits


def _x(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def test_a_masked_key_never_wins_a_row_of_minus_inf_scores():
    # Without the floor at the smallest float32, the masked key 0 won a row
    # whose valid scores had overflowed to -inf: an all-zero one-hot, and
    # the layer gathered the padded key's value row.
    scores = np.full((1, 1, 3), -np.inf, "float32")
    mask = np.array([[[False, True, True]]])
    index = ops.convert_to_numpy(argmax_indices(selection_logits(scores, mask)))
    assert index[0, 0] == 1
    weights = ops.convert_to_numpy(one_hot_argmax(scores, mask))
    np.testing.assert_array_equal(weights, [[[0.0, 1.0, 0.0]]])


def test_a_python_temperature_below_the_floor_gives_finite_weights():
    # At 1e-38, `(s + g) / temperature` overflowed to inf: NaN weights.
    scores = np.array([[[1.0, 2.0, 0.5]]], "float32")
    weights = ops.convert_to_numpy(relaxed_sample(scores, 0.0, 1e-38))
    np.testing.assert_array_equal(weights, [[[0.0, 1.0, 0.0]]])


@pytest.mark.parametrize(
    "make",
    [
        lambda: kav.DoublyNormalizedAttention(2, 4, dropout=0.5, seed=1),
        lambda: kav.HybridAttention(2, 4, dropout=0.5, seed=1),
    ],
    ids=["dnas", "hnas"],
)
def test_returned_scores_are_the_weights_before_dropout(make):
    # As Keras MHA returns them: with the dropped weights returned, rows
    # no longer summed to 1 (zeros, and entries scaled by 2).
    layer = make()
    x = _x((2, 5, 8))
    _, scores = layer(x, x, training=True, return_attention_scores=True)
    np.testing.assert_allclose(
        ops.convert_to_numpy(scores).sum(-1), 1.0, atol=1e-5
    )


@pytest.mark.parametrize(
    "cls", [kav.DoublyNormalizedAttention, kav.HybridAttention]
)
def test_fused_path_still_applies_attention_dropout(cls):
    # The fused kernels take no dropout: the layer must fall back to the
    # explicit path when training with dropout, or dropout was silently off
    # (the default path on PyTorch).
    layer = cls(2, 4, dropout=0.5, seed=1, attention_path="fused")
    x = _x((2, 6, 8))
    train = ops.convert_to_numpy(layer(x, x, training=True))
    infer = ops.convert_to_numpy(layer(x, x, training=False))
    assert np.abs(train - infer).max() > 1e-3


def test_folded_straight_through_output_is_the_one_hot_output():
    # The usual `fit` call (no weights returned) takes the folded path: it
    # must give what the materialized one-hot weights give for the same
    # noise, not the relaxed sample's output.
    layer = kav.GumbelDiscreteAttention(
        1, 4, straight_through=True, seed=3, temperature=2.0
    )
    x = _x((1, 5, 8))
    layer(x, x)
    state = ops.convert_to_numpy(layer.seed_generator.state.value)
    materialized, weights = layer(
        x, x, training=True, return_attention_scores=True
    )
    assert set(np.unique(ops.convert_to_numpy(weights))) <= {0.0, 1.0}
    layer.seed_generator.state.assign(state)
    folded = layer(x, x, training=True)
    np.testing.assert_allclose(
        ops.convert_to_numpy(folded),
        ops.convert_to_numpy(materialized),
        atol=1e-5,
    )
    # The relaxed layer's output, for the same noise, is another one.
    relaxed = kav.GumbelDiscreteAttention(1, 4, seed=3, temperature=2.0)
    relaxed(x, x)
    relaxed.set_weights(layer.get_weights())
    relaxed.seed_generator.state.assign(state)
    assert (
        np.abs(
            ops.convert_to_numpy(relaxed(x, x, training=True))
            - ops.convert_to_numpy(folded)
        ).max()
        > 1e-4
    )
