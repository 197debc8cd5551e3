import numpy as np
import pytest

from keras_attnvariants.ops import receptive_field as rf


def test_receptive_fields_rejects_no_layers():
    # An empty list failed with an IndexError.
    with pytest.raises(ValueError, match="attentions"):
        rf.receptive_fields([])


def test_precision_recall_rejects_mismatched_shapes():
    # Mismatched fields and dependencies failed inside the backend's
    # multiply (or broadcast silently) instead of naming the arguments.
    with pytest.raises(ValueError, match="predicted.*target"):
        rf.precision_recall(np.ones((1, 2, 2), bool), np.ones((1, 2, 3), bool))
    with pytest.raises(ValueError, match="predicted.*target"):
        rf.precision_recall(np.ones((1, 3, 3), bool), np.ones((2, 3, 3), bool))
