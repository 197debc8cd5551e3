"""The thesis's interpretability metric (Kinley 2020, section 5.4).

Per example, Kendall's tau between two importance scores of the input
tokens: the attention each token receives, summed over layers, heads and
queries, and the gradient norm `||d y_hat / d h^0_i||` of the predicted
class's logit with respect to the token's input embedding.
"""

import keras
import numpy as np
from keras import ops
from scipy import stats


def attention_importance(attentions, mask=None):
    """`(B, S)` attention received by each token, summed over everything.

    Args:
        attentions: list of per-layer weights `(B, N, T, S)` (or
            `(B, T, S)`).
        mask: optional `(B, S)` booleans; padded tokens get 0.

    Returns:
        float32 NumPy array `(B, S)`.
    """
    total = 0.0
    for z in attentions:
        z = np.asarray(ops.convert_to_numpy(ops.cast(z, "float32")))
        axes = tuple(range(1, z.ndim - 1))
        total = total + z.sum(axis=axes)
    if mask is not None:
        total = np.where(mask, total, 0.0)
    return total.astype("float32")


def gradient_importance(predict, embeddings):
    """`(B, T)` norms `||d y_hat / d h^0_i||` (TensorFlow backend).

    Args:
        predict: function mapping embeddings `(B, T, D)` to logits
            `(B, C)`; `y_hat` is the logit of each example's argmax class.
        embeddings: `(B, T, D)` input embeddings `h^0`.

    Returns:
        float32 NumPy array `(B, T)`.
    """
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "`gradient_importance` needs the TensorFlow backend. "
            f"Received: backend={keras.backend.backend()!r}"
        )
    import tensorflow as tf

    h0 = tf.convert_to_tensor(embeddings, "float32")
    with tf.GradientTape() as tape:
        tape.watch(h0)
        logits = tf.cast(predict(h0), "float32")
        best = tf.reduce_max(logits, axis=-1)
        total = tf.reduce_sum(best)
    grads = tape.gradient(total, h0)
    return tf.norm(grads, axis=-1).numpy().astype("float32")


def kendall_tau(first, second, mask=None):
    """Per-example Kendall tau between two `(B, T)` token scores.

    Args:
        first, second: `(B, T)` arrays.
        mask: optional `(B, T)` booleans: only valid tokens are ranked.

    Returns:
        float64 NumPy array `(B,)`; NaN where a score is constant.
    """
    first, second = np.asarray(first), np.asarray(second)
    if first.shape != second.shape or first.ndim != 2:
        raise ValueError(
            "`first` and `second` must both be (batch, tokens). Received: "
            f"first.shape={first.shape}, second.shape={second.shape}"
        )
    mask = np.ones(first.shape, bool) if mask is None else np.asarray(mask)
    taus = []
    for a, b, m in zip(first, second, mask):
        taus.append(stats.kendalltau(a[m], b[m]).statistic)
    return np.array(taus, "float64")
