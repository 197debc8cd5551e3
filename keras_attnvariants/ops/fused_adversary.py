"""KQAlignment's adversaries fused into GPU kernels (JAX, Pallas on Triton).

The GAN discriminator and the CT critic (a highway layer, then a 2-layer
MLP with leaky ReLU) and CT's navigator (a 2-layer MLP) run on every
query and key of every head: `(M, H)` points with `H = 64` at the
paper's width. As XLA ops each layer, activation and gradient is a pass
over `(M, H)` or `(M, 2H)` buffers in GPU memory, and on an H100 the GAN
and CT terms cost 37% and 102% of a 6-block model's GPU time for 6% and
16% of its FLOPs (`docs/kq_alignment_overhead.md`). Here one forward
kernel reads each tile of points once and writes only the MLP's outputs;
one backward kernel recomputes the tile's activations on chip and writes
the points' gradient and, per tile, partial weight gradients that XLA
then sums (a fixed order: no atomics, so the step is deterministic).

`mlp(x, ...)` is a `jax.custom_vjp` function with the exact arithmetic
of `KQAlignment._highway_mlp` / `_ct_features` (same activations, leaky
ReLU slope 0.2, same gradient conventions at 0):
`tests/ops/fused_adversary_test.py` checks values and every gradient
against an independent `jax.numpy` MLP and the terms' losses and
gradients against the generic path, on the CPU through Pallas'
interpreter, and on a GPU compiled (the kernels passed there on an
H200, 2026-11-26, before the `platform_dependent` wrapper below).

`KQAlignment` uses it under the JAX backend when the step is traced with
an NVIDIA GPU as JAX's default backend, for a shared adversary whose
point size and hidden width are 16, 32 or 64. Inside,
the kernels run where the program is lowered for CUDA
(`jax.lax.platform_dependent`) and the same arithmetic as XLA ops
elsewhere, so a CPU compile of such a step still works. It is OFF by
default: set `KERAS_ATTNVARIANTS_FUSED_ADVERSARY=1`. Its speed is not
measured yet (the session that wrote it ran out of GPU time after the
tests); turn it on by default once a benchmark shows it faster.
"""

import functools
import os


