"""Distances between point clouds: Sinkhorn OT, conditional transport, MMD.

Pure functions on `keras.ops`. Point clouds are `(..., n, d)` with optional
boolean point masks `(..., n)` (`True` = the point exists); masked points
get zero mass, so padding never moves a result. Everything runs in float32;
outputs are float32.
"""

import functools

import keras
import numpy as np
from keras import ops

from keras_attnvariants.ops import fused_sinkhorn
from keras_attnvariants.ops.masking import MASK_FILL
from keras_attnvariants.ops.normalization import statically_empty
from keras_attnvariants.validation import check_bool
from keras_attnvariants.validation import check_broadcastable
from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_int
from keras_attnvariants.validation import same_size
from keras_attnvariants.validation import static_shape
from keras_attnvariants.validation import static_sizes


def _point_mask(mask, shape, name="mask", of="the points"):
    """Boolean `(..., n)` mask, all `True` when `mask` is `None`.

    `ValueError` naming `name` for a mask whose static shape does not
    broadcast to `shape` (the backend's `BroadcastTo` failed on it); `of`
    words what the mask covers."""
    if mask is None:
        return ops.ones(shape, "bool")
    check_broadcastable(name, static_shape(mask), static_sizes(shape), of)
    return ops.broadcast_to(ops.cast(mask, "bool"), shape)


def _check_matrix(name, matrix):
    """`ValueError` for a static rank below 2 `(..., n, m)`."""
    shape = static_shape(matrix)
    if shape is not None and len(shape) < 2:
        raise ValueError(
            f"`{name}` must have shape (..., n, m). "
            f"Received: {name} with shape {shape}"
        )


def _pair_masks(matrix, row_mask, col_mask, name="cost"):
    """`(rows, cols, valid)` of a `(..., n, m)` matrix: boolean `(..., n)`,
    `(..., m)` and `(..., n, m)` (a valid row and a valid column)."""
    _check_matrix(name, matrix)
    shape = ops.shape(matrix)
    rows = _point_mask(
        row_mask, shape[:-1], "row_mask", f"the rows of `{name}`"
    )
    cols = _point_mask(
        col_mask,
        shape[:-2] + shape[-1:],
        "col_mask",
        f"the columns of `{name}`",
    )
    return rows, cols, ops.logical_and(rows[..., :, None], cols[..., None, :])


def _check_points(x, y):
    """`ValueError` unless point clouds `x` `(..., n, d)` and `y`
    `(..., m, d)` have the same feature size `d` and leading axes that
    broadcast together (static sizes)."""
    x_shape, y_shape = static_shape(x), static_shape(y)
    for name, shape in (("x", x_shape), ("y", y_shape)):
        if shape is not None and len(shape) < 2:
            raise ValueError(
                f"`{name}` must be points `(..., n, d)`. "
                f"Received: {name} with shape {shape}"
            )
    if x_shape is None or y_shape is None:
        return
    ok = same_size(x_shape[-1], y_shape[-1]) and all(
        a in (None, 1) or b in (None, 1) or a == b
        for a, b in zip(reversed(x_shape[:-2]), reversed(y_shape[:-2]))
    )
    if not ok:
        raise ValueError(
            "`y` must be points `(..., m, d)` with the feature size `d` "
            f"and the leading axes of `x`, shape {x_shape}. "
            f"Received: y with shape {y_shape}"
        )


def uniform_marginal(mask):
    """Mask-weighted uniform weights `(..., n)`: `1 / count` on valid points.

    A set with no valid point gets all-zero weights.
    """
    mask = ops.cast(mask, "float32")
    return mask / ops.maximum(ops.sum(mask, axis=-1, keepdims=True), 1.0)


