"""Golden artifacts: old `.keras` files and SavedModels must keep loading."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attnvariants.testing.layer_zoo import CONVERTED_BACKBONE
from keras_attnvariants.testing.layer_zoo import GOLDEN

ARTIFACTS = GOLDEN + (CONVERTED_BACKBONE,)

ROOT = os.path.join(os.path.dirname(__file__), "..", "saved_models")

SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
io = np.load(sys.argv[2])
loaded = tf.saved_model.load(sys.argv[1])
inputs = {k: tf.constant(io[k]) for k in io.files if k != "expected"}
out = loaded.serve(inputs)
print(json.dumps(float(np.abs(out.numpy() - io["expected"]).max())))
print(json.dumps("keras_attnvariants" in sys.modules))
"""


@pytest.mark.parametrize("name", ARTIFACTS)
def test_keras_artifact_loads_in_safe_mode_with_same_outputs(name):
    io = np.load(os.path.join(ROOT, f"{name}_io.npz"))
    model = keras.saving.load_model(os.path.join(ROOT, f"{name}.keras"))
    inputs = {k: io[k] for k in io.files if k != "expected"}
    out = model(inputs, training=False)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(out), io["expected"], atol=1e-6
    )


@pytest.mark.skipif(
    keras.config.backend() != "tensorflow", reason="SavedModel needs TF"
)
@pytest.mark.parametrize("name", ARTIFACTS)
def test_savedmodel_serves_same_outputs_in_fresh_process(name):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            SERVE,
            os.path.join(ROOT, f"{name}_savedmodel"),
            os.path.join(ROOT, f"{name}_io.npz"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    max_diff, imported_package = map(json.loads, out.stdout.split()[-2:])
    assert max_diff <= 1e-5
    # Serving needs only TensorFlow, not this package.
    assert imported_package is False


@pytest.mark.parametrize("name", GOLDEN)
def test_fresh_model_matches_golden_definition(name):
    # generate.py and the current code build the same architecture.
    from keras_attnvariants.testing.layer_zoo import build_model

    model = keras.saving.load_model(os.path.join(ROOT, f"{name}.keras"))
    fresh = build_model(name)
    assert [type(layer).__name__ for layer in fresh.layers] == [
        type(layer).__name__ for layer in model.layers
    ]
    # Same options too: with the golden weights, the fresh model gives the
    # golden outputs (a changed iteration count, temperature, inference
    # mode or hybrid setting would not).
    fresh.set_weights(model.get_weights())
    io = np.load(os.path.join(ROOT, f"{name}_io.npz"))
    inputs = {k: io[k] for k in io.files if k != "expected"}
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(fresh(inputs, training=False)),
        io["expected"],
        atol=1e-6,
    )
