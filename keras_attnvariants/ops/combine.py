"""Attention outputs with the normalization folded into the value product.

The layers' explicit path, when nobody asks for the weights: it computes
`out = normalize(scores) @ value` for the normalizations of this package
without writing the normalized weights as a `(B, N, T, S)` buffer, and with
an analytic backward that needs fewer passes over the scores.

Every normalization here has weights `A = e * inv`: row exponentials `e`
(`exp(y - max_j y)`, masked entries 0) times a per-row reciprocal of their
sum. So

- forward: `out = inv * (e @ V)`: `e` is the matmul operand;
- backward, flash-attention style (Dao et al., 2022): with `dO` the output
  gradient, `g = dO V^T` and `dV = A^T dO`,
  `sum_j g_ij A_ij = dO_i . O_i` (row sums) and
  `sum_i g_ij A_ij = V_j . dV_j` (column sums), products of
  `(B, T, N, H)` tensors instead of reductions over the scores. Under
  float16 / bfloat16 values `O` and `dV` are rounded, so the sums are taken
  from `g` and the float32 weights instead (`_half`).

On XLA:CPU an elementwise expression feeding a reduction is always written
out as a full buffer, so these sums are what the layers' step time is made
of (docs/benchmarks.md). The gradients equal the autodiff of
`normalize(scores) @ value` (tests/ops/combine_test.py).

Layouts are Keras MultiHeadAttention's: scores `(B, N, T, S)` (float32;
float64 ones compute in float64), value `(B, S, N, H)`, output `(B, T, N,
H)` in the value's dtype. Masks are boolean `(B, 1, T, S)` (or
broadcastable), `True` = may attend; masked entries get weight 0 and a
query with no valid key outputs 0.
"""

import keras
import numpy as np
from keras import ops

from keras_attnvariants.ops.gumbel import argmax_indices
from keras_attnvariants.ops.gumbel import gather_values
from keras_attnvariants.ops.gumbel import relaxed_logits
from keras_attnvariants.ops.gumbel import rows_with_valid_key
from keras_attnvariants.ops.gumbel import scatter_values
from keras_attnvariants.ops.gumbel import selection_logits
from keras_attnvariants.ops.normalization import _column_log_normalizer
from keras_attnvariants.ops.normalization import _prepare
from keras_attnvariants.ops.normalization import _reduce_to_shape
from keras_attnvariants.ops.normalization import custom_gradient_of
from keras_attnvariants.ops.normalization import row_max

COMBINE_EQUATION = "bnts,bsnh->btnh"
# `A^T dO` written with `dO` first: TensorFlow's XLA lowers the other operand
# order with the scores' contracting axis on the left, a transposed-operand
# matmul that measured 2x slower (26 ms against 13 ms at (8, 4, 512, 512)).
VALUE_GRAD_EQUATION = "btnh,bnts->bsnh"
SCORES_EQUATION = "btnh,bsnh->bnts"


def _upstream(args, upstream):
    return args[0] if upstream is None else upstream


def _output_layout(t):
    """`(B, N, T, 1)` per-row values in the output layout `(B, T, N, 1)`."""
    return ops.transpose(t, (0, 2, 1, 3))


def _masked_row_exp(y, mask):
    """`e = exp(y - max_j y)` (0 where masked), `1 / sum_j e`, `max_j y`.

    The maximum is over the valid keys: masked entries hold `MASK_FILL`,
    and valid ones can lie below it (Gumbel logits divided by a low
    temperature), which would make every `e` of the row underflow to 0. A
    row without a valid key has `e = 0` and a reciprocal of 1, so its
    weights and output are 0. (`ops.normalization._row_exp` sums before
    masking and returns the sum; here the sum is over valid keys only.)
    """
    if mask is None:
        top = row_max(y)
    else:
        top = row_max(ops.where(mask, y, -np.inf))
        top = ops.where(top > -np.inf, top, 0.0)
    e = ops.exp(y - top)
    if mask is not None:
        e = ops.where(mask, e, 0.0)
    total = ops.sum(e, axis=-1, keepdims=True)
    inv = 1.0 / ops.where(total > 0.0, total, 1.0)
    return e, inv, top


