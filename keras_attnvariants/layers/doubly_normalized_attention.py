"""`DoublyNormalizedAttention`: attention that does not explain away."""

import keras
from keras import ops

from keras_attnvariants.layers.variant_attention import VariantAttention
from keras_attnvariants.ops.combine import doubly_normalized_attend
from keras_attnvariants.ops.masking import large_negative
from keras_attnvariants.ops.normalization import doubly_normalize
from keras_attnvariants.ops.normalization import doubly_normalized_bias
from keras_attnvariants.validation import check_int


def fused_biased_attention(layer, query, key, value, mask, bias):
    """`dot_product_attention` with an additive bias; empty rows give 0.

    Under JAX a masked or biased call asks for no flash kernel: keras's
    JAX TPU kernel (keras 3.15, `backend/jax/nn.py`) drops `bias` and
    applies the mask of the first batch element to every element, which
    would silently turn DNAS into softmax attention without padding. The
    JAX fallback (`jax.nn.dot_product_attention`, XLA) honors both.

    Under float16 the kernel runs in float32 (`kernel_inputs`), like
    `attention_logits`: float16 logits (and the DNAS bias
    `-logsumexp_i s_ij`) overflow above 65504 and lose the precision the
    bias needs long before that (a 35% output error at logits near 2e4,
    NaN above 65504). Callers that also compute the bias upcast first, so
    that its gradient and the kernel's meet in float32.

    Returns:
        `(B, T, N, H)` in `value`'s dtype.
    """
    out_dtype = value.dtype
    query, key, value = kernel_inputs(query, key, value)
    kernel_mask = mask
    if bias is not None:
        bias = ops.cast(bias, query.dtype)
        if mask is not None:
            # Some backends take a bias or a mask, not both: fold it in.
            bias = ops.where(mask, bias, large_negative(query.dtype))
            kernel_mask = None
    flash = None
    if keras.config.backend() == "jax" and (
        bias is not None or kernel_mask is not None
    ):
        flash = False
    elif keras.config.backend() == "torch":
        # PyTorch's `scaled_dot_product_attention` picks its flash kernel
        # itself where it applies; keras's check for it (`flash=None`)
        # cannot be traced by torch.compile, which then broke the graph
        # of every HNAS call (Keras 3.15).
        flash = False
    output = ops.dot_product_attention(
        query,
        key,
        value,
        bias=bias,
        mask=kernel_mask,
        scale=layer._inverse_sqrt_key_dim,
        flash_attention=flash,
    )
    output = ops.cast(output, out_dtype)
    if mask is None:
        return output
    # row_valid: (B, T, 1, 1); fused kernels spread empty rows uniformly.
    row_valid = ops.transpose(
        ops.any(mask, axis=-1, keepdims=True), (0, 2, 1, 3)
    )
    return ops.where(row_valid, output, ops.zeros_like(output))


def kernel_inputs(query, key, value):
    """`query`, `key`, `value`, cast to float32 if they are float16.

    The DNAS bias and the kernel both read the queries and keys, and the
    two gradients they send back nearly cancel (each grows with the logits,
    their sum does not). Cast once, before both, they are summed in
    float32; cast in each branch, each was rounded to float16 on its own,
    and logits near 1e5 gave `inf - inf = NaN` gradients.
    """
    if keras.backend.standardize_dtype(query.dtype) != "float16":
        return query, key, value
    return tuple(ops.cast(t, "float32") for t in (query, key, value))


def fused_kernel_takes(key, value):
    """Whether `ops.dot_product_attention` takes these inputs.

    JAX's (`jax.nn.dot_product_attention`) needs `value_dim == key_dim` and
    raised for any other. Keras 3.15's kernel computes float64 inputs to
    float32 accuracy on JAX and PyTorch (errors near 1e-7 where the explicit
    path's are near 1e-16; gradients off by up to 1.5e-3 with large
    logits): a float64 layer asked for float64. The layers then use the
    explicit path.
    """
    if keras.backend.standardize_dtype(value.dtype) == "float64":
        return False
    return keras.config.backend() != "jax" or value.shape[-1] == key.shape[-1]