def squared_euclidean_cost(x, y):
    """Pairwise `||x_i - y_j||^2`, `(..., n, m)`, float32, never negative.

    Both clouds are first moved by the mean of `x`'s points (the cost does
    not change): the expansion `|x|^2 + |y|^2 - 2 x.y` loses the distances
    to cancellation when the clouds sit far from the origin. Points must be
    finite: zero padded points first (or pass masks to the ops that take
    them).

    `ValueError` for points of different feature sizes (static shapes).
    """
    _check_points(x, y)
    x = ops.cast(x, "float32")
    y = ops.cast(y, "float32")
    x, y = _centered(x, y)
    return _expanded_distances(x, y)


def _centered(x, y, x_weights=None):
    """`x` and `y` moved by one vector per cloud pair: the mean of `x`'s
    points, weighted by `x_weights` `(..., n)` (summing to 1 or 0) if given.

    Distances keep their value (and, the cost being translation invariant,
    their gradient: the shift is gradient-free), but lose the cancellation
    of `|x|^2 + |y|^2 - 2 x.y` for clouds far from the origin: with spread
    0.05 at an offset of 100 the expanded cost was off by 86-162% (some
    entries exactly 0), and OT / MMD values drifted with the offset.
    """
    if x_weights is None:
        center = ops.mean(x, axis=-2, keepdims=True)
    else:
        center = ops.sum(x * x_weights[..., None], axis=-2, keepdims=True)
    center = ops.stop_gradient(center)
    return x - center, y - center


def _expanded_distances(x, y):
    """`||x_i - y_j||^2` `(..., n, m)` of float32 points, never negative,
    as `|x|^2 + |y|^2 - 2 x.y` (one matmul)."""
    x2 = ops.sum(ops.square(x), axis=-1)[..., :, None]
    y2 = ops.sum(ops.square(y), axis=-1)[..., None, :]
    xy = ops.einsum("...id,...jd->...ij", x, y)
    return ops.maximum(x2 + y2 - 2.0 * xy, 0.0)


def cosine_cost(x, y):
    """Pairwise `1 - cos(x_i, y_j)`, `(..., n, m)`, float32, in `[0, 2]`.

    `ValueError` for points of different feature sizes (static shapes).
    """
    _check_points(x, y)
    x = ops.cast(x, "float32")
    y = ops.cast(y, "float32")
    x = x / ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True) + 1e-12)
    y = y / ops.sqrt(ops.sum(ops.square(y), axis=-1, keepdims=True) + 1e-12)
    return 1.0 - ops.einsum("...id,...jd->...ij", x, y)


# The smallest `epsilon` of `sinkhorn_plan`: the float32 log kernel
# `-cost / epsilon` spans `1 / epsilon`, and the plan `exp(M + u + v)`
# loses the cancellation of its terms. With a normalized cost the column
# marginals (exact in exact arithmetic) were off by 1% at 1e-6, 5% at
# 1e-7; the plan summed to 2.2 at 1e-9, where valid entries also sank
# below the padding fill, and to 2e6 at 1e-10.
MIN_EPSILON = 1e-6


def check_epsilon(epsilon, floored=True):
    """`epsilon` as a float, `ValueError` unless finite, > 0 and, where
    `floored` (a normalized cost), >= 1e-6."""
    epsilon = check_float("epsilon", epsilon)
    if floored and epsilon < MIN_EPSILON:
        raise ValueError(
            f"`epsilon` must be a finite float >= {MIN_EPSILON} (a float32 "
            "log-domain Sinkhorn plan loses its marginals below it). "
            f"Received: epsilon={epsilon!r}"
        )
    return epsilon


