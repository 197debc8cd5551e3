import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="tf.distribute needs the TensorFlow backend",
)


def test_mirrored_loss_history_equals_single_device():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-m", "keras_attnvariants.testing.replica_parity"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = [
        json.loads(line) for line in out.stdout.splitlines() if line[:1] == "{"
    ]
    assert {r["name"] for r in results} == {"dnas", "hnas", "dnas_with_loss"}
    for result in results:
        assert result["replicas"] == 2
        np.testing.assert_allclose(
            result["mirrored"], result["single"], rtol=1e-4, err_msg=str(result)
        )
        if result["name"] == "dnas_with_loss":
            assert "weight_square" in result["metrics"]


def test_pick_strategy_on_this_machine_is_default():
    from keras_attnvariants import distribute

    strategy = distribute.pick_strategy()
    assert strategy.num_replicas_in_sync == 1
