"""Sinkhorn iterations fused into one GPU kernel (JAX, Pallas on Triton).

`sinkhorn_plan` as plain `keras.ops` runs each of its 100 iterations as a
few separate kernels, each reading the whole `(..., n, m)` kernel matrix
from GPU memory: on an H100 the OT alignment term of a 6-block model ran
~3,800 kernels per training step and cost 2.4x the model's GPU time
(`docs/kq_alignment_overhead.md`). Here one Triton program per matrix
loads it once, keeps it on chip, and runs every iteration there.

The arithmetic is the generic path's, step for step (one exact log-domain
iteration, then blocks of `absorb_every` multiplicative updates with the
potentials re-absorbed between blocks), so both give the same potentials
up to float32 summation order (`tests/ops/fused_sinkhorn_test.py` checks
this on the CPU through Pallas' interpreter).

Used only by `sinkhorn_cost`, whose plan carries no gradient (the kernel
has no autodiff rule), under the JAX backend, and only when the program
is lowered for CUDA (`jax.lax.platform_dependent`): compiled for a CPU or
a TPU the same call runs the generic iterations. Matrices are padded to
powers of two and must fit on chip: at most `MAX_ELEMENTS` entries after
padding (128 x 256, say); larger ones take the generic path. The
environment variable `KERAS_ATTNVARIANTS_FUSED_SINKHORN=0` (`false`,
`off`, `no`), read when a step is traced, turns the kernel off.
"""

import math
import os

# Padded entries per matrix the kernel holds on chip (registers): 128 x 256.
MAX_ELEMENTS = 128 * 256


def enabled():
    """False when `KERAS_ATTNVARIANTS_FUSED_SINKHORN` is `0`/`false`/`off`/
    `no` (read at trace time)."""
    flag = os.environ.get("KERAS_ATTNVARIANTS_FUSED_SINKHORN", "1")
    return flag.strip().lower() not in ("0", "false", "off", "no")


def padded_size(size):
    """The power of two (at least 16) a matrix side is padded to."""
    return max(16, 1 << max(0, int(size) - 1).bit_length())


def fits(n, m):
    """Whether `(n, m)` matrices (static Python ints) fit the kernel."""
    if not isinstance(n, int) or not isinstance(m, int) or n < 1 or m < 1:
        return False
    return padded_size(n) * padded_size(m) <= MAX_ELEMENTS


