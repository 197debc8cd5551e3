import numpy as np
import pytest

from keras_attnvariants import evaluation


def test_ece_perfectly_calibrated_and_overconfident():
    # 10 predictions at confidence 0.8 with 8 correct: calibrated.
    probs = np.tile([[0.8, 0.2]], (10, 1))
    labels = np.array([0] * 8 + [1] * 2)
    assert evaluation.expected_calibration_error(
        probs, labels
    ) == pytest.approx(0.0, abs=1e-12)
    # Same confidence, half correct: gap 0.3.
    labels = np.array([0] * 5 + [1] * 5)
    assert evaluation.expected_calibration_error(
        probs, labels
    ) == pytest.approx(0.3)


def test_ece_matches_hand_computation_over_two_bins():
    probs = np.array([[0.95, 0.05], [0.9, 0.1], [0.4, 0.6], [0.45, 0.55]])
    labels = np.array([0, 1, 1, 0])
    # bins (15): 0.95 and 0.9 -> bin 14 and 13; 0.6 -> 9; 0.55 -> 8.
    want = 0.25 * (0.05 + 0.9 + 0.4 + 0.55)
    got = evaluation.expected_calibration_error(probs, labels)
    assert got == pytest.approx(want)


def test_ece_rejects_bad_shapes():
    with pytest.raises(ValueError, match="probabilities"):
        evaluation.expected_calibration_error(np.ones(3), np.ones(3))


def test_explained_away_fraction_counts_valid_keys_only():
    weights = np.zeros((1, 1, 2, 4))
    weights[0, 0, :, 0] = 1.0  # every query attends key 0 only
    mask = np.array([[True, True, True, False]])
    frac = evaluation.explained_away_fraction(weights, mask)
    assert frac == pytest.approx(2 / 3)
    assert evaluation.explained_away_fraction(weights) == pytest.approx(3 / 4)


def test_ece_binary_probabilities_of_the_positive_class():
    # A sigmoid output (n, 1) is P(class 1), not a one-class softmax.
    p1 = np.array([0.9, 0.9, 0.1, 0.1, 0.7])
    labels = np.array([1, 1, 0, 1, 0])
    want = evaluation.expected_calibration_error(
        np.stack([1 - p1, p1], -1), labels
    )
    got = evaluation.expected_calibration_error(p1[:, None], labels)
    assert got == pytest.approx(want)


def test_ece_rejects_one_hot_labels_and_bad_num_bins():
    probs = np.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match="labels"):
        evaluation.expected_calibration_error(probs, np.eye(3))
    with pytest.raises(ValueError, match="num_bins=0"):
        evaluation.expected_calibration_error(probs, np.zeros(3), num_bins=0)


def test_ece_rejects_logits():
    with pytest.raises(ValueError, match="probabilities"):
        evaluation.expected_calibration_error(
            np.array([[2.0, -1.0]]), np.array([0])
        )


def test_explained_away_fraction_rejects_rank_3_weights():
    # (B, T, S) weights would broadcast a (B, S) mask to (B, B, S).
    with pytest.raises(ValueError, match="weights"):
        evaluation.explained_away_fraction(
            np.ones((2, 3, 3)) / 3, np.ones((2, 3), bool)
        )
    with pytest.raises(ValueError, match="key_mask"):
        evaluation.explained_away_fraction(
            np.ones((2, 1, 3, 3)) / 3, np.ones((2, 4), bool)
        )


def test_explained_away_fraction_drops_padded_queries():
    # Query 2 is padding; its row is uniform, the real queries attend key 0.
    weights = np.zeros((1, 1, 3, 3))
    weights[0, 0, :2, 0] = 1.0
    weights[0, 0, 2] = 1 / 3
    mask = np.array([[True, True, False]])
    assert evaluation.explained_away_fraction(weights, mask) == 0.0
    frac = evaluation.explained_away_fraction(weights, mask, query_mask=mask)
    assert frac == pytest.approx(1 / 2)
    totals = evaluation.key_attention_totals(weights, mask, query_mask=mask)
    np.testing.assert_allclose(totals[0, 0], [2.0, 0.0, np.nan])