def sinkhorn_plan(
    cost,
    epsilon=0.01,
    iterations=100,
    row_mask=None,
    col_mask=None,
    normalize_cost=True,
):
    """Entropic optimal transport plan, log-domain Sinkhorn.

    Solves `min_P sum_ij C_ij P_ij - epsilon * H(P)` subject to
    `P 1 = a`, `P^T 1 = b`, where `a` and `b` are uniform over the valid
    rows and columns. Runs a FIXED number of iterations (no data-dependent
    stopping, so it compiles under XLA and runs on TPU). Each iteration
    updates the log-scalings `u = log a - logsumexp_j(M_ij + v_j)`,
    `v = log b - logsumexp_i(M_ij + u_i)` with `M = -C / epsilon`; the plan
    is `exp(M + u + v)`. The first iteration runs as written; the others
    run the same updates multiplicatively on a kernel with the potentials
    absorbed, re-absorbed every 10 iterations (stabilized Sinkhorn), which
    needs one `exp` pass per 10 iterations instead of two `logsumexp`
    passes per iteration. The column marginals are exact after the last
    iteration; the row marginals converge (within 1e-3 after the default
    100 iterations on clouds of a few dozen points, see the tests). The
    convergence slows as `epsilon` shrinks (roughly `1 / epsilon`
    iterations): at `epsilon=1e-3` and 100 iterations, row marginals of
    32 x 32 clouds were 50-200% off; raise `iterations` with it.

    Args:
        cost: tensor `(..., n, m)`. A `+inf` entry forbids its pair (the
            plan is exactly 0 there, with or without `normalize_cost`); a
            row or column with no finite entry gets no mass (its
            marginal is then not met). A nan entry makes the plan nan.
        epsilon: float > 0. Entropic regularization, in units of the
            normalized cost when `normalize_cost=True`, where it must be
            >= 1e-6 (`MIN_EPSILON`; below it float32 loses the plan's
            marginals). With `normalize_cost=False` the same bound holds
            for `epsilon / max(cost)`, unchecked. Defaults to `0.01`
            (paper).
        iterations: int >= 1. Sinkhorn iterations. Defaults to `100`.
        row_mask: optional boolean `(..., n)`; `False` rows get no mass.
        col_mask: optional boolean `(..., m)`; `False` columns get no mass.
            `ValueError` for masks whose static shapes do not broadcast.
        normalize_cost: bool. Divide each cost matrix by its largest valid
            entry (a constant for the gradient) so that `epsilon` means
            the same at every scale. Defaults to `True`.

    Returns:
        float32 plan `(..., n, m)`, exactly 0 on masked rows and columns;
        its entries sum to 1 when any row and column is valid. An empty
        `cost` (an empty batch, no rows or no columns) gives an empty plan
        of its shape.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_attnvariants.ops.transport import sinkhorn_plan
    >>> plan = sinkhorn_plan(np.random.rand(4, 5).astype("float32"))
    >>> round(float(ops.sum(plan)), 4)
    1.0
    """
    return _plan(cost, epsilon, iterations, row_mask, col_mask, normalize_cost)


def _plan(
    cost,
    epsilon,
    iterations,
    row_mask,
    col_mask,
    normalize_cost,
    fused=False,
):
    """`sinkhorn_plan`; `fused=True` (a gradient-free `cost` only) lets a
    GPU program run the iterations in one kernel (`_fused_potentials`)."""
    # NumPy scalars accepted; nan and inf rejected (they gave a nan or a
    # uniform plan without a word).
    normalize_cost = check_bool("normalize_cost", normalize_cost)
    # The floor is in units of the normalized cost; a raw cost's own scale
    # sets what `epsilon` means (the fused kernel sees normalized costs).
    epsilon = check_epsilon(epsilon, floored=normalize_cost)
    iterations = check_int("iterations", iterations)
    cost = ops.cast(cost, "float32")
    # valid: (..., n, m)
    rows, cols, valid = _pair_masks(cost, row_mask, col_mask)
    if statically_empty(cost):
        # Nothing to transport; `ops.max` and JAX's `logsumexp` raise on
        # an empty tensor.
        return ops.zeros_like(cost)
    # A `+inf` cost forbids its pair (no mass), as with
    # `normalize_cost=False`: it took the normalizing scale to inf, and
    # `inf / inf` made the whole plan nan. A nan cost stays allowed, so
    # it shows in the plan instead of being dropped.
    allowed = ops.logical_and(valid, ops.not_equal(cost, np.inf))
    if normalize_cost:
        scale = ops.amax(
            ops.where(allowed, ops.abs(cost), 0.0),
            axis=(-2, -1),
            keepdims=True,
        )
        cost = cost / ops.stop_gradient(ops.maximum(scale, 1e-12))
    # log_kernel: (..., n, m); masked and forbidden pairs at MASK_FILL.
    log_kernel = ops.where(allowed, -cost / epsilon, MASK_FILL)
    if fused:
        u, v = _fused_potentials(log_kernel, rows, cols, iterations)
    else:
        u, v = _potentials(log_kernel, rows, cols, iterations)
    plan = ops.exp(log_kernel + u[..., :, None] + v[..., None, :])
    return ops.where(allowed, plan, 0.0)


