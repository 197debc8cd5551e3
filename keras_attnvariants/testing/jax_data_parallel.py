"""Trains each zoo model on one device and with `DataParallel` on JAX.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 KERAS_BACKEND=jax \
        python -m keras_attnvariants.testing.jax_data_parallel [NAME ...]

The parallel run builds, compiles and fits inside `distribute.model_scope()`,
as the examples do. Prints one JSON line per model: name, the distribution
(its class and device count),
both loss histories and the number of devices holding the first trainable
variable in each run (all of them once the distribution is in effect).
"""

import contextlib
import json
import sys

import keras

from keras_attnvariants import distribute
from keras_attnvariants.testing import layer_zoo


def train(name, scope, data):
    """Loss history, the first variable's device count and what `scope`
    yielded (if it is the active distribution), the model built, compiled
    and fitted inside `scope`."""
    with scope as distribution:
        active = keras.distribution.distribution() is distribution
        model = layer_zoo.build_model(name)
        model.compile(keras.optimizers.SGD(0.1), "mse")
        history = model.fit(
            *data, batch_size=8, epochs=2, shuffle=False, verbose=0
        )
    variable = model.trainable_variables[0].value
    devices = len(variable.sharding.device_set)
    return history.history["loss"], devices, distribution if active else None


def main(names):
    data = layer_zoo.training_data()
    for name in names:
        single, single_devices, _ = train(name, contextlib.nullcontext(), data)
        # What the examples use: `data_parallel()` with several devices.
        parallel, parallel_devices, distribution = train(
            name, distribute.model_scope(), data
        )
        record = {
            "name": name,
            "distribution": type(distribution).__name__,
            "devices": len(distribution.device_mesh.devices.flatten()),
            "single": single,
            "loss": parallel,
            "variable_devices": [single_devices, parallel_devices],
        }
        print(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1:] or sorted(layer_zoo.LAYERS))