def test_ece_bins_follow_the_documented_edges():
    # Bin b holds [b / num_bins, (b + 1) / num_bins). 0.57 * 100 rounds to
    # 56.99999999999999, so 0.57 used to share bin 56 with 0.565.
    probs = np.array([[0.57, 0.43], [0.565, 0.435]])
    labels = np.array([0, 1])
    want = 0.5 * (1 - 0.57) + 0.5 * 0.565  # two bins, one example each
    got = evaluation.expected_calibration_error(probs, labels, num_bins=100)
    assert got == pytest.approx(want)


def test_explained_away_fraction_nan_without_valid_keys():
    # No valid key: the mean of nothing warned (an error under pytest).
    weights = np.ones((1, 1, 2, 2))
    mask = np.zeros((1, 2), bool)
    assert np.isnan(evaluation.explained_away_fraction(weights, mask))


TORCH_TENSORS = """
import json
import torch
from keras_attnvariants.analysis import interpretability
from keras_attnvariants import evaluation
torch.manual_seed(0)
probs = torch.softmax(torch.randn(6, 3), -1).requires_grad_()
labels = torch.tensor([0, 1, 2, 0, 1, 2])
weights = torch.rand(2, 2, 4, 4, requires_grad=True)
mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
scores = torch.rand(2, 4, requires_grad=True)
print(json.dumps({
    "inputs": [probs.tolist(), labels.tolist(), weights.tolist(),
               mask.tolist(), scores.tolist()],
    "ece": evaluation.expected_calibration_error(probs, labels),
    "explained": evaluation.explained_away_fraction(
        weights, key_mask=mask, query_mask=mask, epsilon=0.5),
    "importance": interpretability.attention_importance(
        [weights], mask=mask, query_mask=mask).tolist(),
    "tau": interpretability.kendall_tau(
        scores, scores ** 2 - scores, mask=mask).tolist(),
}))
"""


def test_metrics_take_pytorch_tensors_that_need_gradients():
    # A PyTorch model's outputs need a gradient (or live on a GPU), and
    # `np.asarray` refuses both ("Can't call numpy() on Tensor that
    # requires grad"): the NumPy metrics convert them through Keras.
    from keras_attnvariants.analysis import interpretability
    from keras_attnvariants.testing.subprocesses import run_json_script

    got = run_json_script(TORCH_TENSORS, timeout=300, KERAS_BACKEND="torch")
    probs, labels, weights, mask, scores = (np.array(x) for x in got["inputs"])
    mask = mask.astype(bool)
    assert got["ece"] == pytest.approx(
        evaluation.expected_calibration_error(probs, labels)
    )
    assert got["explained"] == pytest.approx(
        evaluation.explained_away_fraction(
            weights, key_mask=mask, query_mask=mask, epsilon=0.5
        )
    )
    np.testing.assert_allclose(
        got["importance"],
        interpretability.attention_importance(
            [weights], mask=mask, query_mask=mask
        ),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        got["tau"],
        interpretability.kendall_tau(scores, scores**2 - scores, mask=mask),
    )


# Contracts a mutation sweep found untested.
def test_ece_counts_a_confidence_of_exactly_one_in_the_last_bin():
    # A confident mistake at 1.0 fell one past the last bin (unclipped)
    # and vanished: 0.15 instead of 0.65.
    probs = np.array([[0.0, 1.0], [0.7, 0.3]])
    assert evaluation.expected_calibration_error(
        probs, np.array([0, 0])
    ) == pytest.approx(0.65)
    # And a one-hot prediction (probability exactly 1) is accepted.
    assert evaluation.expected_calibration_error(
        np.array([[0.0, 1.0]]), np.array([1])
    ) == pytest.approx(0.0)


def test_explained_away_needs_a_total_strictly_below_epsilon():
    # Paper Def. 1: a key is explained away when its total is < epsilon.
    weights = np.array([[[[0.75, 0.25], [1.0, 0.0]]]])
    assert evaluation.explained_away_fraction(
        weights, epsilon=0.25
    ) == pytest.approx(0.0)
    assert evaluation.explained_away_fraction(
        weights, epsilon=0.2501
    ) == pytest.approx(0.5)
