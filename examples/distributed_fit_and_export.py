"""Trains a functional model with the package's layers under the picked
strategy, exports it as a SavedModel, reloads it and checks parity.

    python examples/distributed_fit_and_export.py [--quick] [--cpu-replicas 2]
        [--output saved_models/example_export]

On a TPU host the strategy is TPUStrategy, on GPUs MirroredStrategy; here,
with `--cpu-replicas 2`, MirroredStrategy over two logical CPU devices.
"""

import argparse
import os
import sys
import time

from flag_types import output_folder

from keras_attnvariants import distribute

LENGTH, VOCAB = 16, 50


def make_data(n, seed=0):
    """`(n, LENGTH)` token ids padded with 0 and labels (first token odd)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, size=(n, LENGTH)).astype("int32")
    lengths = rng.integers(4, LENGTH + 1, size=n)
    tokens[np.arange(LENGTH)[None] >= lengths[:, None]] = 0
    labels = (tokens[:, 0] % 2).astype("int32")
    return tokens, labels


def build_model():
    """DNAS and HNAS blocks, mean pooling, softmax (compiled)."""
    import keras

    import keras_attnvariants as kav

    inputs = keras.Input((LENGTH,), dtype="int32", name="tokens")
    # Explicit masks: Keras MHA drops the Keras mask of its inputs, so the
    # residual sums carry none (the second attention attended the padded
    # keys and the pooling averaged the padded positions).
    real = keras.ops.not_equal(inputs, 0)
    pairs = keras.ops.logical_and(real[:, :, None], real[:, None, :])
    x = keras.layers.Embedding(VOCAB, 32)(inputs)
    x = x + kav.DoublyNormalizedAttention(4, 8)(x, x, attention_mask=pairs)
    x = keras.layers.LayerNormalization()(x)
    x = x + kav.HybridAttention(4, 8, hybrid_init=0.5)(
        x, x, attention_mask=pairs
    )
    x = keras.layers.GlobalAveragePooling1D()(x, mask=real)
    outputs = keras.layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        "adam", "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized run")
    parser.add_argument(
        "--cpu-replicas",
        type=int,
        default=2,
        help="logical CPU replicas when no accelerator is found (default 2)",
    )
    parser.add_argument(
        "--output",
        type=output_folder,
        default=os.path.join("saved_models", "example_export"),
        help="SavedModel directory (default saved_models/example_export)",
    )
    args = parser.parse_args(argv)
    if args.cpu_replicas < 1:
        parser.error(f"--cpu-replicas must be >= 1, got {args.cpu_replicas}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_replicas > 1:
        distribute.split_cpu(args.cpu_replicas)

    import keras
    import numpy as np
    import tensorflow as tf

    strategy = distribute.pick_strategy(cpu_replicas=args.cpu_replicas)
    print(
        f"strategy: {type(strategy).__name__}, "
        f"replicas: {strategy.num_replicas_in_sync}"
    )
    keras.utils.set_random_seed(0)
    n = 256 if args.quick else 4096
    tokens, labels = make_data(n)
    with strategy.scope():
        model = build_model()
    start = time.time()
    model.fit(
        tokens, labels, batch_size=32, epochs=1 if args.quick else 5, verbose=2
    )
    print(f"trained in {time.time() - start:.1f}s")

    model.export(args.output, verbose=False)
    served = tf.saved_model.load(args.output)
    sample = tokens[:8]
    want = keras.ops.convert_to_numpy(model(sample, training=False))
    got = served.serve(tf.constant(sample)).numpy()
    diff = float(np.abs(want - got).max())
    print(f"exported to {args.output}; reload max abs diff {diff:.2e}")
    if diff > 1e-5:
        print("PARITY FAILED", file=sys.stderr)
        return 1
    print("PARITY OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
