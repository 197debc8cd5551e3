"""A frozen `KQAlignment` term must stay frozen (review of 2026-11-26; CI
runs `tests/backbones` on all three backends).

- A term frozen with `term.trainable = False` came back from a `.keras`
  reload saying `trainable == False`, but its adversary's variables were in
  `model.trainable_weights` and `fit` trained them: the term builds its
  adversary sublayers trainable, and a term frozen before it is built
  (reloaded, or frozen before attaching) never froze them.
- A converted backbone saved its terms' configs as they were at
  conversion: a term frozen afterwards came back trainable.
"""

import os

import keras
import numpy as np
import pytest
from conversion_serialization_test import tiny_bert

import keras_attnvariants as kav
from keras_attnvariants.backbones.conversion import convert_backbone
from keras_attnvariants.backbones.conversion import self_attention_layers

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)


def _ids(weights):
    return {id(v) for v in weights}


def _term_model(term):
    x = keras.Input((4, 8))
    layer = kav.HybridAttention(
        2, 4, hybrid_init=0.0, attention_losses=[term], seed=0
    )
    return keras.Model(x, layer(x, x))


def _fit_changes(model, term):
    model.compile("adam", "mse")
    before = [keras.ops.convert_to_numpy(v).copy() for v in term.weights]
    data = np.random.default_rng(0).random((4, 4, 8)).astype("float32")
    model.fit(data, data, epochs=1, verbose=0)
    after = [keras.ops.convert_to_numpy(v) for v in term.weights]
    return any(not np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("method", ["gan", "ct"])
def test_frozen_term_stays_frozen_after_reload(tmp_path, method):
    term = kav.KQAlignment(method=method, weight=0.5)
    model = _term_model(term)
    term.trainable = False
    assert not _ids(term.weights) & _ids(model.trainable_weights)
    path = os.path.join(tmp_path, "frozen.keras")
    model.save(path)
    reloaded = keras.models.load_model(path)
    loaded_term = reloaded.layers[1].attention_losses[0]
    assert loaded_term.trainable is False
    assert loaded_term.weights
    assert not _ids(loaded_term.weights) & _ids(reloaded.trainable_weights)
    assert not _fit_changes(reloaded, loaded_term)
    # Positive control: the same fit trains the term once it is thawed.
    loaded_term.trainable = True
    assert _fit_changes(reloaded, loaded_term)


def test_term_frozen_before_attaching_stays_frozen():
    term = kav.KQAlignment(method="ct", weight=0.5)
    term.trainable = False
    model = _term_model(term)
    assert term.weights
    assert not _ids(term.weights) & _ids(model.trainable_weights)
    assert not _fit_changes(model, term)
    # Thawed again, it trains.
    term.trainable = True
    assert _ids(term.weights) <= _ids(model.trainable_weights)
    assert _fit_changes(model, term)


def test_converted_backbone_saves_a_term_frozen_after_conversion(tmp_path):
    term = kav.KQAlignment(method="gan", weight=0.5)
    converted = convert_backbone(
        tiny_bert(), kav.HybridAttention, attention_losses=[term]
    )
    term.trainable = False
    config = converted.get_config()["attention_config"]
    saved = config["attention_kwargs"]["attention_losses"][0]["config"]
    assert saved["trainable"] is False
    path = os.path.join(tmp_path, "converted.keras")
    converted.save(path)
    reloaded = keras.models.load_model(path)
    loaded_term = self_attention_layers(reloaded)[0].attention_losses[0]
    assert loaded_term.trainable is False
    assert not _ids(loaded_term.weights) & _ids(reloaded.trainable_weights)