def _potentials(log_kernel, rows, cols, iterations):
    """The Sinkhorn potentials `(u, v)`, `(..., n)` and `(..., m)`.

    One exact log-domain iteration from `u = v = 0`, then the remaining
    ones in blocks with the potentials absorbed into the kernel."""
    a = uniform_marginal(rows)
    b = uniform_marginal(cols)
    log_a = ops.where(rows, ops.log(a + 1e-30), MASK_FILL)
    log_b = ops.where(cols, ops.log(b + 1e-30), MASK_FILL)
    u = log_a - ops.logsumexp(log_kernel, axis=-1)
    v = log_b - ops.logsumexp(log_kernel + u[..., :, None], axis=-2)
    full_blocks, last_block = divmod(iterations - 1, _ABSORB_EVERY)
    if full_blocks:
        constants = (log_kernel, a, b, rows, cols)
        u, v = _fori_with_constants(
            full_blocks, _absorbed_iterations, (u, v), constants
        )
    if last_block:
        u, v = _absorbed_iterations(
            (u, v), log_kernel, a, b, rows, cols, last_block
        )
    return u, v


def _fused_potentials(log_kernel, rows, cols, iterations):
    """`_potentials` through the fused GPU kernel where it applies: under
    JAX, for matrices that fit it, in programs lowered for CUDA (the same
    program lowered for another platform runs `_potentials`). No gradient
    flows through it: callers pass a gradient-free `log_kernel`. Its
    `epsilon` is at least `MIN_EPSILON` (`check_epsilon`), so `-cost /
    epsilon` stays above the kernel's padding fill."""
    shape = static_shape(log_kernel)
    if (
        keras.config.backend() != "jax"
        or not fused_sinkhorn.enabled()
        or shape is None
        or not fused_sinkhorn.fits(shape[-2], shape[-1])
    ):
        return _potentials(log_kernel, rows, cols, iterations)
    import jax

    def fused(log_kernel, rows, cols):
        return fused_sinkhorn.potentials(
            log_kernel, rows, cols, iterations, _ABSORB_EVERY, MASK_FILL
        )

    def generic(log_kernel, rows, cols):
        return _potentials(log_kernel, rows, cols, iterations)

    return jax.lax.platform_dependent(
        log_kernel, rows, cols, cuda=fused, default=generic
    )


# Sinkhorn iterations per absorption (see `_absorbed_iterations`).
_ABSORB_EVERY = 10


def _fori_with_constants(steps, update, carry, constants):
    """`carry = update(carry, *constants)`, `steps` times (`ops.fori_loop`).

    JAX caches a loop's traced body by the function's identity: a closure
    made per call recompiled the loop at every eager call (0.3 s per
    `sinkhorn_plan` of a 6 x 5 cost on a CPU, against 0.01 s cached). So
    under JAX one module-level body per `update` carries the constants in
    the loop state (its loops treat state passed through unchanged as
    constants). Elsewhere a closure captures them: TensorFlow's gradient of
    a `while_loop` saves every loop variable at every iteration, a captured
    tensor once.
    """
    if keras.config.backend() == "jax":
        state = ops.fori_loop(0, steps, _state_body(update), (carry, constants))
        return state[0]
    return ops.fori_loop(0, steps, lambda _, c: update(c, *constants), carry)


