import keras
import numpy as np
import pytest

from keras_attnvariants.analysis import interpretability as interp


def test_gradient_importance_rejects_logits_without_a_class_axis():
    # A (B,) output (e.g. a squeezed binary logit) made `max(axis=-1)` take
    # the max over the batch: only one example got a gradient, the others
    # silently got importance 0.
    w = np.arange(1.0, 7.0, dtype="float32").reshape(2, 3)
    h0 = np.ones((2, 2, 3), "float32")

    def predict(h):
        return keras.ops.einsum("btd,td->b", h, w)

    with pytest.raises(ValueError, match=r"predict.*\(batch, classes\)"):
        interp.gradient_importance(predict, h0)
    # With a class axis every example gets its own gradient.
    got = interp.gradient_importance(lambda h: predict(h)[:, None], h0)
    want = np.broadcast_to(np.linalg.norm(w, axis=-1), (2, 2))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_gradient_importance_rejects_a_predict_that_is_not_callable():
    # Swapped arguments failed with "object is not callable" in the tape.
    h0 = np.ones((2, 2, 3), "float32")
    with pytest.raises(ValueError, match=r"`predict` must be a function"):
        interp.gradient_importance(h0, h0)


def test_attention_importance_rejects_no_layers():
    # An empty list returned the scalar 0.0 instead of (B, S) scores.
    with pytest.raises(ValueError, match="attentions"):
        interp.attention_importance([])
