"""Independent NumPy implementations the tests compare against.

Written directly from the papers (probabilities, not log space), in float64.
"""

import numpy as np


def _exp_shifted(s, mask, axis):
    """`exp(s)` on valid entries, 0 elsewhere, each slice along `axis`
    shifted by its own valid maximum (the normalization over that axis
    removes the shift). One global shift underflowed whole columns whose
    logits sat ~1000 below the rest."""
    top = np.where(mask, s, -np.inf).max(axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return np.where(mask, np.exp(np.where(mask, s - top, 0.0)), 0.0)


def softmax_attention(scores, mask=None):
    """Masked softmax over keys; rows with no valid key are zero."""
    s = np.asarray(scores, np.float64)
    mask = (
        np.ones_like(s, bool)
        if mask is None
        else np.broadcast_to(mask, s.shape)
    )
    z = _exp_shifted(s, mask, -1)
    row = z.sum(-1, keepdims=True)
    return np.where(row > 0, z / np.where(row > 0, row, 1), 0.0)


def doubly_normalized_attention(scores, mask=None, iterations=1):
    """Paper Algorithm 1, step 4 (and Eq. 10 for more iterations)."""
    s = np.asarray(scores, np.float64)
    mask = (
        np.ones_like(s, bool)
        if mask is None
        else np.broadcast_to(mask, s.shape)
    )
    # The first normalization is over queries: shift each key's column.
    pi = _exp_shifted(s, mask, -2)
    for _ in range(iterations):
        col = pi.sum(-2, keepdims=True)
        xi = np.where(col > 0, pi / np.where(col > 0, col, 1), 0.0)
        row = xi.sum(-1, keepdims=True)
        pi = np.where(row > 0, xi / np.where(row > 0, row, 1), 0.0)
    return pi


def hybrid_attention(scores, mix, mask=None):
    """Paper Eq. 12."""
    return mix * doubly_normalized_attention(scores, mask) + (
        1 - mix
    ) * softmax_attention(scores, mask)


def multi_head_attention(layer, query, value, normalize, mask=None):
    """MHA forward pass with the layer's weights and a given normalization.

    Args:
        layer: a built `keras.layers.MultiHeadAttention` (default axes).
        query: `(B, T, D)`; value: `(B, S, D)` (also used as key).
        normalize: function of `(scores (B, N, T, S), mask)` -> weights.
        mask: boolean `(B, T, S)` or `None`.

    Returns:
        `(output (B, T, D), weights (B, N, T, S))`.
    """
    wq, bq = (np.asarray(w) for w in layer._query_dense.weights)
    wk, bk = (np.asarray(w) for w in layer._key_dense.weights)
    wv, bv = (np.asarray(w) for w in layer._value_dense.weights)
    wo, bo = (np.asarray(w) for w in layer._output_dense.weights)
    q = np.einsum("btd,dnh->btnh", query, wq) + bq
    k = np.einsum("bsd,dnh->bsnh", value, wk) + bk
    v = np.einsum("bsd,dnh->bsnh", value, wv) + bv
    scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    weights = normalize(
        scores, None if mask is None else np.asarray(mask)[:, None]
    )
    context = np.einsum("bnts,bsnh->btnh", weights, v)
    return np.einsum("btnh,nhd->btd", context, wo) + bo, weights


def fmix32(x):
    """MurmurHash3's 32-bit finalizer on NumPy uint32 (wrapping)."""
    x = np.asarray(x, np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = (x.astype(np.uint64) * 0x85EBCA6B % 2**32).astype(np.uint32)
    x = x ^ (x >> np.uint32(13))
    x = (x.astype(np.uint64) * 0xC2B2AE35 % 2**32).astype(np.uint32)
    return x ^ (x >> np.uint32(16))


def positional_uniform(key, shape):
    """The counter-based uniforms of `ops.gumbel.positional_uniform`,
    computed on unsigned 32-bit words: two row words `a`, `b` hashed from
    the key with two salts and chained over the leading axes, each index
    `i` of axis `x` entering as `c = fmix32(i * 0x9E3779B9 + x + 1)`; the
    last axis gives `fmix32(a ^ c * (b | 1))`; then the top 24 bits,
    centred."""

    def coordinates(size, axis):
        index = np.arange(size, dtype=np.uint64)
        return fmix32((index * 0x9E3779B9 + axis + 1) % 2**32)

    key = np.uint32(key % 2**32)
    row_a = fmix32(key ^ np.uint32(0x243F6A88))
    row_b = fmix32(key ^ np.uint32(0x85A308D3))
    if len(shape) == 0:
        h = row_a
    else:
        for axis, size in enumerate(shape[:-1]):
            c = coordinates(size, axis)
            row_a = fmix32(row_a[..., None] ^ c)
            row_b = fmix32(row_b[..., None] ^ c)
        last = coordinates(shape[-1], len(shape) - 1).astype(np.uint64)
        odd = (row_b[..., None] | np.uint32(1)).astype(np.uint64)
        product = (last * odd % 2**32).astype(np.uint32)
        h = fmix32(row_a[..., None] ^ product)
    return ((np.asarray(h) >> np.uint32(8)).astype(np.float64) + 0.5) / 2**24
