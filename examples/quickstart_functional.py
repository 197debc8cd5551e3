"""Trains a small functional text classifier with DNAS / HNAS attention.

A synthetic task where explaining away hurts: the label is the majority
token over the sequence; every position matters. Compares
`keras.layers.MultiHeadAttention` with `DoublyNormalizedAttention` and
`HybridAttention`, printing accuracy and the learned hybrid weights.

    python examples/quickstart_functional.py [--quick]
"""

import argparse
import time

import keras
import numpy as np

import keras_attnvariants as kav
from keras_attnvariants import distribute

VOCAB, LENGTH, DIM = 12, 24, 32


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(LENGTH // 2, LENGTH + 1, size=n)
    tokens = rng.integers(1, 3, size=(n, LENGTH))
    noise = rng.integers(3, VOCAB, size=(n, LENGTH))
    tokens = np.where(rng.random((n, LENGTH)) < 0.5, tokens, noise)
    tokens[np.arange(LENGTH)[None] >= lengths[:, None]] = 0
    labels = ((tokens == 1).sum(1) > (tokens == 2).sum(1)).astype("int32")
    return tokens, labels


def build(attention):
    tokens = keras.Input((LENGTH,), dtype="int32")
    real = keras.ops.not_equal(tokens, 0)
    x = keras.layers.Embedding(VOCAB, DIM, mask_zero=True)(tokens)
    x = x + attention(x, x)  # keys masked by the embedding's Keras mask
    x = keras.layers.LayerNormalization()(x)
    # The residual `+` returns no Keras mask (`keras.layers.Add` would keep
    # it), so pass it explicitly, or the mean would include the padding.
    x = keras.layers.GlobalAveragePooling1D()(x, mask=real)
    outputs = keras.layers.Dense(2, activation="softmax")(x)
    model = keras.Model(tokens, outputs)
    model.compile(
        keras.optimizers.Adam(3e-3),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized run")
    args = parser.parse_args()
    n, epochs = (512, 2) if args.quick else (4096, 8)
    x_train, y_train = make_data(n, seed=0)
    x_test, y_test = make_data(1024, seed=1)
    variants = {
        "softmax (keras MHA)": lambda: keras.layers.MultiHeadAttention(4, 8),
        "DNAS": lambda: kav.DoublyNormalizedAttention(4, 8),
        "HNAS": lambda: kav.HybridAttention(4, 8, hybrid_init=0.5),
    }
    print(f"{'variant':22s} {'test acc':>8s} {'seconds':>8s}")
    for name, make in variants.items():
        keras.utils.set_random_seed(0)
        layer = make()
        with distribute.model_scope():
            model = build(layer)
            start = time.time()
            model.fit(x_train, y_train, batch_size=64, epochs=epochs, verbose=2)
            _, acc = model.evaluate(x_test, y_test, verbose=0)
        print(f"{name:22s} {acc:8.3f} {time.time() - start:8.1f}")
        if isinstance(layer, kav.HybridAttention):
            print("  learned hybrid weights per head:", layer.hybrid_weights)


if __name__ == "__main__":
    main()
