"""Where does the relaxed Gumbel sample's extra GPU time go? (JAX)

Times keras MHA, `GumbelDiscreteAttention` (relaxed and straight-through)
and probe variants of the relaxed sample's noise in one process, with
`benchmarks/accelerator_step.py`'s train step, then writes `jax.profiler`
traces of some of them to `$OUT`. Run from the repository root:

    KERAS_BACKEND=jax python docs/logs/h200_2026-11-26/relaxed_probe.py \
        8 512 256 4 21   # batch, length, dim, heads, repeats

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
import keras_attnvariants.ops.gumbel as gumbel  # noqa: E402
import keras_attnvariants.ops.noise as noise  # noqa: E402

ORIGINAL_NOISE = gda.training_noise
ORIGINAL_UNIFORM = noise.positional_uniform


def zero_noise(scores, temperature, seed_generator):
    g, t = ORIGINAL_NOISE(scores, temperature, seed_generator)
    return ops.zeros_like(g), t


def barrier_noise(scores, temperature, seed_generator):
    g, t = ORIGINAL_NOISE(scores, temperature, seed_generator)
    return jax.lax.optimization_barrier(g), t


def rbg_noise(scores, temperature, seed_generator):
    g, t = ORIGINAL_NOISE(scores[..., :1, :1], temperature, seed_generator)
    key = jax.random.key(0, impl="rbg")
    u = jax.random.uniform(key, scores.shape, minval=1e-7, maxval=1.0)
    return -jax.numpy.log(-jax.numpy.log(u)) + g, t


def uniform_rows_first(key, shape):
    """`positional_uniform` (same bits) with its per-row words and
    per-column codes behind an optimization barrier."""
    rows = gumbel.fmix32(
        ops.bitwise_xor(
            gumbel.hash_words(key),
            gumbel.hash_words([gumbel._SALT_A, gumbel._SALT_B]),
        )
    )
    for axis, size in enumerate(shape[:-1]):
        code = gumbel._coordinates(size, axis)
        rows = gumbel.fmix32(ops.bitwise_xor(ops.expand_dims(rows, -1), code))
    last = gumbel._coordinates(shape[-1], len(shape) - 1)
    odd = ops.bitwise_or(ops.expand_dims(rows[1], -1), gumbel.hash_words(1))
    a, odd, last = jax.lax.optimization_barrier(
        (ops.expand_dims(rows[0], -1), odd, last)
    )
    h = gumbel.fmix32(ops.bitwise_xor(a, ops.multiply(last, odd)))
    return (ops.cast(gumbel._shift_right(h, 8), "float32") + 0.5) * 2.0**-24


def uniform_cheap(key, shape):
    """A 3-op hash of the position (poor noise: a probe of the hash's
    cost only)."""
    uint = jax.numpy.uint32
    i = jax.lax.broadcasted_iota(uint, shape, len(shape) - 1)
    r = jax.lax.broadcasted_iota(uint, shape, len(shape) - 2)
    h = (i * uint(2654435761)) ^ (r * uint(0x85EBCA6B)) ^ key
    return ((h >> 8).astype("float32") + 0.5) * 2.0**-24


def with_uniform(uniform):
    def patched(scores, temperature, seed_generator):
        noise.positional_uniform = uniform
        try:
            return ORIGINAL_NOISE(scores, temperature, seed_generator)
        finally:
            noise.positional_uniform = ORIGINAL_UNIFORM

    return patched


VARIANTS = [
    ("mha", keras.layers.MultiHeadAttention, {}, None),
    ("relaxed", gda.GumbelDiscreteAttention, {}, None),
    ("relaxed_zero_noise", gda.GumbelDiscreteAttention, {}, zero_noise),
    ("relaxed_barrier", gda.GumbelDiscreteAttention, {}, barrier_noise),
    ("relaxed_rbg", gda.GumbelDiscreteAttention, {}, rbg_noise),
    (
        "relaxed_rowbarrier",
        gda.GumbelDiscreteAttention,
        {},
        with_uniform(uniform_rows_first),
    ),
    (
        "relaxed_cheap_hash",
        gda.GumbelDiscreteAttention,
        {},
        with_uniform(uniform_cheap),
    ),
    (
        "straight",
        gda.GumbelDiscreteAttention,
        {"straight_through": True},
        None,
    ),
]
TRACED = ("mha", "relaxed", "relaxed_zero_noise", "relaxed_cheap_hash")


def main(argv):
    out = os.environ.get("OUT", "/tmp/relaxed_probe")
    os.makedirs(out, exist_ok=True)
    batch, length, dim, heads, repeats = (
        [int(v) for v in argv] if argv else (8, 512, 256, 4, 21)
    )
    small = (2, 3, 5, 7)
    same = np.array_equal(
        jax.jit(lambda k: ORIGINAL_UNIFORM(k, small))(np.uint32(3)),
        jax.jit(lambda k: uniform_rows_first(k, small))(np.uint32(3)),
    )
    print("rows-first noise identical:", same, flush=True)
    x = ops.convert_to_tensor(
        np.random.default_rng(0).normal(size=(batch, length, dim)), "float32"
    )
    calls = {}
    for label, cls, kwargs, patch in VARIANTS:
        gda.training_noise = patch or ORIGINAL_NOISE
        layer = cls(heads, dim // heads, seed=0, **kwargs)
        layer(x, x)
        calls[label], _, _ = accelerator_step.jax_step(layer, x, "train")
        warm_up(calls[label])
    gda.training_noise = ORIGINAL_NOISE
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