def _setting(name, default, allowed):
    """An integer environment override from `allowed`, else `default` (a
    malformed value must not break importing the package)."""
    try:
        value = int(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value in allowed else default


# Points per program and warps per program: untuned defaults, with
# environment overrides for tuning runs (read at import).
TILE = _setting(
    "KERAS_ATTNVARIANTS_ADVERSARY_TILE", 128, (16, 32, 64, 128, 256)
)
WARPS = _setting("KERAS_ATTNVARIANTS_ADVERSARY_WARPS", 8, (1, 2, 4, 8, 16))

# Leaky ReLU slope of `keras.ops.leaky_relu` (its default).
SLOPE = 0.2

# Point sizes and hidden widths the kernels take. 128 is left out: its
# backward kernel would hold six 128 x 128 float32 weights per program and
# was never compiled.
SIZES = (16, 32, 64)

# Run the kernels through Pallas' interpreter (tests on a CPU set it).
INTERPRET = False


def enabled():
    """True when `KERAS_ATTNVARIANTS_FUSED_ADVERSARY` is `1`/`true`/`on`/
    `yes`, read when a step is traced (set it before the first step).

    Off by default until its speed is measured: the kernels passed their
    tests on an H200, but the session's GPU time ran out before the
    benchmark (see docs/kq_alignment_overhead.md)."""
    flag = os.environ.get("KERAS_ATTNVARIANTS_FUSED_ADVERSARY", "0")
    return flag.strip().lower() in ("1", "true", "on", "yes")


def fits(dim, hidden, out_units):
    """Whether the kernel takes points of size `dim`, an MLP of width
    `hidden` and `out_units` outputs (1 or `hidden`), as static ints."""
    return (
        dim in SIZES
        and hidden in SIZES
        and (out_units == 1 or out_units == hidden)
    )


def on_nvidia_gpu():
    """Whether JAX's default backend is an NVIDIA GPU (at trace time)."""
    import jax

    if jax.default_backend() != "gpu":
        return False
    try:
        version = jax.devices()[0].client.platform_version.lower()
    except Exception:  # noqa: BLE001 - any failure: take the generic path
        return False
    return "rocm" not in version


def _leaky(z):
    import jax.numpy as jnp

    return jnp.where(z >= 0, z, SLOPE * z)


def _dot(a, b, contract=(1, 0)):
    """`a @ b` contracting axis `contract[0]` of `a` with `contract[1]` of
    `b` (2D), float32 accumulation."""
    from jax import lax

    return lax.dot_general(
        a,
        b,
        (((contract[0],), (contract[1],)), ((), ())),
        preferred_element_type="float32",
    )


def _trunk(x, wg, bg, wt, bt, w1, b1):
    """Highway then the first dense layer: every activation the output
    layer and the gradients need."""
    import jax.numpy as jnp

    gated = _dot(x, wg) + bg
    transformed = _dot(x, wt) + bt
    tau = 1.0 / (1.0 + jnp.exp(-gated))
    # A select, not `maximum`: JAX's gradient of `maximum` at a tie is
    # 0.5, `ops.relu`'s (and the backward kernel's) 0.
    relu = jnp.where(transformed > 0, transformed, 0.0)
    y = tau * relu + (1.0 - tau) * x
    z = _dot(y, w1) + b1
    return transformed, tau, relu, y, z, _leaky(z)


def _forward_kernel(*refs, scalar_out, navigator):
    if navigator:
        (x_ref, wg, bg, wt, bt, w1, b1, w2, n1, nb1, n2, out_ref, nav_ref) = (
            refs
        )
    else:
        x_ref, wg, bg, wt, bt, w1, b1, w2, out_ref = refs
    import jax.numpy as jnp

    x = x_ref[...]
    *_, a = _trunk(x, wg[...], bg[...], wt[...], bt[...], w1[...], b1[...])
    if scalar_out:
        # w2 is the output column as a row (1, H).
        out_ref[...] = jnp.sum(a * w2[...], axis=1)
    else:
        out_ref[...] = _dot(a, w2[...])
    if navigator:
        hidden = _leaky(_dot(x, n1[...]) + nb1[...])
        nav_ref[...] = _dot(hidden, n2[...])


def _backward_kernel(*refs, scalar_out, navigator):
    import jax.numpy as jnp

    if navigator:
        (
            x_ref, wg, bg, wt, bt, w1, b1, w2, n1, nb1, n2, d_out_ref,
            d_nav_ref, dx_ref, dwg, dbg, dwt, dbt, dw1, db1, dw2, dn1, dnb1,
            dn2,
        ) = refs  # fmt: skip
    else:
        (
            x_ref, wg, bg, wt, bt, w1, b1, w2, d_out_ref, dx_ref, dwg, dbg,
            dwt, dbt, dw1, db1, dw2,
        ) = refs  # fmt: skip
    x = x_ref[...]
    wg_, wt_, w1_, w2_ = wg[...], wt[...], w1[...], w2[...]
    transformed, tau, relu, y, z, a = _trunk(
        x, wg_, bg[...], wt_, bt[...], w1_, b1[...]
    )
    d_out = d_out_ref[...]
    if scalar_out:
        d_out = d_out[:, None]  # (T, 1)
        da = d_out * w2_  # (T, H)
        dw2[...] = jnp.sum(a * d_out, axis=0, keepdims=True)
    else:
        da = _dot(d_out, w2_, (1, 1))
        dw2[...] = _dot(a, d_out, (0, 0))
    dz = jnp.where(z >= 0, da, SLOPE * da)
    dw1[...] = _dot(y, dz, (0, 0))
    db1[...] = jnp.sum(dz, axis=0, keepdims=True)
    dy = _dot(dz, w1_, (1, 1))
    d_tau = dy * (relu - x)
    d_gated = d_tau * tau * (1.0 - tau)
    d_transformed = jnp.where(transformed > 0, dy * tau, 0.0)
    dwg[...] = _dot(x, d_gated, (0, 0))
    dbg[...] = jnp.sum(d_gated, axis=0, keepdims=True)
    dwt[...] = _dot(x, d_transformed, (0, 0))
    dbt[...] = jnp.sum(d_transformed, axis=0, keepdims=True)
    dx = (
        dy * (1.0 - tau)
        + _dot(d_gated, wg_, (1, 1))
        + _dot(d_transformed, wt_, (1, 1))
    )
    if navigator:
        n1_ = n1[...]
        zn = _dot(x, n1_) + nb1[...]
        hidden = _leaky(zn)
        d_nav = d_nav_ref[...]
        dn2[...] = _dot(hidden, d_nav, (0, 0))
        d_hidden = _dot(d_nav, n2[...], (1, 1))
        dzn = jnp.where(zn >= 0, d_hidden, SLOPE * d_hidden)
        dn1[...] = _dot(x, dzn, (0, 0))
        dnb1[...] = jnp.sum(dzn, axis=0, keepdims=True)
        dx = dx + _dot(dzn, n1_, (1, 1))
    dx_ref[...] = dx


def _call(kernel, inputs, outputs, tiles, tile, warps, interpret, name):
    """`pallas_call` over `tiles` programs. `inputs` / `outputs`: lists
    of `(shape, kind)`, kind "points" (tiled on axis 0), "whole" (every
    program reads all of it) or "partial" (one slice per program)."""
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pl_triton

    def spec(shape, kind):
        if kind == "points":
            block = (tile,) + tuple(shape[1:])
            return pl.BlockSpec(block, lambda i: (i,) + (0,) * (len(block) - 1))
        if kind == "whole":
            return pl.BlockSpec(tuple(shape), lambda i: (0,) * len(shape))
        block = (None,) + tuple(shape[1:])
        return pl.BlockSpec(block, lambda i: (i,) + (0,) * (len(block) - 1))

    return pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct(s, "float32") for s, _ in outputs],
        grid=(tiles,),
        in_specs=[spec(s, k) for s, k in inputs],
        out_specs=[spec(s, k) for s, k in outputs],
        compiler_params=pl_triton.CompilerParams(num_warps=warps, num_stages=1),
        interpret=interpret,
        name=name,
    )


