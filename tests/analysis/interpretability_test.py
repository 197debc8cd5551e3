import itertools

import keras
import numpy as np
import pytest
from scipy import stats

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


def test_gradient_importance_refuses_embeddings_without_a_token_axis():
    # `(B, D)` embeddings returned a `(B,)` array without the check.
    with pytest.raises(ValueError, match="`embeddings` must be"):
        interp.gradient_importance(lambda e: e * 2.0, np.ones((2, 3)))


def test_gradient_importance_through_a_keras_model():
    # Every backend (it was TensorFlow only): a model with attention, its
    # gradients against central finite differences of the top logit.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 6))
    x = keras.layers.MultiHeadAttention(2, 3)(inputs, inputs)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    h0 = np.random.default_rng(3).normal(size=(2, 4, 6))

    def top(h):
        return keras.ops.convert_to_numpy(model(h.astype("float32")))

    best = top(h0).argmax(-1)
    step = 1e-2
    want = np.zeros((2, 4, 6))
    for index in np.ndindex(4, 6):
        shift = np.zeros_like(h0)
        shift[(slice(None), *index)] = step
        up, down = top(h0 + shift), top(h0 - shift)
        rows = np.arange(2)
        want[(slice(None), *index)] = (up[rows, best] - down[rows, best]) / (
            2 * step
        )
    got = interp.gradient_importance(lambda h: model(h), h0)
    np.testing.assert_allclose(
        got, np.linalg.norm(want, axis=-1), rtol=2e-2, atol=1e-3
    )


def test_kendall_tau_integer_mask_and_ties():
    # A 0/1 mask selects tokens; it must not index positions 1, 1, 1, 0, 0.
    rng = np.random.default_rng(3)
    a, b = rng.random((2, 5)), rng.random((2, 5))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    np.testing.assert_allclose(
        interp.kendall_tau(a, b, mask), interp.kendall_tau(a, b, mask > 0)
    )
    # Ties: tau-b, as scipy's default.
    a, b = np.array([[1.0, 1.0, 2.0, 3.0]]), np.array([[1.0, 2.0, 3.0, 4.0]])
    want = stats.kendalltau(a[0], b[0], variant="b").statistic
    np.testing.assert_allclose(interp.kendall_tau(a, b), [want])
    with pytest.raises(ValueError, match="mask"):
        interp.kendall_tau(a, b, np.ones((2, 4), bool))


def test_attention_importance_drops_padded_queries():
    z = np.random.default_rng(4).random((2, 3, 4, 4))
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    got = interp.attention_importance([z], mask, query_mask=mask)
    want = (z * mask[:, None, :, None]).sum(axis=(1, 2)) * mask
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ValueError, match="mask"):
        interp.attention_importance([z], mask[:, :3])


def test_kendall_tau_nan_for_fewer_than_two_tokens():
    a = np.array([[0.3, 0.1, 0.2]])
    mask = np.array([[True, False, False]])
    assert np.isnan(interp.kendall_tau(a, a, mask)).all()
