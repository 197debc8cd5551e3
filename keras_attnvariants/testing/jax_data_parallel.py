"""Trains each zoo model with `keras.distribution.DataParallel` on JAX.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 KERAS_BACKEND=jax \
        python -m keras_attnvariants.testing.jax_data_parallel [NAME ...]

Prints one JSON line per model: name, device count, loss history.
"""

import json
import sys

import keras

from keras_attnvariants import distribute
from keras_attnvariants.testing import layer_zoo


def main(names):
    distribution = distribute.data_parallel()
    keras.distribution.set_distribution(distribution)
    data = layer_zoo.training_data()
    for name in names:
        model = layer_zoo.build_model(name)
        model.compile(keras.optimizers.SGD(0.1), "mse")
        history = model.fit(*data, batch_size=8, epochs=2, verbose=0)
        record = {
            "name": name,
            "devices": len(distribution.device_mesh.devices.flatten()),
            "loss": history.history["loss"],
        }
        print(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1:] or sorted(layer_zoo.LAYERS))
