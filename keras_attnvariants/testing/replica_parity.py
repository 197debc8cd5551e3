"""Trains each zoo model on one device and under MirroredStrategy.

Run as a script (logical CPU devices must be configured before TensorFlow
starts, hence a fresh process):

    python -m keras_attnvariants.testing.replica_parity [NAME ...]
    python -m keras_attnvariants.testing.replica_parity --examples 17 \
        --epochs 1 [NAME ...]

Prints one JSON line per model: name, replicas, both loss histories and the
last value of every metric logged on one device and under MirroredStrategy
(the one-device ones `null` for the models that sample noise, which are
not in `layer_zoo.DETERMINISTIC`).
`--examples 17` (batches of 8) leaves a final batch of one example, so one
replica gets none (default 32: even splits); `--epochs` defaults to 3.
"""

import argparse
import json

import keras

from keras_attnvariants import distribute
from keras_attnvariants.testing import layer_zoo


def train(name, strategy, data, epochs=3):
    with strategy.scope():
        model = layer_zoo.build_model(name)
        # XLA cannot place one program across logical CPU devices (a TF
        # known issue); XLA itself is tested per layer on one device.
        model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
    history = model.fit(
        *data, batch_size=8, epochs=epochs, shuffle=False, verbose=0
    )
    return history.history


def main(names, examples=32, epochs=3):
    data = layer_zoo.training_data(examples)
    single = distribute.pick_strategy()
    mirrored = distribute.pick_strategy(cpu_replicas=2)
    for name in names:
        # The sampling models' histories differ by design (each replica
        # draws its own noise): their one-device run has nothing to match.
        one = None
        if name in layer_zoo.DETERMINISTIC:
            one = train(name, single, data, epochs)
        two = train(name, mirrored, data, epochs)
        record = {
            "name": name,
            "replicas": mirrored.num_replicas_in_sync,
            "single": one and one["loss"],
            "mirrored": two["loss"],
            "metrics": {k: v[-1] for k, v in two.items()},
            "single_metrics": one and {k: v[-1] for k, v in one.items()},
        }
        print(json.dumps(record))


if __name__ == "__main__":
    # Here, not at import: pytest's doctest collection imports this module,
    # and a split at import reconfigured the whole test process's CPUs (or
    # failed collection once TensorFlow had started).
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="*")
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    distribute.split_cpu(2)
    main(args.names or sorted(layer_zoo.LAYERS), args.examples, args.epochs)
