"""Generates the golden artifacts in saved_models/ (run from the repo root).

    KERAS_BACKEND=tensorflow python saved_models/generate.py [NAME ...]

With names, only those artifacts are (re)written; existing artifacts stay as
they are so that the tests keep checking that old files load.

For each public layer: a tiny functional model saved as `<name>.keras` and
exported as a SavedModel `<name>_savedmodel/`, with its inputs and expected
inference outputs in `<name>_io.npz`. Tests load each artifact with the
current code and compare outputs, so a change that breaks loading old
artifacts fails CI. Regenerate only on purpose, and update README.md here.
"""

import os
import shutil
import sys

import keras
import numpy as np

from keras_attnvariants.testing.layer_zoo import CONVERTED_BACKBONE
from keras_attnvariants.testing.layer_zoo import GOLDEN
from keras_attnvariants.testing.layer_zoo import backbone_inputs
from keras_attnvariants.testing.layer_zoo import build_converted_backbone
from keras_attnvariants.testing.layer_zoo import build_model
from keras_attnvariants.testing.layer_zoo import training_data

ARTIFACTS = GOLDEN + (CONVERTED_BACKBONE,)

HERE = os.path.dirname(os.path.abspath(__file__))


def main(names):
    if keras.config.backend() != "tensorflow":
        raise SystemExit("Run with KERAS_BACKEND=tensorflow (for export).")
    unknown = sorted(set(names) - set(ARTIFACTS))
    if unknown:
        raise SystemExit(
            f"unknown artifact(s) {unknown}; choose from {ARTIFACTS}"
        )
    for name in names or ARTIFACTS:
        if name == CONVERTED_BACKBONE:
            model, inputs = build_converted_backbone(), backbone_inputs()
        else:
            model, inputs = build_model(name), training_data(num=2, seed=0)[0]
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
    main(sys.argv[1:])
