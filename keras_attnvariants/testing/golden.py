"""Tiny models behind the golden artifacts of saved_models/."""

import keras
import numpy as np

import keras_attnvariants as kav

LENGTH, VOCAB, DIM = 6, 11, 8

ARTIFACTS = {
    "doubly_normalized_attention": lambda: kav.DoublyNormalizedAttention(
        2, 4, iterations=2
    ),
    "hybrid_attention": lambda: kav.HybridAttention(2, 4, hybrid_init=0.3),
}


def golden_inputs():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, VOCAB, size=(2, LENGTH)).astype("int32")
    tokens[1, 4:] = 0  # padding
    return {"tokens": tokens}


def build_model(name):
    """A seeded functional model: embedding (mask_zero) -> layer -> dense."""
    keras.utils.set_random_seed(1)
    tokens = keras.Input((LENGTH,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, DIM, mask_zero=True)(tokens)
    x = x + ARTIFACTS[name]()(x, x)
    outputs = keras.layers.Dense(3, name="head")(x)
    return keras.Model({"tokens": tokens}, outputs, name=name)
