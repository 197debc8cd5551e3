"""Probes of the relaxed Gumbel sample's forward softmax on a GPU (JAX).

Four runs, each with the variants active at the time (README.md here):

1. `relaxed_keep_e` / `relaxed_keep_logits` (now commented out):
   `jax.lax.optimization_barrier` on `e = exp(y - max)` or on the logits
   `y = (s + g) / tau`, on the (wrong) reading of the morning's profile
   that the backward pass recomputed the noise;
2. `relaxed_bounded`: rows shifted by a noise-free bound of their maximum;
3. and 4. `relaxed_cond`: that bound or the exact maximum, by `ops.cond` on
   the temperature (run 3's version read the clamped scores in the
   branches; this is run 4's).

Run from the repository root (traces go to `$OUT`):

    KERAS_BACKEND=jax python \
        docs/logs/h200_2026-11-26_residual/residual_probe.py 8 512 256 4 21

The probes patch module attributes; they are measurements, not code paths
of the package.
"""

import glob
import os
import random
import shutil
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, "benchmarks")

import accelerator_step  # noqa: E402
import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from harness import median_ratio  # noqa: E402
from harness import median_time  # noqa: E402
from harness import steps_for  # noqa: E402
from harness import time_alternating  # noqa: E402
from harness import warm_up  # noqa: E402
from keras import ops  # noqa: E402

import keras_attnvariants.layers.gumbel_discrete_attention as gda  # noqa: E402
import keras_attnvariants.ops.combine as combine  # noqa: E402
import keras_attnvariants.ops.gumbel as gumbel  # noqa: E402
import keras_attnvariants.ops.noise as noise_module  # noqa: E402

# Gumbel noise from 24-bit centred uniforms lies in [-2.86, 17.33].
NOISE_HIGH = 17.4

ORIGINAL_ROW_EXP = combine._masked_row_exp
ORIGINAL_LOGITS = combine.relaxed_logits


def row_exp_kept(y, mask):
    e, inv, top = ORIGINAL_ROW_EXP(y, mask)
    return jax.lax.optimization_barrier(e), inv, top


def logits_kept(*args, **kwargs):
    return jax.lax.optimization_barrier(ORIGINAL_LOGITS(*args, **kwargs))


def bounded_shift_attend(
    scores, value, noise, temperature=1.0, mask=None, keep=None
):
    """The relaxed sample's folded attention with each row shifted by
    `(max_j s_j + NOISE_HIGH) / tau`, a bound of `max_j y_j` that needs no
    noise, instead of `max_j y_j` itself (probe only: no mask, no
    dropout; the largest weight of a row is at least `exp(-20.3 / tau)`,
    which underflows float32 below tau ~ 0.23)."""
    s = gumbel._clamp_logits(ops.cast(scores, "float32"))
    tau = ops.cast(temperature, "float32")
    top = ops.stop_gradient(
        (ops.max(s, axis=-1, keepdims=True) + NOISE_HIGH) / tau
    )
    y = (s + noise) / tau

    @ops.custom_gradient
    def attend(y, value):
        e = ops.exp(y - top)
        inv = 1.0 / ops.sum(e, axis=-1, keepdims=True)
        rows = combine._Rows(e, inv, value.dtype)
        out = rows.product(value)

        def grad(*args, upstream=None):
            d_out = combine._upstream(args, upstream)
            d_value = rows.transposed_product(d_out)
            g = combine._scores_upstream(d_out, value)
            r = combine._row_dot(d_out, out)
            return e * inv * (g - r), d_value

        return out, grad

    return attend(y, value)


# Below this temperature the bound's shift could underflow a row.
SAFE_TEMPERATURE = 0.25