def key_bias(layer, query, key, mask):
    """DNAS bias `(B, N, 1, S)` from the projected queries and keys."""
    return doubly_normalized_bias(layer.attention_logits(query, key), mask)


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class DoublyNormalizedAttention(VariantAttention):
    """Doubly-normalized attention (DNAS): no key is explained away.

    A drop-in `keras.layers.MultiHeadAttention` whose weights normalize each
    key over the queries first, then each query over the keys (paper
    Algorithm 1):

    `xi_ij = exp(s_ij) / sum_i exp(s_ij)`,
    `A_ij = xi_ij / sum_j xi_ij`, with `s = Q K^T / sqrt(H)`.

    Equivalently `A = softmax_j(s_ij - logsumexp_i s_ij)`: softmax attention
    plus a per-key bias. Every valid key receives a total attention
    `sum_i A_ij >= 1 / S` (Theorem 2). With `iterations > 1` the two steps
    repeat (Sinkhorn) toward a doubly stochastic matrix.

    DNAS is not causal: a key's normalization sees every query, future ones
    included, so `use_causal_mask=True` raises. Padded queries must be masked
    (a Keras mask on the query, an `attention_mask` with padded rows, or
    `self_attention_padding=True` with a key-only mask), otherwise they take
    part in the keys' normalization.

    Args:
        num_heads: int. Number of attention heads.
        key_dim: int. Size of each head for query and key.
        iterations: int >= 1. Sinkhorn iterations; 1 is the paper's DNAS.
            Defaults to `1`.
        attention_losses: list of `AttentionLoss`. Defaults to `None`.
        self_attention_padding: bool. Treat keys that no query may attend as
            padded queries too (self-attention). Defaults to `False`.
        attention_path: `"auto"`, `"explicit"` or `"fused"`. Defaults to
            `"auto"`.
        **kwargs: every other `keras.layers.MultiHeadAttention` argument
            (see `VariantAttention`).

    Call arguments:
        Those of `keras.layers.MultiHeadAttention`.

    Returns:
        `attention_output` of shape `(B, T, dim)` and, with
        `return_attention_scores=True`, the weights used `(B, N, T, S)`.

    Example:

    >>> import numpy as np
    >>> import keras_attnvariants as kav
    >>> layer = kav.DoublyNormalizedAttention(num_heads=2, key_dim=4)
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> out, weights = layer(x, x, return_attention_scores=True)
    >>> tuple(out.shape), tuple(weights.shape)
    ((2, 5, 8), (2, 2, 5, 5))

    Reference:
        Ding, Soricut et al., "Attention that does not Explain Away", 2020.
    """

    supports_causal = False
    causal_error_reason = (
        "each key is normalized over all queries, including future ones, so "
        "DNAS cannot be masked causally or computed with a KV cache."
    )

    def __init__(self, num_heads, key_dim, iterations=1, **kwargs):
        iterations = check_int("iterations", iterations)
        super().__init__(num_heads=num_heads, key_dim=key_dim, **kwargs)
        self.iterations = iterations

    def normalize(self, scores, mask):
        return doubly_normalize(scores, mask, self.iterations)

    def normalize_and_attend(self, scores, value, mask, training):
        if self.iterations != 1 or self._normalize_overridden():
            return None
        keep = self._dropout_keep(scores, training)
        return doubly_normalized_attend(scores, value, mask, keep)

    def _folds_dropout(self):
        return True

    def fused_attention(self, query, key, value, mask):
        if self.iterations != 1 or not fused_kernel_takes(key, value):
            return None
        out_dtype = value.dtype
        query, key, value = kernel_inputs(query, key, value)
        bias = key_bias(self, query, key, mask)
        output = fused_biased_attention(self, query, key, value, mask, bias)
        return ops.cast(output, out_dtype)

    def get_config(self):
        config = super().get_config()
        config["iterations"] = self.iterations
        return config