def _num_warps(elements):
    """Warps per program: about 32 matrix entries per thread."""
    return int(min(16, max(4, elements // 1024)))


def _kernel(
    log_kernel_ref,
    rows_ref,
    cols_ref,
    u_ref,
    v_ref,
    *,
    full_blocks,
    absorb_every,
    last_block,
    mask_fill,
):
    """One `(n, m)` matrix: the potentials `u (n,)`, `v (m,)`.

    `rows_ref`, `cols_ref` hold 1.0 on valid points, 0.0 on masked and
    padded ones; padded entries of `log_kernel_ref` hold `mask_fill`.
    """
    import jax.numpy as jnp
    from jax import lax

    rows = rows_ref[...]
    cols = cols_ref[...]
    row_valid = rows > 0.5
    col_valid = cols > 0.5
    # uniform_marginal: 1 / count on valid points, 0 elsewhere.
    a = rows / jnp.maximum(jnp.sum(rows), 1.0)
    b = cols / jnp.maximum(jnp.sum(cols), 1.0)
    log_a = jnp.where(row_valid, jnp.log(a + 1e-30), mask_fill)
    log_b = jnp.where(col_valid, jnp.log(b + 1e-30), mask_fill)

    def logsumexp(x, axis):
        peak = jnp.max(x, axis=axis, keepdims=True)
        total = jnp.sum(jnp.exp(x - peak), axis=axis, keepdims=True)
        return jnp.squeeze(jnp.log(total) + peak, axis)

    log_k = log_kernel_ref[...]
    u = log_a - logsumexp(log_k, 1)
    v = log_b - logsumexp(log_k + u[:, None], 0)

    def safe_mass(mass, valid):
        # transport._safe_mass: max(mass, 1e-30) on valid points, 1 on
        # masked ones.
        floor = jnp.where(valid, 1e-30, 1.0)
        return jnp.where(jnp.logical_and(valid, mass > 1e-30), mass, floor)

    def absorbed(state, steps):
        u, v = state
        # Re-read from memory (cached) rather than held: only the current
        # kernel stays in registers.
        kernel = jnp.exp(log_kernel_ref[...] + u[:, None] + v[None, :])

        def step(_, scalings):
            s, t = scalings
            row_mass = jnp.sum(kernel * t[None, :], axis=1)
            s = jnp.where(row_valid, a / safe_mass(row_mass, row_valid), 1.0)
            col_mass = jnp.sum(kernel * s[:, None], axis=0)
            t = jnp.where(col_valid, b / safe_mass(col_mass, col_valid), 1.0)
            return s, t

        s, t = lax.fori_loop(
            0, steps, step, (jnp.ones_like(u), jnp.ones_like(v))
        )
        return u + jnp.log(s), v + jnp.log(t)

    if full_blocks:
        u, v = lax.fori_loop(
            0, full_blocks, lambda _, st: absorbed(st, absorb_every), (u, v)
        )
    if last_block:
        u, v = absorbed((u, v), last_block)
    u_ref[...] = u
    v_ref[...] = v


def potentials(
    log_kernel,
    rows,
    cols,
    iterations,
    absorb_every,
    mask_fill,
    interpret=False,
):
    """Sinkhorn potentials `(u, v)` of `log_kernel (..., n, m)` (float32
    JAX arrays; `rows (..., n)` and `cols (..., m)` boolean, broadcast to
    full shape), as the generic path of `transport.sinkhorn_plan` computes
    them, in one Pallas call. `interpret=True` runs Pallas' interpreter
    (any device; for tests)."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pl_triton

    *batch, n, m = log_kernel.shape
    groups = math.prod(batch)
    n_pad, m_pad = padded_size(n), padded_size(m)
    log_kernel = jnp.reshape(log_kernel, (groups, n, m))
    log_kernel = jnp.pad(
        log_kernel,
        ((0, 0), (0, n_pad - n), (0, m_pad - m)),
        constant_values=mask_fill,
    )
    row_weights = jnp.pad(
        jnp.reshape(rows, (groups, n)).astype("float32"),
        ((0, 0), (0, n_pad - n)),
    )
    col_weights = jnp.pad(
        jnp.reshape(cols, (groups, m)).astype("float32"),
        ((0, 0), (0, m_pad - m)),
    )
    full_blocks, last_block = divmod(iterations - 1, absorb_every)

    def kernel(*refs):
        _kernel(
            *refs,
            full_blocks=full_blocks,
            absorb_every=absorb_every,
            last_block=last_block,
            mask_fill=mask_fill,
        )

    u, v = pl.pallas_call(
        kernel,
        out_shape=(
            jax_struct((groups, n_pad)),
            jax_struct((groups, m_pad)),
        ),
        grid=(groups,),
        in_specs=[
            pl.BlockSpec((None, n_pad, m_pad), lambda g: (g, 0, 0)),
            pl.BlockSpec((None, n_pad), lambda g: (g, 0)),
            pl.BlockSpec((None, m_pad), lambda g: (g, 0)),
        ],
        out_specs=(
            pl.BlockSpec((None, n_pad), lambda g: (g, 0)),
            pl.BlockSpec((None, m_pad), lambda g: (g, 0)),
        ),
        compiler_params=pl_triton.CompilerParams(
            num_warps=_num_warps(n_pad * m_pad), num_stages=1
        ),
        interpret=interpret,
        name="sinkhorn_potentials",
    )(log_kernel, row_weights, col_weights)
    u = jnp.reshape(u[:, :n], (*batch, n))
    v = jnp.reshape(v[:, :m], (*batch, m))
    return u, v


def jax_struct(shape):
    import jax

    return jax.ShapeDtypeStruct(shape, "float32")
