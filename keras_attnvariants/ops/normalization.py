"""Attention normalizations: masked softmax, doubly-normalized, hybrid.

Pure functions on `keras.ops`. Scores are `(..., T, S)`: queries on axis -2,
keys on axis -1. Everything runs in float32 (float64 for float64 scores) and
is cast back to the scores' dtype. Masked entries are exactly 0; fully
masked rows or columns give zeros, never NaN.
"""

import keras
import numpy as np
from keras import ops

from keras_attnvariants.ops.masking import MASK_FILL
from keras_attnvariants.validation import check_broadcastable
from keras_attnvariants.validation import check_int
from keras_attnvariants.validation import check_unit_float
from keras_attnvariants.validation import is_python_value
from keras_attnvariants.validation import static_shape


def math_dtype(dtype):
    """The dtype the normalizations compute in for inputs of `dtype`:
    float64 for float64, float32 for everything else (half types are
    raised to float32)."""
    if keras.backend.standardize_dtype(dtype) == "float64":
        return "float64"
    return "float32"


def _torch_differentiates_backward():
    """Whether a PyTorch backward runs under `create_graph=True`.

    `torch.autograd.Function.backward` runs with gradients enabled exactly
    then. Always False on the other backends, whose custom gradients trace
    the forward with its graph (TensorFlow, JAX: second derivatives are
    right there without a recomputation).
    """
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.is_grad_enabled()


def custom_gradient_of(function, inputs, constants=()):
    """`ops.custom_gradient(function)(*inputs)`, with `constants` passed in.

    `function(*inputs, *constants)` returns `(output, grad)` as an
    `ops.custom_gradient` function does, and `grad` the gradients of
    `inputs` only. `constants` are tensors that get no gradient (masks,
    dropout multipliers) or `None`. A custom-gradient function must take
    them as inputs rather than close over them: a closed-over tensor
    becomes a constant of JAX's traced body, and JAX's shape-polymorphic
    export (`model.export` on JAX, through jax2tf) fails on a constant of
    symbolic shape ("Symbolic dimension comparison ... is inconclusive").
    """
    given = tuple(c for c in constants if c is not None)
    count = len(inputs)

    def forward(args):
        passed = iter(args[count:])
        full = tuple(None if c is None else next(passed) for c in constants)
        return function(*args[:count], *full)

    @ops.custom_gradient
    def wrapped(*args):
        output, grad = forward(args)

        def wrapped_grad(*grad_args, upstream=None):
            if _torch_differentiates_backward():
                # PyTorch runs the forward under `no_grad`, so what `grad`
                # closes over (exponentials, row sums, the output) is a
                # constant to a second differentiation, and a Hessian or
                # a gradient penalty came out silently wrong (off by up to
                # 2x). `grad_args` are the saved inputs, still in their
                # graph: recompute the forward from them, with gradients
                # on, only when the backward is itself differentiated
                # (`create_graph=True`).
                grads = forward(grad_args)[1](*grad_args, upstream=upstream)
            else:
                grads = grad(*grad_args, upstream=upstream)
            if not isinstance(grads, (tuple, list)):
                grads = (grads,)
            return (*grads, *(None,) * len(given))

        return output, wrapped_grad

    return wrapped(*inputs, *given)


def as_scores(scores, name="scores"):
    """`scores` as a tensor (array-likes such as lists converted; integer
    and bool ones as float32), with `ValueError` for fewer than 2 axes
    `(..., T, S)`."""
    if not hasattr(scores, "dtype"):
        scores = ops.convert_to_tensor(scores)
    if not keras.backend.is_float_dtype(scores.dtype):
        # The weights were cast back to it: all zeros for integer scores.
        scores = ops.cast(scores, "float32")
    shape = static_shape(scores)
    if shape is not None and len(shape) < 2:
        raise ValueError(
            f"`{name}` must have shape (..., T, S). "
            f"Received: {name} with shape {shape}"
        )
    return scores


def _prepare(scores, mask, name="scores"):
    """Float32 (float64 for float64) scores with masked entries at
    `MASK_FILL`, plus the mask.

    `ValueError` for a mask whose static shape does not broadcast to the
    scores (the backend's `BroadcastTo` failed on it)."""
    x = ops.cast(scores, math_dtype(scores.dtype))
    if mask is None:
        return x, None
    check_broadcastable(
        "mask", static_shape(mask), static_shape(x), f"`{name}`"
    )
    mask = ops.broadcast_to(ops.cast(mask, "bool"), ops.shape(x))
    return ops.where(mask, x, MASK_FILL), mask