@functools.cache
def _state_body(update):
    """The `fori_loop` body of `update` with the constants in the state
    (the same function object for every call: see `_fori_with_constants`)."""

    def body(_, state):
        carry, constants = state
        return update(carry, *constants), constants

    return body


def _scaling_step(scalings, kernel, a, b, rows, cols):
    """One multiplicative Sinkhorn iteration (`_absorbed_iterations`)."""
    s, t = scalings
    # Rows whose mass underflowed get a large finite scaling; the next
    # absorption recomputes them exactly in the log domain.
    # Padded rows and columns (mass 0) divide by 1, not by 1e-30: the
    # division's gradient there, `a / 1e-60`, is inf in float32, and
    # `where` passes 0 * inf = NaN back (JAX).
    row_mass = ops.einsum("...ij,...j->...i", kernel, t)
    s = ops.where(rows, a / _safe_mass(row_mass, rows), 1.0)
    col_mass = ops.einsum("...ij,...i->...j", kernel, s)
    t = ops.where(cols, b / _safe_mass(col_mass, cols), 1.0)
    return s, t


def _safe_mass(mass, valid):
    """`max(mass, 1e-30)` on valid points, 1 on padded ones, by selects:
    the gradient reaches `mass` only where it is above 1e-30 (JAX's
    derivative of `maximum` at an underflowed mass, times the division's
    `a / 1e-60 = inf`, was NaN)."""
    # In `mass`'s dtype: Python floats followed `floatx` (float64), which
    # float32 masses then failed to mix with on TF and PyTorch.
    floor = ops.where(valid, ops.full_like(mass, 1e-30), ops.ones_like(mass))
    return ops.where(ops.logical_and(valid, mass > 1e-30), mass, floor)


def _absorbed_iterations(
    state, log_kernel, a, b, rows, cols, steps=_ABSORB_EVERY
):
    """`steps` Sinkhorn iterations on the potentials `state = (u, v)`,
    absorbed into the kernel (the state first: a `_fori_with_constants`
    update).

    Exactly the log-domain updates `u = log a - logsumexp_j(M_ij + v_j)`,
    `v = log b - logsumexp_i(M_ij + u_i)`, written as multiplicative
    updates of scalings `s = exp(u - u0)`, `t = exp(v - v0)` on the kernel
    `K = exp(M + u0 + v0)`: `s = a / (K t)`, `t = b / (K^T s)`. `K` is the
    current plan (entries <= 1, no overflow); near the solution `s, t` stay
    close to 1, and `(u0 + log s, v0 + log t)` is re-absorbed after
    `steps` iterations (stabilized Sinkhorn, Schmitzer 2019). This replaces
    two `logsumexp` passes per iteration by two matrix-vector products and
    one `exp` pass per block.
    """
    u, v = state
    kernel = ops.exp(log_kernel + u[..., :, None] + v[..., None, :])
    ones = (ops.ones_like(a), ops.ones_like(b))
    constants = (kernel, a, b, rows, cols)
    s, t = _fori_with_constants(steps, _scaling_step, ones, constants)
    return u + ops.log(s), v + ops.log(t)


