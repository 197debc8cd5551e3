"""The thesis's interpretability metric (Kinley 2020, section 5.4).

Per example, Kendall's tau between two importance scores of the input
tokens: the attention each token receives, summed over layers, heads and
queries, and the gradient norm `||d y_hat / d h^0_i||` of the predicted
class's logit with respect to the token's input embedding.
"""

import keras
import numpy as np
from keras import ops

from keras_attnvariants.evaluation import as_numpy
from keras_attnvariants.evaluation import key_attention_totals
from keras_attnvariants.ops.receptive_field import layer_list


def attention_importance(attentions, mask=None, query_mask=None):
    """`(B, S)` attention received by each token, summed over everything.

    Args:
        attentions: list (or tuple) of per-layer weights `(B, N, T, S)`
            (or `(B, T, S)`), all with the same batch `B` and keys `S`, or
            the layers stacked `(L, B, N, T, S)`;
            for one layer pass `[weights]` (a single array raises
            `ValueError`: iterated, it gave the examples as layers).
        mask: optional `(B, S)` booleans; padded tokens get 0.
        query_mask: optional `(B, T)` booleans, valid queries: the rows of
            padded queries are left out of the sum (in self-attention, pass
            the same padding mask as `mask`).

    Returns:
        float32 NumPy array `(B, S)`.
    """
    attentions = layer_list(attentions)
    total = 0.0
    for z in attentions:
        z = as_numpy(ops.cast(z, "float32"))
        if mask is not None and np.shape(mask) != (z.shape[0], z.shape[-1]):
            raise ValueError(
                f"`mask` must be ({z.shape[0]}, {z.shape[-1]}) booleans for "
                f"attentions of shape {z.shape}. "
                f"Received: mask.shape={np.shape(mask)}"
            )
        if z.ndim == 3:
            z = z[:, None]  # one head
        # (B, N, S) totals over the valid queries, summed over heads.
        total = total + key_attention_totals(z, query_mask=query_mask).sum(1)
    if mask is not None:
        total = np.where(as_numpy(mask, bool), total, 0.0)
    return np.asarray(total, "float32")


def gradient_importance(predict, embeddings):
    """`(B, T)` norms `||d y_hat / d h^0_i||`, on every backend.

    Args:
        predict: function mapping embeddings `(B, T, D)` to logits
            `(B, C)` (e.g. a Keras model from embeddings, called in
            inference mode); `y_hat` is the logit of each example's argmax
            class.
        embeddings: `(B, T, D)` input embeddings `h^0`.

    Returns:
        float32 NumPy array `(B, T)`.

    Raises:
        ValueError: for a `predict` that is not callable, embeddings not
            `(B, T, D)` or logits not `(B, C)`.
    """
    if not callable(predict):
        # It failed with "'...' object is not callable" inside the tape.
        raise ValueError(
            "`predict` must be a function (e.g. a Keras model) from "
            "embeddings `(B, T, D)` to logits `(B, C)`. Received: "
            f"predict={predict!r}"
        )
    h0 = as_numpy(embeddings, "float32")
    if h0.ndim != 3:
        raise ValueError(
            "`embeddings` must be (batch, tokens, features). "
            f"Received: embeddings.shape={h0.shape}"
        )

    def best_logits(h):
        # Each example's gradient is that of its own top logit: the examples
        # are independent, so the sum's gradient holds all of them.
        logits = ops.cast(predict(h), "float32")
        if len(logits.shape) != 2:
            # A (B,) output would make the max below run over the batch.
            raise ValueError(
                "`predict` must return logits `(batch, classes)`. "
                f"Received: shape={tuple(logits.shape)}"
            )
        return ops.sum(ops.amax(logits, axis=-1))

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        h = tf.convert_to_tensor(h0)
        with tf.GradientTape() as tape:
            tape.watch(h)
            total = best_logits(h)
        # Logits that do not depend on the embeddings have zero gradients
        # (as on JAX), not `None`.
        grads = tape.gradient(
            total, h, unconnected_gradients=tf.UnconnectedGradients.ZERO
        ).numpy()
    elif backend == "jax":
        import jax

        grads = np.asarray(jax.grad(best_logits)(h0))
    elif backend == "torch":
        import torch

        # On Keras's device (a GPU where there is one), as the model's
        # weights are: `torch.tensor(h0)` would stay on the CPU.
        h = ops.convert_to_tensor(h0).detach().requires_grad_(True)
        grads = np.zeros_like(h0)
        with torch.enable_grad():
            total = best_logits(h)
            # Logits that do not depend on the embeddings have no graph:
            # their gradients are zero (as on JAX). `autograd.grad`, not
            # `backward`: the model's parameters keep their `.grad` (a
            # diagnostic between `backward` and an optimizer step must not
            # add to the update).
            if total.requires_grad:
                (grad,) = torch.autograd.grad(total, h, allow_unused=True)
                if grad is not None:
                    grads = ops.convert_to_numpy(grad)
    else:
        raise ValueError(
            "`gradient_importance` needs the TensorFlow, JAX or PyTorch "
            f"backend. Received: backend={backend!r}"
        )
    return np.linalg.norm(grads, axis=-1).astype("float32")


def kendall_tau(first, second, mask=None):
    """Per-example Kendall tau between two `(B, T)` token scores.

    Tau-b (scipy's default), which corrects for ties: ties are common in
    attention totals (e.g. argmax attention) and equal gradient norms.

    Args:
        first, second: `(B, T)` arrays.
        mask: optional `(B, T)` booleans: only valid tokens are ranked.

    Returns:
        float64 NumPy array `(B,)`; NaN where a score is constant or fewer
        than two tokens are valid.
    """
    first, second = as_numpy(first), as_numpy(second)
    if first.shape != second.shape or first.ndim != 2:
        raise ValueError(
            "`first` and `second` must both be (batch, tokens). Received: "
            f"first.shape={first.shape}, second.shape={second.shape}"
        )
    if mask is None:
        mask = np.ones(first.shape, bool)
    elif np.shape(mask) != first.shape:
        raise ValueError(
            f"`mask` must be {first.shape} booleans like `first`. "
            f"Received: mask.shape={np.shape(mask)}"
        )
    # Imported here: scipy.stats takes 0.6-0.9 s to import, in every
    # process that imports this package, most of which never rank.
    from scipy import stats

    taus = []
    for a, b, m in zip(first, second, as_numpy(mask, bool)):
        # scipy warns on fewer than two samples; the answer is NaN anyway.
        tau = stats.kendalltau(a[m], b[m]).statistic if m.sum() > 1 else np.nan
        taus.append(tau)
    return np.array(taus, "float64")