class _Rows:
    """Weights `A = e * inv` as a matmul operand and a row scale.

    float16 cannot hold `e @ V` (up to `S max|V|`), so under float16 the
    operand is the normalized `A` itself; otherwise it is `e` and `inv`
    scales the product's rows.
    """

    def __init__(self, e, inv, dtype, keep=None):
        self.e = e
        self.inv = inv
        # Dropout multiplies the operand only: column sums take `A` itself.
        dropped = e if keep is None else e * keep
        if keras.backend.standardize_dtype(dtype) == "float16":
            self.operand = ops.cast(dropped * inv, dtype)
            self.scale = None
        else:
            self.operand = ops.cast(dropped, dtype)
            self.scale = ops.cast(_output_layout(inv), dtype)

    def _scaled(self, t):
        return t if self.scale is None else t * self.scale

    def product(self, value):
        """`A V`, `(B, T, N, H)`."""
        return self._scaled(ops.einsum(COMBINE_EQUATION, self.operand, value))

    def transposed_product(self, d_out):
        """`A^T dO`, `(B, S, N, H)`."""
        scaled = self._scaled(d_out)
        return ops.einsum(VALUE_GRAD_EQUATION, scaled, self.operand)

    def column_sums(self, row):
        """`sum_i A_ij row_i`, `(B, N, 1, S)`, for `row` `(B, N, T, 1)`."""
        return _column_weighted(self.e, self.inv * row)


def _column_weighted(t, row):
    """`sum_i t_ij row_i` `(B, N, 1, S)` for `row` `(B, N, T, 1)`.

    A matrix-vector product: it reads `t` without writing a full buffer.
    """
    return ops.expand_dims(ops.einsum("bnts,bnt->bns", t, row[..., 0]), -2)


def _half(dtype):
    """Whether `dtype` is float16 or bfloat16.

    The backwards take the row sums `sum_j g_ij A_ij` as `dO . O` (and the
    column sums as `V . dV`), an `H`-long dot instead of an `S`-long one.
    In half precision `O` and `dV` are rounded, so those sums no longer
    match `g = dO V^T`: in a saturated row `A (g - r)` left about
    `eps |g|` where it cancels to 0, and a low Gumbel temperature scales
    it up (relaxed Gumbel at temperature 0.01 under `mixed_bfloat16`:
    input gradients 0.38 off, query-kernel gradients 45x their size).
    There the sums are taken from `g` and the float32 weights themselves.
    """
    return keras.backend.standardize_dtype(dtype) in ("float16", "bfloat16")


def _row_dot(d_out, out, dtype):
    """`sum_h dO * O` in the scores' `dtype`: `sum_j g_ij A_ij`,
    `(B, N, T, 1)`."""
    dot = ops.sum(ops.cast(d_out, dtype) * ops.cast(out, dtype), -1)
    return ops.expand_dims(ops.transpose(dot, (0, 2, 1)), -1)


def _column_dot(value, d_value, dtype):
    """`sum_h V * dV` in the scores' `dtype`: `sum_i g_ij A_ij`,
    `(B, N, 1, S)`."""
    dot = ops.sum(ops.cast(value, dtype) * ops.cast(d_value, dtype), axis=-1)
    return ops.expand_dims(ops.transpose(dot, (0, 2, 1)), -2)


def _scores_upstream(d_out, value, dtype):
    """`g = dO V^T` in the scores' `dtype` (float32, float64 for float64
    scores: a float64 Gumbel layer keeps float32 logits beside float64
    values, and mixing the two failed in its backward pass),
    `(B, N, T, S)`."""
    g = ops.einsum(SCORES_EQUATION, d_out, value)
    return ops.cast(g, dtype)


def _dropped(g, keep):
    """The weights' upstream `g` through the dropout multipliers."""
    return g if keep is None else g * keep


def _multipliers(keep, dtype="float32"):
    """`keep` as a tensor of `dtype` (a NumPy array too), or `None`."""
    return None if keep is None else ops.convert_to_tensor(keep, dtype)


def _row_softmax_attend(scores, value, mask, column_step, keep=None):
    """`(softmax_j(y) * keep) @ value`, `y = s` or, with `column_step`,
    DNAS's `y = s - logsumexp_i s` (the column step's gradient is added).

    With dropout multipliers `keep` (`K`), `O = (A K) V`: the weights'
    upstream is `g K`, and the flash identities still hold with `O` and
    `dV = (A K)^T dO`: `sum_j g K A = dO . O`, `sum_i g K A = V . dV`.
    """
    x, mask = _prepare(scores, mask)
    keep = _multipliers(keep, x.dtype)

    def attend(x, value, mask, keep):
        y = x
        if column_step:
            y = x - _column_log_normalizer(x, mask is not None)
        e, inv, top = _masked_row_exp(y, mask)
        rows = _Rows(e, inv, value.dtype, keep)
        out = rows.product(value)

        def grad(*args, upstream=None):
            d_out = _upstream(args, upstream)
            d_value = rows.transposed_product(d_out)
            g = _dropped(_scores_upstream(d_out, value, x.dtype), keep)
            half = _half(value.dtype)
            if half:
                ga = g * e * inv
                r = ops.sum(ga, axis=-1, keepdims=True)
            else:
                r = _row_dot(d_out, out, x.dtype)
            if not column_step:
                return e * inv * (g - r), d_value
            if half:
                c = ops.sum(ga, axis=-2, keepdims=True)
            else:
                c = _column_dot(value, d_value, x.dtype)
            col = c - rows.column_sums(r)
            return e * (inv * (g - r) - ops.exp(top) * col), d_value

        return out, grad

    return custom_gradient_of(attend, (x, value), (mask, keep))