def _reference(x, weights, scalar_out, navigator):
    """The kernels' outputs as XLA ops (same weight layout)."""
    import jax.numpy as jnp

    wg, bg, wt, bt, w1, b1, w2 = weights[:7]
    *_, a = _trunk(x, wg, bg, wt, bt, w1, b1)
    out = jnp.sum(a * w2, axis=1) if scalar_out else _dot(a, w2)
    if not navigator:
        return (out,)
    n1, nb1, n2 = weights[7:]
    return out, _dot(_leaky(_dot(x, n1) + nb1), n2)


@functools.lru_cache(maxsize=None)
def _mlp_function(scalar_out, navigator, tile, warps, interpret):
    """The `custom_vjp` function for one static configuration."""
    import jax
    import jax.numpy as jnp

    def shapes(x, weights):
        rows, dim = x.shape
        hidden = weights[4].shape[1]
        tiles = -(-rows // tile)
        return rows, dim, hidden, tiles

    def pad(x, rows, tiles):
        extra = tiles * tile - rows
        return x if not extra else jnp.pad(x, ((0, extra), (0, 0)))

    def weight_specs(weights):
        return [(w.shape, "whole") for w in weights]

    def kernel_forward(x, weights):
        rows, dim, hidden, tiles = shapes(x, weights)
        padded = pad(x, rows, tiles)
        outputs = [
            ((tiles * tile,), "points")
            if scalar_out
            else ((tiles * tile, hidden), "points")
        ]
        if navigator:
            outputs.append(((tiles * tile, hidden), "points"))
        call = _call(
            functools.partial(
                _forward_kernel, scalar_out=scalar_out, navigator=navigator
            ),
            [(padded.shape, "points")] + weight_specs(weights),
            outputs,
            tiles,
            tile,
            warps,
            interpret,
            "kq_adversary_forward",
        )
        results = call(padded, *weights)
        return tuple(result[:rows] for result in results)

    def reference(x, weights):
        return _reference(x, weights, scalar_out, navigator)

    def reference_backward(x, weights, cotangents):
        return jax.vjp(reference, x, weights)[1](tuple(cotangents))

    def forward(x, weights):
        if interpret:
            return kernel_forward(x, weights)
        # The kernels where the program is lowered for CUDA; the same
        # arithmetic as XLA ops elsewhere (a CPU compile of the step on a
        # GPU host, e.g. the benchmarks' FLOP count).
        return jax.lax.platform_dependent(
            x, weights, cuda=kernel_forward, default=reference
        )

    def backward(x, weights, cotangents):
        if interpret:
            return kernel_backward(x, weights, cotangents)
        return jax.lax.platform_dependent(
            x,
            weights,
            tuple(cotangents),
            cuda=kernel_backward,
            default=reference_backward,
        )

    @jax.custom_vjp
    def mlp(x, weights):
        return forward(x, weights)

    def mlp_fwd(x, weights):
        return forward(x, weights), (x, weights)

    def mlp_bwd(residuals, cotangents):
        x, weights = residuals
        return backward(x, weights, cotangents)

    def kernel_backward(x, weights, cotangents):
        rows, dim, hidden, tiles = shapes(x, weights)
        padded = pad(x, rows, tiles)
        cotangents = [
            jnp.pad(c, ((0, tiles * tile - rows),) + ((0, 0),) * (c.ndim - 1))
            for c in cotangents
        ]
        partials = [
            ((tiles, dim, dim), "partial"),  # gate kernel
            ((tiles, 1, dim), "partial"),  # gate bias (1, D)
            ((tiles, dim, dim), "partial"),  # transform kernel
            ((tiles, 1, dim), "partial"),
            ((tiles, dim, hidden), "partial"),  # dense_1 kernel
            ((tiles, 1, hidden), "partial"),
            ((tiles,) + weights[6].shape, "partial"),  # dense_2 kernel
        ]
        if navigator:
            partials += [
                ((tiles, dim, hidden), "partial"),
                ((tiles, 1, hidden), "partial"),
                ((tiles, hidden, hidden), "partial"),
            ]
        call = _call(
            functools.partial(
                _backward_kernel, scalar_out=scalar_out, navigator=navigator
            ),
            [(padded.shape, "points")]
            + weight_specs(weights)
            + [(c.shape, "points") for c in cotangents],
            [(padded.shape, "points")] + partials,
            tiles,
            tile,
            warps,
            interpret,
            "kq_adversary_backward",
        )
        dx, *weight_partials = call(padded, *weights, *cotangents)
        d_weights = tuple(jnp.sum(p, axis=0) for p in weight_partials)
        return dx[:rows], d_weights

    mlp.defvjp(mlp_fwd, mlp_bwd)
    return mlp


def mlp(x, highway, dense_1, dense_2, navigator=None, interpret=None):
    """The adversary MLP on points `x (M, D)` (float32), fused.

    Args:
        x: points `(M, D)`.
        highway: `(gate_kernel (D, D), gate_bias (D,), transform_kernel
            (D, D), transform_bias (D,))`.
        dense_1: `(kernel (D, H), bias (H,))`, leaky ReLU after it.
        dense_2: `(kernel (H, O), bias (O,))` with `O` 1 or `H`.
        navigator: optional `((kernel (D, H), bias (H,)), (kernel (H, H),
            bias (H,)))`, a 2-layer MLP with leaky ReLU on `x`.
        interpret: run Pallas' interpreter (any device; for tests).
            Defaults to the module's `INTERPRET`.

    Returns:
        `dense_2(leaky_relu(dense_1(highway(x))))`, `(M, O)`, and with a
        navigator also its output `(M, H)`: the values of
        `KQAlignment._highway_mlp` and `_ct_features`. Differentiable in
        every argument (the output biases outside the kernel).
    """
    import jax.numpy as jnp

    gate_kernel, gate_bias, transform_kernel, transform_bias = highway
    (w1, b1), (w2, b2) = dense_1, dense_2
    scalar_out = w2.shape[1] == 1
    weights = [
        gate_kernel,
        jnp.reshape(gate_bias, (1, -1)),
        transform_kernel,
        jnp.reshape(transform_bias, (1, -1)),
        w1,
        jnp.reshape(b1, (1, -1)),
        jnp.reshape(w2, (1, -1)) if scalar_out else w2,
    ]
    if navigator is not None:
        (n1, nb1), (n2, nb2) = navigator
        weights += [n1, jnp.reshape(nb1, (1, -1)), n2]
    interpret = INTERPRET if interpret is None else interpret
    if x.shape[0] == 0:
        # No point: no program to launch.
        results = _reference(x, weights, scalar_out, navigator is not None)
    else:
        function = _mlp_function(
            scalar_out, navigator is not None, TILE, WARPS, interpret
        )
        results = function(x, tuple(weights))
    out = results[0]
    out = (out[:, None] if scalar_out else out) + jnp.reshape(b2, (1, -1))
    if navigator is None:
        return out
    return out, results[1] + jnp.reshape(nb2, (1, -1))