def _column_log_normalizer(x, masked):
    """`logsumexp` over queries (axis -2), 0 for columns with no valid query.

    Setting the normalizer of a fully masked column to 0 keeps its entries at
    `MASK_FILL`; subtracting its logsumexp would lift them back to about
    `-log T` and let a padded key receive attention again.
    """
    c = ops.logsumexp(x, axis=-2, keepdims=True)
    if masked:
        c = ops.where(c < 0.5 * MASK_FILL, 0.0, c)
    return c


def _apply_mask(weights, mask):
    return weights if mask is None else ops.where(mask, weights, 0.0)


def _softmax32(x, mask):
    return _apply_mask(ops.softmax(x, axis=-1), mask)


def statically_empty(*tensors):
    """True if a size known when tracing is 0 in one of `tensors` (an
    empty batch or sequence, which keras MHA serves)."""
    return any(0 in tuple(t.shape) for t in tensors)


def row_max(x):
    """`max_j x` over the last axis, kept: `(..., T, 1)`.

    `ops.max` raises on an empty tensor in eager mode: a statically empty
    `x` gets `-inf` rows instead. (Not `ops.max(..., initial=-inf)`: on
    PyTorch it builds the initial tensor on the CPU, which a CUDA `x`
    cannot be compared with, and a TensorFlow graph with a dynamic empty
    size reduces to `-inf` without help.)
    """
    if statically_empty(x):
        return ops.full((*ops.shape(x)[:-1], 1), float("-inf"), x.dtype)
    # `ops.amax`, not `ops.max`: the same reduction, but PyTorch's
    # `ops.max` reads `result.values`, which torch.compile cannot trace.
    return ops.amax(x, axis=-1, keepdims=True)


def _row_exp(x):
    """`e = exp(x - max_j x)`, its row sums and row maxima `(..., T, 1)`."""
    top = row_max(x)
    e = ops.exp(x - top)
    return e, ops.sum(e, axis=-1, keepdims=True), top


def _softmax_parts(x):
    """Row softmax of `x` and its row `logsumexp` `(..., T, 1)`."""
    e, total, top = _row_exp(x)
    return e / total, top + ops.log(total)


def _dnas_parts(x, mask):
    """DNAS weights and `exp` of their row log normalizer.

    `z = x - c` (column step), `A = softmax_j(z)`. The column-normalized
    matrix `xi = exp(z)` is `A * exp(r)`, `r = logsumexp_j z <= log S`, so
    the backward pass gets it with a multiply instead of another `exp`.
    """
    z = x - _column_log_normalizer(x, mask is not None)
    weights, r = _softmax_parts(z)
    return _apply_mask(weights, mask), ops.exp(r)


def _softmax_grad(weights, upstream):
    """`d softmax`: `A * (g - sum_j g A)`, row-wise."""
    inner = ops.sum(upstream * weights, axis=-1, keepdims=True)
    return weights * (upstream - inner)


def _dnas_grad(dz, weights, row_scale):
    """Gradient through the column step: `dz - xi * sum_i dz`.

    `c_j = logsumexp_i x_ij` has `dc_j / dx_ij = xi_ij`, so
    `dx = dz - xi * colsum(dz)` with `xi = weights * row_scale`.
    """
    return dz - weights * row_scale * ops.sum(dz, axis=-2, keepdims=True)


def _reduce_to_shape(t, shape):
    """Sums `t` over the axes that broadcasting expanded from `shape`."""
    extra = len(t.shape) - len(shape)
    if extra:
        t = ops.sum(t, axis=tuple(range(extra)))
    axes = tuple(
        axis
        for axis, size in enumerate(shape)
        if size == 1 and t.shape[axis] != 1
    )
    if axes:
        t = ops.sum(t, axis=axes, keepdims=True)
    return ops.reshape(t, shape)


