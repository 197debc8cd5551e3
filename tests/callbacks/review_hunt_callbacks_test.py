import keras
import numpy as np
import pytest
from keras import ops

from keras_attnvariants import evaluation
from keras_attnvariants.callbacks.temperature_schedule import (
    TemperatureSchedule,
)
from keras_attnvariants.layers.recording import record_attention
from keras_attnvariants.testing.test_case import TestCase


class TemperatureScheduleBoundaryTest(TestCase):
    def test_exponential_starts_exactly_at_initial(self):
        # Computed as exp(log(initial) + t log(rate)), step 0 gave e.g.
        # 0.10000000000000002 for initial=0.1 (off by an ulp).
        for initial in (0.1, 0.3, 0.7, 1.1):
            schedule = TemperatureSchedule(
                "exponential", initial=initial, rate=0.9, floor=0.01
            )
            self.assertEqual(schedule.value(0), initial)

    def test_value_rejects_a_bad_step(self):
        # Negative steps extrapolated above `initial` (linear: 1.25 at -1).
        schedule = TemperatureSchedule("linear", initial=1.0, final=0.5)
        for step in (-1, 1.5, True, "2"):
            with self.assertRaisesRegex(
                ValueError, r"`step` must be an int >= 0\. Received: step="
            ):
                schedule.value(step)
        self.assertEqual(schedule.value(np.int64(0)), 1.0)


class RecordAttentionCausalTest(TestCase):
    def test_causal_only_call_records_the_causal_mask(self):
        # Keras MHA routes a causal-only call to its fused kernel with
        # `attention_mask=None, use_causal_mask=True`; the record said
        # `attention_mask=None`, as if the attention were unmasked, while the
        # same call with an all-True mask recorded the causal mask.
        layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
        x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
        with record_attention([layer]) as calls:
            layer(x, x, use_causal_mask=True)
            layer(x, x, use_causal_mask=True, attention_mask=np.ones((2, 3, 3)))
        want = np.tril(np.ones((3, 3), bool))
        self.assertLen(calls, 2)
        for call in calls:
            mask = ops.convert_to_numpy(call.attention_mask)
            self.assertEqual(mask.dtype, bool)
            np.testing.assert_array_equal(
                np.broadcast_to(mask, (2, 3, 3)),
                np.broadcast_to(want, (2, 3, 3)),
            )


def test_ece_of_no_examples_is_nan():
    # Returned 0.0: "perfectly calibrated" for an empty evaluation set.
    ece = evaluation.expected_calibration_error(
        np.zeros((0, 3)), np.zeros((0,), "int64")
    )
    assert np.isnan(ece)


@pytest.mark.parametrize("labels", [[0, 3], [-1, 0], [0, 0.5], ["0", "1"]])
def test_ece_rejects_labels_outside_the_classes(labels):
    # Labels that name no class (1-based labels, -1/1 binary labels) were
    # silently counted as wrong predictions.
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])  # classes 0..2
    with pytest.raises(
        ValueError, match=r"`labels` must be integers in \[0, 3\).*Received"
    ):
        evaluation.expected_calibration_error(probs, np.array(labels))


def test_ece_binary_labels_as_floats_still_accepted():
    p1 = np.array([[0.9], [0.2]])
    got = evaluation.expected_calibration_error(p1, np.array([1.0, 0.0]))
    want = evaluation.expected_calibration_error(p1, np.array([1, 0]))
    assert got == pytest.approx(want)


def test_explained_away_fraction_does_not_drop_keys_with_nan_weights():
    # A valid key whose column held NaN was taken for padding and left out:
    # 1 of 2 keys reported instead of NaN over 3 keys.
    weights = np.zeros((1, 1, 2, 3))
    weights[0, 0, :, 0] = 1.0
    weights[0, 0, 0, 1] = np.nan
    assert np.isnan(evaluation.explained_away_fraction(weights))
    mask = np.array([[True, True, False]])
    assert np.isnan(evaluation.explained_away_fraction(weights, mask))
    # NaN in a padded key's column or a padded query's row does not count.
    weights = np.zeros((1, 1, 2, 3))
    weights[0, 0, :, 0] = 1.0
    weights[0, 0, :, 2] = np.nan
    assert evaluation.explained_away_fraction(weights, mask) == 0.5
    weights = np.zeros((1, 1, 2, 2))
    weights[0, 0, 0, 0] = 1.0
    weights[0, 0, 1] = np.nan
    query_mask = np.array([[True, False]])
    frac = evaluation.explained_away_fraction(weights, query_mask=query_mask)
    assert frac == 0.5


@pytest.mark.parametrize("epsilon", [0.0, -1.0, "1e-8", float("nan")])
def test_explained_away_fraction_rejects_a_bad_epsilon(epsilon):
    # A negative epsilon silently gave 0.0; a string a NumPy ufunc error.
    with pytest.raises(ValueError, match=r"`epsilon` must be .*Received"):
        evaluation.explained_away_fraction(
            np.ones((1, 1, 2, 2)) / 2, epsilon=epsilon
        )
