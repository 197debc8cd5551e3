"""Do the Gumbel transform's logs cost the relaxed sample its GPU time? (JAX)

Times keras MHA and `GumbelDiscreteAttention` (relaxed) with
`gumbel_from_uniform` replaced by variants: `jax.lax.log` with XLA
tolerances, `log2`, and one log instead of two (a probe, not Gumbel
noise). Prints each variant's largest difference from the accurate noise
on 2**20 uniforms, then the train-step ratios. From the repository root:

    KERAS_BACKEND=jax python docs/logs/h200_2026-11-26/fastlog_probe.py \
        8 512 256 4 21   # batch, length, dim, heads, repeats
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import relaxed_probe as rp  # noqa: E402
from keras import ops  # noqa: E402

import keras_attnvariants.layers.gumbel_discrete_attention as gda  # noqa: E402
from keras_attnvariants.ops.gumbel import GUMBEL_EPS  # noqa: E402

ACCURATE = gda.gumbel_from_uniform


def gumbel_with(log):
    def gumbel(uniform):
        u = ops.cast(uniform, "float32")
        return -log(-log(u + GUMBEL_EPS) + GUMBEL_EPS)

    return gumbel


def tolerant_log(rtol, atol, ulps):
    tolerance = jax.lax.Tolerance(rtol=rtol, atol=atol, ulps=ulps)
    return lambda x: jax.lax.log(x, accuracy=tolerance)


def one_log(uniform):
    return -ops.log(1.0 - ops.cast(uniform, "float32") + GUMBEL_EPS)


VARIANTS = [
    ("mha", None),
    ("relaxed", None),
    ("tol_1e-6", gumbel_with(tolerant_log(1e-6, 1e-6, 0))),
    ("tol_1e-4", gumbel_with(tolerant_log(1e-4, 1e-4, 0))),
    ("ulps_4", gumbel_with(tolerant_log(0.0, 0.0, 4))),
    ("log2", gumbel_with(lambda x: jax.numpy.log2(x) * np.float32(np.log(2)))),
    ("one_log", one_log),
]


def main(argv):
    batch, length, dim, heads, repeats = (
        [int(v) for v in argv] if argv else (8, 512, 256, 4, 21)
    )
    x = ops.convert_to_tensor(
        np.random.default_rng(0).normal(size=(batch, length, dim)), "float32"
    )
    u = jax.numpy.asarray(
        np.random.default_rng(1).uniform(size=(1 << 20,)), "float32"
    )
    reference = np.asarray(jax.jit(ACCURATE)(u), np.float64)
    calls = {}
    for label, gumbel in VARIANTS:
        if gumbel is not None:
            out = np.asarray(jax.jit(gumbel)(u), np.float64)
            diff = float(np.max(np.abs(out - reference)))
            print(f"{label}: max |difference| from accurate noise {diff}")
        gda.gumbel_from_uniform = gumbel or ACCURATE
        if label == "mha":
            layer = rp.keras.layers.MultiHeadAttention(heads, dim // heads)
        else:
            layer = gda.GumbelDiscreteAttention(heads, dim // heads, seed=0)
        layer(x, x)
        calls[label], _, _ = rp.accelerator_step.jax_step(layer, x, "train")
        rp.warm_up(calls[label])
    gda.gumbel_from_uniform = ACCURATE
    steps = rp.steps_for(calls["mha"], 0.05)
    times = rp.time_alternating(calls, repeats, steps, seed=random.random())
    for label in calls:
        print(
            f"{label:12s} {rp.median_time(times, label) * 1e3:.3f} ms  "
            f"{rp.median_ratio(times, label, 'mha'):.3f}x",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
