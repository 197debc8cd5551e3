"""The shared argument check: Python and NumPy ints in, Python ints out."""

import json
import re

import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants.validation import SEED_LIMIT
from keras_attnvariants.validation import _static_dim
from keras_attnvariants.validation import check_attention_losses
from keras_attnvariants.validation import check_bool
from keras_attnvariants.validation import check_broadcastable
from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_int
from keras_attnvariants.validation import check_integer_dtype
from keras_attnvariants.validation import check_rank
from keras_attnvariants.validation import check_seed
from keras_attnvariants.validation import check_shape
from keras_attnvariants.validation import check_unit_float
from keras_attnvariants.validation import is_python_value
from keras_attnvariants.validation import layer_seed
from keras_attnvariants.validation import python_scalars
from keras_attnvariants.validation import same_size
from keras_attnvariants.validation import static_shape


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


def test_check_int_upper_bound_is_inclusive():
    assert check_int("view", 1, low=0, high=1) == 1
    with pytest.raises(ValueError, match=r"`view` must be an int in \[0, 1\]"):
        check_int("view", 2, low=0, high=1)


def test_check_float_accepts_numpy_scalars_and_returns_python_floats():
    value = check_float("rate", np.float32(0.5))
    assert value == 0.5 and type(value) is float
    assert check_float("weight", 0, low_inclusive=True) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        0.0,
        -1.0,
        float("inf"),
        float("nan"),
        np.float32("nan"),
        # Finite as a longdouble (x86), inf as a Python float.
        np.longdouble("1e400"),
        True,
        np.bool_(1),
        "1",
    ],
)
def test_check_float_rejects(value):
    with pytest.raises(ValueError, match=r"`rate` must be a finite float > 0"):
        check_float("rate", value)


def test_check_seed():
    assert check_seed(None) is None
    assert type(check_seed(np.int64(3))) is int
    assert check_seed(2**31 - 1) == 2**31 - 1
    # Seeds 2**32 apart drew the same Gumbel noise on TensorFlow; JAX
    # rejects negative seeds, PyTorch's int32 seed state seeds >= 2**31.
    for bad in (1.0, True, "0", -1, 2**31, 2**32 + 5):
        with pytest.raises(
            ValueError, match=r"`seed` must be an int in \[0, 2\*\*31\)"
        ):
            check_seed(bad)


def test_check_float_without_lower_bound():
    assert check_float("beta", np.float32(-2.5), low=None) == -2.5
    assert type(check_float("beta", 0, low=None)) is float
    for bad in (float("inf"), float("nan"), True, "1"):
        with pytest.raises(
            ValueError, match=r"`beta` must be a finite float\."
        ):
            check_float("beta", bad, low=None)


def test_check_bool_accepts_python_and_numpy_bools():
    for value in (True, False, np.bool_(True), np.bool_(False)):
        got = check_bool("flag", value)
        assert type(got) is bool and got == bool(value)


@pytest.mark.parametrize(
    "value", ["false", "True", "", 0, 1, np.int64(1), 0.0, 1.0, None, [True]]
)
def test_check_bool_rejects_non_bools(value):
    with pytest.raises(
        ValueError,
        match=r"^`flag` must be a bool\. Received: flag="
        + re.escape(repr(value)),
    ):
        check_bool("flag", value)


def test_python_scalars_converts_only_the_named_numpy_scalars():
    kwargs = {
        "view": np.int64(1),
        "flag": np.bool_(True),
        "x": np.ones(2),
        "other": np.int64(2),
    }
    converted = python_scalars(kwargs, ("view", "flag"))
    assert type(converted["other"]) is np.int64  # not named: unchanged
    assert type(converted["view"]) is int and converted["view"] == 1
    assert converted["flag"] is True
    assert converted["x"] is kwargs["x"]  # arrays stay (Keras's inputs)
    assert type(kwargs["view"]) is np.int64  # the caller's dict unchanged
    untouched = {"view": 2}
    assert python_scalars(untouched, ("view",)) is untouched


# Contracts a mutation sweep found untested.
def test_check_float_rejects_minus_infinity_without_a_lower_bound():
    with pytest.raises(ValueError, match="finite float"):
        check_float("x", float("-inf"), low=None)


def test_layer_seed_wraps_into_the_seed_range():
    assert layer_seed(SEED_LIMIT - 1, 1) == 0
    assert layer_seed(5, 2) == 7
    assert layer_seed(None, 3) is None


def test_a_string_is_no_list_of_attention_losses():
    with pytest.raises(ValueError, match="`attention_losses` must be a list"):
        check_attention_losses("ab")
    check_attention_losses(())


def test_check_unit_float_includes_both_ends():
    assert check_unit_float("mix", 1.0) == 1.0
    assert check_unit_float("mix", np.float32(0.0)) == 0.0
    for bad in (1.0001, -0.1, float("nan"), True):
        with pytest.raises(
            ValueError, match=r"`mix` must be a float in \[0, 1\]"
        ):
            check_unit_float("mix", bad)


def test_check_broadcastable_and_check_rank():
    with pytest.raises(ValueError, match="`m` must be broadcastable"):
        check_broadcastable("m", (1, 1, 1), (1, 1), "`t`")
    check_broadcastable("m", (1, None), (4, 3), "`t`")
    with pytest.raises(ValueError, match=r"`x` must have shape \(B, T, S\)"):
        check_rank("x", (2, 3), (3, 4), "(B, T, S)")
    check_rank("x", None, (3,), "(B, T, S)")


def test_same_size_and_static_shape():
    assert same_size(3, None) and same_size(None, 3) and same_size(3, 3)
    assert not same_size(3, 4)
    assert _static_dim(True) is None
    assert static_shape([[1, 2], [3]]) is None  # ragged
    assert static_shape([[1, 2], [3, 4]]) == (2, 2)


@pytest.mark.parametrize("shape", [(-1, 2), (True, 2), (2.0, 3), (None,), 3])
def test_check_shape_rejects(shape):
    with pytest.raises(ValueError, match="`s` must be a tuple of ints >= 0"):
        check_shape("s", shape)


def test_check_integer_dtype_rejects_booleans():
    with pytest.raises(ValueError, match="`ids` must be integer ids"):
        check_integer_dtype("ids", np.zeros(2, bool), "ids")
    check_integer_dtype("ids", np.zeros(2, "uint8"), "ids")


def test_numpy_scalars_are_python_values():
    # NumPy's floats and ints are `numbers` already; its bools are not.
    assert is_python_value(np.float32(1)) and is_python_value(None)
    assert is_python_value(np.bool_(True))
    assert not is_python_value(np.ones(2))