def sinkhorn_cost(
    cost, epsilon=0.01, iterations=100, row_mask=None, col_mask=None
):
    """Entropic OT cost `sum_ij C_ij P_ij`, `(...)`, float32.

    The plan `P` of `sinkhorn_plan` (normalized cost) is held constant for
    the gradient. By the envelope theorem this is the exact gradient of the
    entropic OT objective with respect to the cost, and it avoids
    back-propagating through the iterations. Arguments as in
    `sinkhorn_plan`; an empty batch gives an empty result, a set with no
    point (no rows or no columns) a cost of 0.

    Under JAX, in a program compiled for an NVIDIA GPU, the iterations run
    in one fused kernel per matrix for matrices of at most 32,768 entries
    after padding each side to a power of two
    (`keras_attnvariants.ops.fused_sinkhorn`; same arithmetic;
    `KERAS_ATTNVARIANTS_FUSED_SINKHORN=0` turns it off).
    """
    cost = ops.cast(cost, "float32")
    # The plan is solved on a gradient-free copy of the cost, so autodiff
    # keeps no per-iteration intermediates of the loop.
    plan = _plan(
        ops.stop_gradient(cost),
        epsilon,
        iterations,
        row_mask,
        col_mask,
        normalize_cost=True,
        fused=True,
    )
    # Masked pairs hold anything (inf, nan): zeroed, not multiplied by 0.
    # Forbidden (`+inf`) pairs carry no mass: 0, not `0 * inf`.
    _, _, valid = _pair_masks(cost, row_mask, col_mask)
    allowed = ops.logical_and(valid, ops.not_equal(cost, np.inf))
    cost = ops.where(allowed, cost, 0.0)
    return ops.sum(ops.stop_gradient(plan) * cost, axis=(-2, -1))


def conditional_transport_plans(logits, row_mask=None, col_mask=None):
    """Forward and backward conditional transport plans.

    With uniform marginals over the valid points,
    `forward[i, j] = pi(y_j | x_i)` is the softmax of `logits[i, :]` over
    valid columns and `backward[i, j] = pi(x_i | y_j)` the softmax of
    `logits[:, j]` over valid rows (Zheng and Zhou, 2021).

    Args:
        logits: tensor `(..., n, m)`, e.g. `t(x_i) . t(y_j)`.
        row_mask: optional boolean `(..., n)`.
        col_mask: optional boolean `(..., m)`. `ValueError` for masks
            whose static shapes do not broadcast.

    Returns:
        `(forward, backward)`, float32 `(..., n, m)`, 0 on masked pairs
        (empty for empty `logits`).
    """
    logits = ops.cast(logits, "float32")
    _, _, valid = _pair_masks(logits, row_mask, col_mask, "logits")
    # Masked pairs at -inf, below every valid logit however low: a finite
    # fill (`MASK_FILL`, -1e9) became the maximum of a line whose valid
    # logits all lay below it, and their weights underflowed to 0.
    # Both directions in place (no transposes): softmax over j, then over i.
    logits = ops.where(valid, logits, -np.inf)
    return (
        _masked_softmax_along(logits, -1),
        _masked_softmax_along(logits, -2),
    )


def _masked_softmax_along(logits, axis):
    """Softmax of `logits` along `axis`, whose masked entries are `-inf`:
    0 there, and 0 on a line without a finite entry (empty for empty
    `logits`: `ops.max` raises on them)."""
    if statically_empty(logits):
        return ops.zeros_like(logits)
    peak = ops.amax(logits, axis=axis, keepdims=True)
    # A line with no valid entry: exp(-inf - 0) = 0, not exp(nan).
    peak = ops.where(peak > -np.inf, peak, 0.0)
    # exp(-inf) = 0 exactly, and so is its gradient.
    weights = ops.exp(logits - ops.stop_gradient(peak))
    total = ops.sum(weights, axis=axis, keepdims=True)
    return weights / ops.maximum(total, 1e-30)


