"""The shared argument check: Python and NumPy ints in, Python ints out."""

import json

import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants.validation import check_int


def test_check_int_accepts_numpy_ints_and_returns_python_ints():
    value = check_int("steps", np.int64(3))
    assert value == 3 and type(value) is int
    assert check_int("length", 2, low=2) == 2


@pytest.mark.parametrize("value", [0, -1, 1.0, True, "2", None])
def test_check_int_names_the_argument_and_the_value(value):
    with pytest.raises(ValueError, match=r"`steps` must be an int >= 1\. "):
        check_int("steps", value)


def test_layer_configs_hold_python_ints():
    # NumPy ints are accepted and stored as ints, so configs stay JSON.
    layers = [
        kav.DoublyNormalizedAttention(2, 4, iterations=np.int64(2)),
        kav.TwoStreamBlock(d_model=np.int32(8), num_heads=2, d_ff=16),
        kav.KQAlignment("ot", iterations=np.int64(5)),
    ]
    for layer in layers:
        json.dumps(layer.get_config())
