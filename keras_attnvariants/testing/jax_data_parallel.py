"""Trains each zoo model on one device and with `DataParallel` on JAX.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 KERAS_BACKEND=jax \
        python -m keras_attnvariants.testing.jax_data_parallel [NAME ...]

Prints one JSON line per model: name, the distribution's device count,
both loss histories and the number of devices holding the first trainable
variable in each run (all of them once the distribution is in effect).
"""

import json
import sys

import keras

from keras_attnvariants import distribute
from keras_attnvariants.testing import layer_zoo


def train(name, distribution, data):
    """Loss history and the first variable's device count."""
    keras.distribution.set_distribution(distribution)
    try:
        model = layer_zoo.build_model(name)
        model.compile(keras.optimizers.SGD(0.1), "mse")
        history = model.fit(
            *data, batch_size=8, epochs=2, shuffle=False, verbose=0
        )
    finally:
        keras.distribution.set_distribution(None)
    variable = model.trainable_variables[0].value
    return history.history["loss"], len(variable.sharding.device_set)


def main(names):
    distribution = distribute.data_parallel()
    data = layer_zoo.training_data()
    for name in names:
        single, single_devices = train(name, None, data)
        parallel, parallel_devices = train(name, distribution, data)
        record = {
            "name": name,
            "devices": len(distribution.device_mesh.devices.flatten()),
            "single": single,
            "loss": parallel,
            "variable_devices": [single_devices, parallel_devices],
        }
        print(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1:] or sorted(layer_zoo.LAYERS))