def softmax_attend(scores, value, mask=None, keep=None):
    """`masked_softmax(scores, mask) @ value` with the folded backward.

    Args:
        scores: float32 `(B, N, T, S)`; masked entries may hold anything.
        value: `(B, S, N, H)`.
        mask: optional boolean, broadcastable to `scores`.
        keep: optional float32 dropout multipliers broadcastable to
            `scores` (0 for a dropped weight, `1 / (1 - rate)` for a kept
            one, see `ops.noise.dropout_multipliers`): the output is then
            `(weights * keep) @ value`, still without writing the weights.

    Returns:
        `(B, T, N, H)` in `value`'s dtype.
    """
    return _row_softmax_attend(scores, value, mask, False, keep)


def doubly_normalized_attend(scores, value, mask=None, keep=None):
    """`doubly_normalize(scores, mask) @ value` (one iteration), folded.

    With `z = s - c`, `c_j = logsumexp_i s_ij`, `A = softmax_j(z)` and
    `dz = A (g - r)`, `r_i = sum_j g_ij A_ij = dO_i . O_i`, the scores'
    gradient is `dz - xi * colsum(dz)` with `xi = exp(z) = e exp(max_j z)`
    and `colsum(dz)_j = V_j . dV_j - sum_i A_ij r_i`.

    Args:
        scores: float32 `(B, N, T, S)`.
        value: `(B, S, N, H)`.
        mask: optional boolean, broadcastable to `scores`; padded queries
            must be masked (their rows `False`).
        keep: optional dropout multipliers, as in `softmax_attend`.

    Returns:
        `(B, T, N, H)` in `value`'s dtype.
    """
    return _row_softmax_attend(scores, value, mask, True, keep)


def _per_head_mix(mix, num_heads, dtype="float32"):
    """`mix` as `(N, 1, 1)` of `dtype`; `ValueError` for any other shape."""
    mix = ops.cast(mix, dtype)
    shape = tuple(mix.shape)
    if shape not in ((), (num_heads, 1, 1), (1, 1, 1)):
        raise ValueError(
            "`mix` must be a scalar or one value per head shaped "
            f"(num_heads, 1, 1) = ({num_heads}, 1, 1). "
            f"Received: mix with shape {shape}"
        )
    return ops.broadcast_to(ops.reshape(mix, (-1, 1, 1)), (num_heads, 1, 1))


