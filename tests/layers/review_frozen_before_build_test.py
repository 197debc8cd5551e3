"""A layer frozen before it is built stays frozen (review of 2026-11-26).

`trainable=False` in the constructor, or the setter before the first
call, set only the layer's flag: Keras's setter reaches the sublayers and
variables that exist, and the projections (`VariantAttention.build`) or the
blocks' sublayers were built trainable afterwards, so `fit` trained a
layer reporting `trainable == False`. The same happened to a frozen layer
reloaded from `.keras`.
"""

import os

import keras
import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants.layers import TwoStreamBlock
from keras_attnvariants.layers import TwoStreamEncoder

RNG = np.random.default_rng(0)
X = RNG.normal(size=(4, 5, 8)).astype("float32")
TOKENS = RNG.integers(1, 10, (4, 5)).astype("int32")


def _attention_model(layer):
    x = keras.Input((5, 8))
    return keras.Model(x, keras.layers.Dense(3)(layer(x, x)))


def _block_model(layer):
    x = keras.Input((5, 8))
    (_, h), _ = layer((x, x))
    return keras.Model(x, keras.layers.Dense(3)(h))


def _encoder_model(layer):
    x = keras.Input((5,), dtype="int32")
    return keras.Model(x, keras.layers.Dense(3)(layer(x)))


def _frozen(how, make):
    if how == "constructor":
        return make(trainable=False)
    layer = make()
    layer.trainable = False
    return layer


CASES = {
    "hnas": (
        lambda **kw: kav.HybridAttention(2, 4, seed=0, **kw),
        _attention_model,
        X,
    ),
    "dnas_with_term": (
        lambda **kw: kav.DoublyNormalizedAttention(
            2, 4, attention_losses=[kav.KQAlignment("gan", 0.5)], **kw
        ),
        _attention_model,
        X,
    ),
    "gumbel": (
        lambda **kw: kav.GumbelDiscreteAttention(2, 4, seed=0, **kw),
        _attention_model,
        X,
    ),
    "block": (
        lambda **kw: TwoStreamBlock(8, 2, 16, seed=0, **kw),
        _block_model,
        X,
    ),
    "encoder": (
        lambda **kw: TwoStreamEncoder(
            10, 5, 1, d_model=8, num_heads=2, d_ff=16, seed=0, **kw
        ),
        _encoder_model,
        TOKENS,
    ),
}


def _values(layer):
    return [keras.ops.convert_to_numpy(v).copy() for v in layer.weights]


@pytest.mark.parametrize("how", ["constructor", "setter"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fit_leaves_a_layer_frozen_before_build_unchanged(name, how):
    make, model_of, data = CASES[name]
    layer = _frozen(how, make)
    model = model_of(layer)
    frozen = {id(v) for v in layer.weights}
    assert frozen and not frozen & {id(v) for v in model.trainable_weights}
    assert model.trainable_weights  # the head still trains
    before = _values(layer)
    model.compile("sgd", "mse")
    model.fit(data, np.ones((4, 5, 3), "float32"), epochs=1, verbose=0)
    for old, new in zip(before, _values(layer)):
        np.testing.assert_array_equal(new, old)


def test_frozen_layer_reloads_frozen(tmp_path):
    make, model_of, _ = CASES["hnas"]
    model = model_of(make(trainable=False))
    path = os.path.join(tmp_path, "frozen.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    layer = reloaded.layers[1]
    assert isinstance(layer, kav.HybridAttention) and not layer.trainable
    assert not {id(v) for v in layer.weights} & {
        id(v) for v in reloaded.trainable_weights
    }


def test_term_shared_with_a_trainable_layer_keeps_training():
    term = kav.KQAlignment("gan", 0.5)
    frozen = kav.HybridAttention(2, 4, attention_losses=[term], seed=0)
    frozen.trainable = False
    live = kav.HybridAttention(2, 4, attention_losses=[term], seed=1)
    x = keras.Input((5, 8))
    model = keras.Model(x, live(frozen(x, x), frozen(x, x)))
    trainable = {id(v) for v in model.trainable_weights}
    assert {id(v) for v in term.trainable_weights} <= trainable
    assert not {id(v) for v in frozen._query_dense.weights} & trainable


def test_reload_keeps_a_term_thawed_on_a_frozen_layer(tmp_path):
    # The README's per-term control: freeze the layer, keep its adversary
    # training. The reload's build froze the term attached only to it.
    term = kav.KQAlignment("gan", 0.5)
    layer = kav.DoublyNormalizedAttention(2, 4, attention_losses=[term])
    model = _attention_model(layer)
    layer.trainable = False
    term.trainable = True
    path = os.path.join(tmp_path, "thawed.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    loaded = reloaded.layers[1]
    trainable = {id(v) for v in reloaded.trainable_weights}
    assert not loaded.trainable and loaded.attention_losses[0].trainable
    assert {id(v) for v in loaded.attention_losses[0].weights} <= trainable
    assert not {id(v) for v in loaded._query_dense.weights} & trainable
    # The saved flags are held untracked: a tracked list made the term's
    # sublayers the attention layer's own.
    assert len(loaded._layers) == len(layer._layers)
    again = os.path.join(tmp_path, "again.keras")
    reloaded.save(again)
    twice = keras.saving.load_model(again)
    for a, b in zip(twice.weights, model.weights):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b)
        )
