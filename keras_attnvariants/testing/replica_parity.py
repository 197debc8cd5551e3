"""Trains models on one device and under MirroredStrategy; compares losses.

Run as a script (logical CPU devices must be configured before TensorFlow
starts, hence a fresh process):

    python -m keras_attnvariants.testing.replica_parity NAME [NAME ...]

Prints one JSON line per model: {"name", "single", "mirrored", "metrics"}.
"""

import json
import sys

from keras_attnvariants import distribute

distribute.split_cpu(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

import keras_attnvariants as kav  # noqa: E402
from keras_attnvariants.losses.attention_loss import AttentionLoss  # noqa: E402

LENGTH, DIM, BATCH = 6, 8, 8


@keras.saving.register_keras_serializable(package="keras_attnvariants_test")
class WeightSquareLoss(AttentionLoss):
    """Batch mean of the squared attention weights (a deterministic term)."""

    def compute_loss_value(self, attention_weights):
        per_example = ops.sum(ops.square(attention_weights), axis=(1, 2, 3))
        return 0.1 * ops.mean(per_example)

    def from_attention(self, context):
        return self(context["attention_weights"])


FACTORIES = {
    "dnas": lambda: kav.DoublyNormalizedAttention(2, 4),
    "hnas": lambda: kav.HybridAttention(2, 4, hybrid_init=0.3),
    "dnas_with_loss": lambda: kav.DoublyNormalizedAttention(
        2, 4, attention_losses=[WeightSquareLoss(name="weight_square")]
    ),
}


def build(name):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(10, DIM, mask_zero=True)(tokens)
    x = x + FACTORIES[name]()(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(tokens, keras.layers.Dense(1)(x))
    # XLA cannot place one program across logical CPU devices (TF known
    # issue); XLA itself is tested per layer on one device.
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
    return model


def train(name, strategy, data):
    with strategy.scope():
        model = build(name)
    history = model.fit(
        *data, batch_size=BATCH, epochs=3, shuffle=False, verbose=0
    )
    return history.history


def main(names):
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 10, size=(32, LENGTH))
    tokens[:, 4:] *= rng.random((32, 1)) < 0.5  # padding on half the rows
    data = (tokens, rng.normal(size=(32, 1)).astype("float32"))
    single = distribute.pick_strategy()
    mirrored = distribute.pick_strategy(cpu_replicas=2)
    for name in names:
        one = train(name, single, data)
        two = train(name, mirrored, data)
        print(
            json.dumps(
                {
                    "name": name,
                    "replicas": mirrored.num_replicas_in_sync,
                    "single": one["loss"],
                    "mirrored": two["loss"],
                    "metrics": sorted(two),
                }
            )
        )


if __name__ == "__main__":
    main(sys.argv[1:] or sorted(FACTORIES))