def hybrid_attend(scores, value, mix, mask=None, keep=None):
    """`hybrid_normalize(scores, mix, mask) @ value` (one iteration), folded.

    `W = (1 - u) U + u D` multiplies the values once. The backward needs
    the row sums `sum_j g U`, `sum_j g D` and the column sums
    `sum_i g D` (for DNAS's column step); of each pair, one comes free
    from the output (`sum_j g W = dO . O`, `sum_i g W = V . dV`), the other
    from one pass over `g * E`, with `E` the row exponentials of the
    larger share (`U` where `u > 1/2`, else `D`), so that recovering the
    other part divides by `max(u, 1 - u) >= 1/2`.

    Args:
        scores: float32 `(B, N, T, S)`.
        value: `(B, S, N, H)`.
        mix: the DNAS share `u` in `[0, 1]`: a scalar or one value per head
            shaped `(N, 1, 1)` (differentiable).
        mask: optional boolean, broadcastable to `scores`.
        keep: optional dropout multipliers, as in `softmax_attend` (they
            multiply `W`; the sums above then hold with `g K` for `g`).

    Returns:
        `(B, T, N, H)` in `value`'s dtype.
    """
    num_heads = scores.shape[1]
    x, mask = _prepare(scores, mask)
    mix = _per_head_mix(mix, num_heads, x.dtype)
    keep = _multipliers(keep, x.dtype)

    def attend(x, value, mix, mask, keep):
        e_u, inv_u, _ = _masked_row_exp(x, mask)
        z = x - _column_log_normalizer(x, mask is not None)
        e_d, inv_d, top = _masked_row_exp(z, mask)
        mixed = (1.0 - mix) * inv_u * e_u + mix * inv_d * e_d
        weights = ops.cast(_dropped(mixed, keep), value.dtype)
        out = ops.einsum(COMBINE_EQUATION, weights, value)

        def grad(*args, upstream=None):
            d_out = _upstream(args, upstream)
            d_value = ops.einsum(VALUE_GRAD_EQUATION, d_out, weights)
            g = _dropped(_scores_upstream(d_out, value, x.dtype), keep)
            # Row and column sums of g * W: (B, N, T, 1), (B, N, 1, S).
            if _half(value.dtype):
                gw = g * mixed
                r_w = ops.sum(gw, axis=-1, keepdims=True)
                c_w = ops.sum(gw, axis=-2, keepdims=True)
            else:
                r_w = _row_dot(d_out, out, x.dtype)
                c_w = _column_dot(value, d_value, x.dtype)
            # Per head, the part with the larger share: U (u > 1/2) or D.
            use_u = mix > 0.5
            inv = ops.where(use_u, inv_u, inv_d)
            product = g * ops.where(use_u, e_u, e_d)
            r_sel = inv * ops.sum(product, axis=-1, keepdims=True)
            c_sel = _column_weighted(product, inv)
            # r_w = (1 - u) r_u + u r_d; likewise for the column sums.
            big_u = ops.where(use_u, mix, 1.0)
            big_1mu = ops.where(use_u, 1.0, 1.0 - mix)
            r_u = ops.where(use_u, r_sel, (r_w - mix * r_sel) / big_1mu)
            r_d = ops.where(use_u, (r_w - (1.0 - mix) * r_sel) / big_u, r_sel)
            # u * sum_i D (g - r_d), the column step's correction.
            u_c_d = ops.where(use_u, c_w - (1.0 - mix) * c_sel, mix * c_sel)
            col = u_c_d - mix * _column_weighted(e_d, inv_d * r_d)
            dx = (1.0 - mix) * inv_u * e_u * (g - r_u) + e_d * (
                mix * inv_d * (g - r_d) - ops.exp(top) * col
            )
            d_mix = _reduce_to_shape(r_d - r_u, (num_heads, 1, 1))
            return dx, d_value, d_mix

        return out, grad

    # `_per_head_mix` runs outside the custom gradient: autodiff maps the
    # `(N, 1, 1)` gradient back to the caller's shape of `mix`.
    return custom_gradient_of(attend, (x, value, mix), (mask, keep))


def relaxed_gumbel_attend(
    scores, value, noise, temperature=1.0, mask=None, keep=None
):
    """`relaxed_sample(scores, noise, temperature, mask) @ value`, folded.

    The relaxed Gumbel-softmax sample is a softmax of
    `(s + g) / temperature`; this is `softmax_attend` on those logits, so
    the sample's weights are never written out.

    Args:
        scores: float32 `(B, N, T, S)`.
        value: `(B, S, N, H)`.
        noise: float32 Gumbel noise broadcastable to `scores`.
        temperature: float > 0 or a scalar tensor.
        mask: optional boolean, broadcastable to `scores`.
        keep: optional dropout multipliers, as in `softmax_attend`.

    Returns:
        `(B, T, N, H)` in `value`'s dtype.
    """
    logits = relaxed_logits(scores, noise, temperature, mask)
    return softmax_attend(logits, value, mask, keep)


def straight_through_gumbel_attend(
    scores, value, noise, temperature=1.0, mask=None
):
    """`straight_through(relaxed_sample(...)) @ value`, folded.

    Forward: each query reads the value row of its sample's argmax key (a
    gather, no `S`-long weighted sum), exactly as the one-hot weights do.
    Backward: the relaxed sample's gradient, `dy = A (g - sum_j g A)` with
    `A = softmax(y)` and `g = dO V^T`, and `dV = H^T dO` for the one-hot
    `H`, which is what autodiff of `(H + A - stop_gradient(A)) @ V` gives;
    `H^T dO` is a segment sum of the rows of `dO` by picked key
    (`scatter_values`), not an `S`-long matmul with the one-hot weights.
    Arguments and result as in `relaxed_gumbel_attend`.
    """
    logits = relaxed_logits(scores, noise, temperature, mask)
    y, mask = _prepare(logits, mask)

    def attend(y, value, mask):
        indices = argmax_indices(selection_logits(y, mask))
        row_valid = rows_with_valid_key(mask, indices)
        out = gather_values(value, indices, row_valid)

        def grad(*args, upstream=None):
            d_out = _upstream(args, upstream)
            d_value = scatter_values(
                d_out, indices, ops.shape(value), row_valid
            )
            e, inv, _ = _masked_row_exp(y, mask)
            weighted = _scores_upstream(d_out, value, y.dtype) * e
            r = ops.sum(weighted, axis=-1, keepdims=True)
            return inv * (weighted - e * (inv * r)), d_value

        return out, grad

    return custom_gradient_of(attend, (y, value), (mask,))
