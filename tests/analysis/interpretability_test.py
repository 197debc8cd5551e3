import itertools

import keras
import numpy as np
import pytest

from keras_attnvariants.analysis import interpretability as interp


def np_tau(a, b):
    """Reference tau-a for untied data: (concordant - discordant) / pairs."""
    pairs = list(itertools.combinations(range(len(a)), 2))
    score = sum(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) for i, j in pairs)
    return score / len(pairs)


def test_attention_importance_sums_layers_heads_queries():
    z = np.random.default_rng(0).random((2, 3, 4, 4))
    got = interp.attention_importance([z, 2 * z])
    np.testing.assert_allclose(got, 3 * z.sum(axis=(1, 2)), rtol=1e-5)
    masked = interp.attention_importance(
        [z], np.array([[1, 1, 0, 0]] * 2, bool)
    )
    assert (masked[:, 2:] == 0).all()


def test_kendall_tau_matches_reference_and_mask():
    rng = np.random.default_rng(1)
    a, b = rng.random((3, 6)), rng.random((3, 6))
    got = interp.kendall_tau(a, b)
    np.testing.assert_allclose(got, [np_tau(x, y) for x, y in zip(a, b)])
    mask = np.ones((3, 6), bool)
    mask[:, 4:] = False
    got = interp.kendall_tau(a, b, mask)
    np.testing.assert_allclose(
        got, [np_tau(x[:4], y[:4]) for x, y in zip(a, b)]
    )
    with pytest.raises(ValueError, match="first"):
        interp.kendall_tau(a, b[:, :3])


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tape")
def test_gradient_importance_of_a_linear_model():
    # logits = sum_t h_t @ W_t: the gradient at token t is row W_t[:, c*].
    rng = np.random.default_rng(2)
    w = rng.normal(size=(4, 3, 5)).astype("float32")  # (T, D, C)
    h0 = rng.normal(size=(2, 4, 3)).astype("float32")

    def predict(h):
        return keras.ops.einsum("btd,tdc->bc", h, w)

    got = interp.gradient_importance(predict, h0)
    best = np.einsum("btd,tdc->bc", h0, w).argmax(-1)
    want = np.linalg.norm(w[:, :, best].transpose(2, 0, 1), axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