def _doubly_normalize_once(x, mask):
    """One-iteration DNAS with an analytic backward.

    Autodiff of the log-space formula keeps the column `logsumexp`
    intermediates and reruns both `exp`s; the analytic form needs only the
    weights and a per-row scale, and two reductions over the scores.
    """

    def dnas(x, mask):
        weights, row_scale = _dnas_parts(x, mask)

        def grad(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            dz = _softmax_grad(weights, upstream)
            return _dnas_grad(dz, weights, row_scale)

        return weights, grad

    return custom_gradient_of(dnas, (x,), (mask,))


def _row_exp_parts(x):
    """`e = exp(x - max_j x)` and `1 / sum_j e`: `softmax_j(x) = e * inv`.

    Keeping the pair instead of the softmax lets XLA fuse the (cheap)
    multiply into every consumer instead of storing the normalized weights
    as one more `(B, N, T, S)` buffer.
    """
    e, total, top = _row_exp(x)
    return e, 1.0 / total, top


def _hybrid_once(x, mix, mask):
    """One-iteration HNAS, both normalizations in one analytic backward.

    `W = U + u (D - U)`. With `g` the upstream gradient:
    `dx = (1 - u) U (g - sum_j g U) + dD - xi colsum(dD)`, where
    `dD = u D (g - sum_j g D)`, and
    `du = sum (g D) - sum (g U)` summed to the shape of `u` (for a `u`
    constant along keys; the general form is used otherwise).

    `U` and `D` are kept as row-exponentials times per-row reciprocals
    (`_row_exp_parts`), not as normalized buffers.
    """
    mix_shape = tuple(mix.shape)
    per_key = bool(mix_shape) and mix_shape[-1] != 1

    def hybrid(x, mix, mask):
        e_unas, inv_unas, _ = _row_exp_parts(x)
        z = x - _column_log_normalizer(x, mask is not None)
        e_dnas, inv_dnas, z_top = _row_exp_parts(z)

        def parts():
            unas = _apply_mask(e_unas * inv_unas, mask)
            dnas = _apply_mask(e_dnas * inv_dnas, mask)
            return unas, dnas

        unas, dnas = parts()
        weights = unas + mix * (dnas - unas)

        def grad(*args, upstream=None):
            g = args[0] if upstream is None else upstream
            unas, dnas = parts()
            if per_key:
                du = _softmax_grad(unas, (1.0 - mix) * g)
                dz = _softmax_grad(dnas, mix * g)
                dmix = g * (dnas - unas)
            else:
                # A mix constant along keys leaves the row sums shared.
                g_unas = ops.sum(g * unas, axis=-1, keepdims=True)
                g_dnas = ops.sum(g * dnas, axis=-1, keepdims=True)
                du = (1.0 - mix) * unas * (g - g_unas)
                dz = mix * dnas * (g - g_dnas)
                dmix = g_dnas - g_unas
            # xi = exp(z) = e_dnas * exp(z_top), masked.
            xi = _apply_mask(e_dnas * ops.exp(z_top), mask)
            dx = du + dz - xi * ops.sum(dz, axis=-2, keepdims=True)
            return dx, _reduce_to_shape(dmix, mix_shape)

        return weights, grad

    return custom_gradient_of(hybrid, (x, mix), (mask,))


def _doubly_normalize32(x, mask, iterations):
    masked = mask is not None
    if iterations == 1:
        return _doubly_normalize_once(x, mask)
    for step in range(iterations):
        # Column step: normalize each key over its valid queries.
        x = x - _column_log_normalizer(x, masked)
        if step + 1 < iterations:
            # Row step in log space; the last one is the softmax below.
            x = x - ops.logsumexp(x, axis=-1, keepdims=True)
            if masked:
                x = ops.where(mask, x, MASK_FILL)
    return _softmax32(x, mask)


def masked_softmax(scores, mask=None):
    """Softmax over keys (axis -1) with a boolean mask.

    Args:
        scores: tensor (or array-like) of shape `(..., T, S)`.
        mask: optional boolean tensor broadcastable to `scores`, `True` =
            may attend (`ValueError` if its static shape is not).

    Returns:
        Weights of the shape and dtype of `scores` (float32 for integer
        scores). Masked entries are 0 and a query row with no valid key
        is all zeros.
    """
    scores = as_scores(scores)
    x, mask = _prepare(scores, mask)
    return ops.cast(_softmax32(x, mask), scores.dtype)


def doubly_normalize(scores, mask=None, iterations=1):
    """Doubly-normalized attention weights (DNAS, Algorithm 1).

    Each key is first normalized over its valid queries,
    `xi_ij = exp(s_ij) / sum_i exp(s_ij)`, then each query over its valid
    keys, `A_ij = xi_ij / sum_j xi_ij`. In log space this is
    `A = softmax_j(s_ij - logsumexp_i s_ij)`. With `iterations > 1` the two
    steps repeat (Sinkhorn, paper Eq. 10), approaching a doubly stochastic
    matrix.

    Args:
        scores: tensor (or array-like) of shape `(..., T, S)`.
        mask: optional boolean tensor broadcastable to `scores`, `True` =
            may attend (`ValueError` if its static shape is not). Padded
            queries must be masked here (their rows `False`) so they take
            no part in any key's normalization.
        iterations: int >= 1. Sinkhorn iterations; 1 is the paper's DNAS.

    Returns:
        Weights of the shape and dtype of `scores` (float32 for integer
        scores): each valid row sums to 1 and every valid key's column
        sums to at least `1 / S_valid`
        (Theorem 2). Masked entries, rows with no valid key and columns with
        no valid query are 0.
    """
    iterations = check_int("iterations", iterations)
    scores = as_scores(scores)
    x, mask = _prepare(scores, mask)
    return ops.cast(_doubly_normalize32(x, mask, iterations), scores.dtype)


def _check_mix(mix, scores_shape):
    """`ValueError` for a `mix` outside `[0, 1]` or of a shape that does
    not broadcast to the scores.

    Python and NumPy numbers, lists and NumPy arrays are checked by value
    (not booleans, nan or strings); tensors and variables by their static
    shape only (a trained mix is the layer's to keep in range).
    """
    if is_python_value(mix):
        check_unit_float("mix", mix)
        return
    if isinstance(mix, (list, tuple, np.ndarray)):
        values = np.asarray(mix)
        if values.dtype.kind not in "iuf" or not np.all(
            (values >= 0.0) & (values <= 1.0)
        ):
            raise ValueError(
                f"`mix` must hold floats in [0, 1]. Received: mix={mix!r}"
            )
    check_broadcastable("mix", static_shape(mix), scores_shape, "`scores`")


def hybrid_normalize(scores, mix, mask=None, iterations=1):
    """Hybrid attention weights (HNAS, paper Eq. 12).

    `mix * doubly_normalize(scores) + (1 - mix) * masked_softmax(scores)`.

    Args:
        scores: tensor (or array-like) of shape `(..., T, S)`.
        mix: float in `[0, 1]`, or a tensor broadcastable to `scores`
            with values in `[0, 1]`, e.g. one value per head shaped
            `(N, 1, 1)`. Python and NumPy numbers and arrays are checked
            by value (`ValueError` outside `[0, 1]`, for nan and
            booleans); tensors by their static shape only.
        mask: optional boolean mask, as in `doubly_normalize`.
        iterations: Sinkhorn iterations of the doubly-normalized part.

    Returns:
        Weights of the shape and dtype of `scores` (float32 for integer
        scores).
    """
    iterations = check_int("iterations", iterations)
    scores = as_scores(scores)
    _check_mix(mix, static_shape(scores))
    x, mask = _prepare(scores, mask)
    mix = ops.cast(mix, x.dtype)
    if iterations == 1:
        return ops.cast(_hybrid_once(x, mix, mask), scores.dtype)
    dnas = _doubly_normalize32(x, mask, iterations)
    unas = _softmax32(x, mask)
    weights = unas + mix * (dnas - unas)
    return ops.cast(weights, scores.dtype)


def doubly_normalized_bias(scores, mask=None):
    """The per-key bias that turns softmax into DNAS: `-logsumexp_i s_ij`.

    `softmax_j(s_ij + b_j)` with `b = doubly_normalized_bias(s, mask)` equals
    `doubly_normalize(s, mask)` on valid entries, so DNAS can run through
    fused `keras.ops.dot_product_attention(..., bias=b)` kernels.

    Args:
        scores: tensor (or array-like) of shape `(..., T, S)`.
        mask: optional boolean mask broadcastable to `scores`.

    Returns:
        tensor of shape `(..., 1, S)` (float32, float64 for float64
        scores); 0 for keys with no valid query.
    """
    x, mask = _prepare(as_scores(scores), mask)
    return -_column_log_normalizer(x, mask is not None)