def conditional_transport_cost(
    cost, logits, row_mask=None, col_mask=None, rho=0.5
):
    """Bidirectional conditional transport cost, `(...)`, float32.

    `rho * E_{x ~ p_X} E_{y ~ pi(.|x)} c(x, y)
    + (1 - rho) * E_{y ~ p_Y} E_{x ~ pi(.|y)} c(x, y)` with uniform
    `p_X`, `p_Y` over the valid points and the plans of
    `conditional_transport_plans(logits)` (paper Eq. 4 with `rho = 0.5`).
    `logits` must have the shape of `cost` (`ValueError` where static
    sizes differ); masks as in `conditional_transport_plans`. An empty
    batch gives an empty result, a set with no point a cost of 0.
    """
    rho = check_float("rho", rho, 0.0, True)
    if rho > 1.0:
        raise ValueError(f"`rho` must be in [0, 1]. Received: rho={rho}")
    cost_shape, logits_shape = static_shape(cost), static_shape(logits)
    if (
        cost_shape is not None
        and logits_shape is not None
        and not (
            len(cost_shape) == len(logits_shape)
            and all(map(same_size, cost_shape, logits_shape))
        )
    ):
        raise ValueError(
            f"`logits` must have the shape of `cost`, {cost_shape}. "
            f"Received: logits with shape {logits_shape}"
        )
    cost = ops.cast(cost, "float32")
    rows, cols, valid = _pair_masks(cost, row_mask, col_mask)
    # Masked pairs hold anything (inf, nan): zeroed, not multiplied by 0.
    cost = ops.where(valid, cost, 0.0)
    forward, backward = conditional_transport_plans(logits, rows, cols)
    a = uniform_marginal(rows)
    b = uniform_marginal(cols)
    to_y = ops.sum(a * ops.sum(forward * cost, axis=-1), axis=-1)
    to_x = ops.sum(b * ops.sum(backward * cost, axis=-2), axis=-1)
    return rho * to_y + (1.0 - rho) * to_x


def gaussian_mmd(x, y, x_mask=None, y_mask=None, bandwidth=1.0):
    """Squared maximum mean discrepancy with a Gaussian kernel, `(...)`.

    `MMD^2 = E k(x, x') + E k(y, y') - 2 E k(x, y)` with
    `k(a, b) = exp(-||a - b||^2 / (2 bandwidth^2))` and uniform weights on
    the valid points (the biased V-statistic: 0 for identical clouds,
    never negative). The paper's diagnostic uses the standard kernel,
    `bandwidth=1`.

    Args:
        x: tensor `(..., n, d)`.
        y: tensor `(..., m, d)`: leading axes that broadcast with `x`'s
            (e.g. one reference cloud for a batch) and feature size `d`.
        x_mask: optional boolean `(..., n)`.
        y_mask: optional boolean `(..., m)`.
        bandwidth: float > 0. Kernel width. Defaults to `1.0`.

    `ValueError` where static sizes break this form.

    Returns:
        float32 `(...)`; 0 where either cloud has no valid point.
    """
    bandwidth = check_float("bandwidth", bandwidth)
    _check_points(x, y)
    x = ops.cast(x, "float32")
    y = ops.cast(y, "float32")
    x_valid = _point_mask(
        x_mask, ops.shape(x)[:-1], "x_mask", "the points of `x`"
    )
    y_valid = _point_mask(
        y_mask, ops.shape(y)[:-1], "y_mask", "the points of `y`"
    )
    if x_mask is not None:
        # Masked points hold anything (inf, nan): zeroed, as 0 * inf = nan.
        x = ops.where(x_valid[..., None], x, 0.0)
    if y_mask is not None:
        y = ops.where(y_valid[..., None], y, 0.0)
    wx = uniform_marginal(x_valid)
    wy = uniform_marginal(y_valid)
    x, y = _centered(x, y, wx)
    scale = -0.5 / bandwidth**2

    def mean_kernel(p, q, wp, wq):
        k = ops.exp(scale * _expanded_distances(p, q))
        return ops.sum(wp * ops.sum(k * wq[..., None, :], axis=-1), axis=-1)

    mmd = (
        mean_kernel(x, x, wx, wx)
        + mean_kernel(y, y, wy, wy)
        - 2.0 * mean_kernel(x, y, wx, wy)
    )
    present = ops.logical_and(ops.sum(wx, -1) > 0.5, ops.sum(wy, -1) > 0.5)
    # `zeros_like`, not 0.0: PyTorch's `where` promoted a 0-d float32 with a
    # Python float to floatx (float64 under `set_floatx("float64")`).
    return ops.where(present, ops.maximum(mmd, 0.0), ops.zeros_like(mmd))
