"""Generates the golden artifacts in saved_models/ (run from the repo root).

    KERAS_BACKEND=tensorflow python saved_models/generate.py

For each public layer: a tiny functional model saved as `<name>.keras` and
exported as a SavedModel `<name>_savedmodel/`, with its inputs and expected
inference outputs in `<name>_io.npz`. Tests load each artifact with the
current code and compare outputs, so a change that breaks loading old
artifacts fails CI. Regenerate only on purpose, and update README.md here.
"""

import os
import shutil

import keras
import numpy as np

from keras_attnvariants.testing.layer_zoo import GOLDEN
from keras_attnvariants.testing.layer_zoo import build_model
from keras_attnvariants.testing.layer_zoo import training_data

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    if keras.config.backend() != "tensorflow":
        raise SystemExit("Run with KERAS_BACKEND=tensorflow (for export).")
    for name in GOLDEN:
        model = build_model(name)
        inputs = training_data(num=2, seed=0)[0]
        expected = keras.ops.convert_to_numpy(model(inputs, training=False))
        model.save(os.path.join(HERE, f"{name}.keras"))
        export_dir = os.path.join(HERE, f"{name}_savedmodel")
        shutil.rmtree(export_dir, ignore_errors=True)
        model.export(export_dir, verbose=False)
        np.savez(
            os.path.join(HERE, f"{name}_io.npz"), expected=expected, **inputs
        )
        print("wrote", name)


if __name__ == "__main__":
    main()