def cond_shift_attend(
    scores, value, noise, temperature=1.0, mask=None, keep=None
):
    """`bounded_shift_attend` where `tau >= SAFE_TEMPERATURE`, else the
    exact row maximum of `y`, chosen by `ops.cond`. The branches read the
    raw scores (the score matmul's output, in memory anyway) and the exact
    one recomputes its noise from the generator's key (probe: key 0, same
    shape): a tensor computed outside and read by a branch becomes an
    operand of the conditional, written out whichever branch runs (the
    clamped scores were, 15.8 us, in the first version of this probe)."""
    tau = ops.cast(temperature, "float32")

    def clamped():
        return gumbel._clamp_logits(ops.cast(scores, "float32"))

    def bound():
        return (ops.max(clamped(), axis=-1, keepdims=True) + NOISE_HIGH) / tau

    def exact():
        g = gumbel.gumbel_from_uniform(
            noise_module.positional_uniform(0, tuple(scores.shape))
        )
        return ops.max((clamped() + g) / tau, axis=-1, keepdims=True)

    top = ops.stop_gradient(ops.cond(tau >= SAFE_TEMPERATURE, bound, exact))
    y = (clamped() + noise) / tau

    @ops.custom_gradient
    def attend(y, value):
        e = ops.exp(y - top)
        inv = 1.0 / ops.sum(e, axis=-1, keepdims=True)
        rows = combine._Rows(e, inv, value.dtype)
        out = rows.product(value)

        def grad(*args, upstream=None):
            d_out = combine._upstream(args, upstream)
            d_value = rows.transposed_product(d_out)
            g = combine._scores_upstream(d_out, value)
            r = combine._row_dot(d_out, out)
            return e * inv * (g - r), d_value

        return out, grad

    return attend(y, value)


PATCHES = {
    None: {},
    "keep_e": {"_masked_row_exp": row_exp_kept},
    "keep_logits": {"relaxed_logits": logits_kept},
    "bounded_shift": {"relaxed_gumbel_attend": bounded_shift_attend},
    "cond_shift": {"relaxed_gumbel_attend": cond_shift_attend},
}
VARIANTS = [
    ("mha", keras.layers.MultiHeadAttention, {}, None),
    ("relaxed", gda.GumbelDiscreteAttention, {}, None),
    # ("relaxed_keep_e", gda.GumbelDiscreteAttention, {}, "keep_e"),
    # ("relaxed_keep_logits", gda.GumbelDiscreteAttention, {}, "keep_logits"),
    ("relaxed_bounded", gda.GumbelDiscreteAttention, {}, "bounded_shift"),
    ("relaxed_cond", gda.GumbelDiscreteAttention, {}, "cond_shift"),
    ("relaxed_t0.1", gda.GumbelDiscreteAttention, {"temperature": 0.1}, None),
    (
        "relaxed_cond_t0.1",
        gda.GumbelDiscreteAttention,
        {"temperature": 0.1},
        "cond_shift",
    ),
    ("straight", gda.GumbelDiscreteAttention, {"straight_through": True}, None),
]
TRACED = ("mha", "relaxed", "relaxed_cond")


def compiled_step(layer, x, patch):
    """`accelerator_step.jax_step`'s train step, traced and compiled with
    the module attributes of `patch` replaced."""
    modules = {
        name: gda if name == "relaxed_gumbel_attend" else combine
        for name in PATCHES[patch]
    }
    saved = {name: getattr(modules[name], name) for name in PATCHES[patch]}
    for name, value in PATCHES[patch].items():
        setattr(modules[name], name, value)
    try:
        return accelerator_step.jax_step(layer, x, "train")[0]
    finally:
        for name, value in saved.items():
            setattr(modules[name], name, value)


def main(argv):
    out = os.environ.get("OUT", "/tmp/residual_probe")
    os.makedirs(out, exist_ok=True)
    batch, length, dim, heads, repeats = (
        [int(v) for v in argv] if argv else (8, 512, 256, 4, 21)
    )
    print(
        f"device {jax.devices()[0]}, B={batch} S={length} dim={dim} "
        f"heads={heads} repeats={repeats}",
        flush=True,
    )
    x = np.random.default_rng(0).normal(size=(batch, length, dim))
    x = keras.ops.convert_to_tensor(x, "float32")
    calls = {}
    for label, cls, kwargs, patch in VARIANTS:
        layer = cls(heads, dim // heads, seed=0, **kwargs)
        layer(x, x)
        calls[label] = compiled_step(layer, x, patch)
        warm_up(calls[label])
    steps = steps_for(calls["mha"], 0.05)
    times = time_alternating(calls, repeats, steps, seed=random.random())
    for label in calls:
        print(
            f"{label:22s} {median_time(times, label) * 1e3:.3f} ms  "
            f"{median_ratio(times, label, 'mha'):.3f}x",
            flush=True,
        )
    if jax.devices()[0].platform != "gpu":
        return
    for label in TRACED:
        trace = f"/tmp/trace_{label}"
        np.asarray(calls[label]())
        with jax.profiler.trace(trace):
            for _ in range(20):
                result = calls[label]()
            np.asarray(result)
        for path in glob.glob(f"{trace}/**/*.xplane.pb", recursive=True):
            shutil.copy(path, f"{out}/{label}.xplane.pb")


if __name__ == "__main__":
    main(sys.argv[1:])
