"""Step time of DNAS / HNAS against `keras.layers.MultiHeadAttention`.

TensorFlow backend, XLA (`jit_compile=True`). Every variant is built in the
same process and measured alternately: each repeat times every variant once,
in a shuffled order, so a change in machine load hits all of them alike. The
table reports, per variant, the median over repeats of its time divided by
the MultiHeadAttention time of the same repeat.

- train: forward, backward and an SGD update of one self-attention layer
  (`loss = mean(y^2)`), `training=True`, no dropout.
- infer: forward only, `training=False`; DNAS and HNAS on the fused path
  (`keras.ops.dot_product_attention` with the per-key bias) and on the
  explicit path (the normalization folded into the value product,
  `keras_attnvariants.ops.combine`: no weights are returned).

Usage:

    python benchmarks/attention_step.py --output docs/bench.md
    python benchmarks/attention_step.py --quick   # CI: tiny sizes, < 30 s
"""

import functools
import os
import random
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Every variant gets its own tf.function of the same Python function, which
# TensorFlow reports as "retracing": silence it (nothing retraces).
tf.get_logger().setLevel("ERROR")

# `benchmarks/` is sys.path[0] when this script runs.
from harness import check_step_args  # noqa: E402
from harness import cpu_allocator  # noqa: E402
from harness import infer_fn  # noqa: E402
from harness import machine_summary  # noqa: E402
from harness import median_ratio  # noqa: E402
from harness import median_time  # noqa: E402
from harness import ratio_table  # noqa: E402
from harness import step_parser  # noqa: E402
from harness import steps_for  # noqa: E402
from harness import time_alternating  # noqa: E402
from harness import train_step_fn  # noqa: E402
from harness import use_quick_sizes  # noqa: E402
from harness import warm_up  # noqa: E402
from harness import write_report  # noqa: E402

from keras_attnvariants.layers.doubly_normalized_attention import (  # noqa: E402
    DoublyNormalizedAttention,
)
from keras_attnvariants.layers.hybrid_attention import HybridAttention  # noqa: E402

REFERENCE = "keras MHA"
# Issue goals for the train step at S=512, ratio to keras MHA.
GOALS = {"DNAS": 1.05, "HNAS": 1.10}
GOAL_LENGTH = 512


def make_layer(kind, num_heads, key_dim, path):
    """One attention layer of the given kind."""
    if kind == "mha":
        return keras.layers.MultiHeadAttention(num_heads, key_dim, seed=0)
    cls = DoublyNormalizedAttention if kind == "dnas" else HybridAttention
    return cls(num_heads, key_dim, attention_path=path, seed=0)


def variants(mode):
    """`(label, kind, attention_path)` of the variants of one mode."""
    if mode == "train":
        return [
            (REFERENCE, "mha", None),
            ("DNAS", "dnas", "explicit"),
            ("HNAS", "hnas", "explicit"),
        ]
    return [
        (REFERENCE, "mha", None),
        ("DNAS fused", "dnas", "fused"),
        ("DNAS explicit", "dnas", "explicit"),
        ("HNAS fused", "hnas", "fused"),
        ("HNAS explicit", "hnas", "explicit"),
    ]


def measure(mode, batch, length, dim, num_heads, repeats, steps):
    """Median time per step (s) and median ratio to MHA, per variant."""
    x = tf.constant(
        np.random.default_rng(0).normal(size=(batch, length, dim)),
        "float32",
    )
    calls = {}
    for label, kind, path in variants(mode):
        layer = make_layer(kind, num_heads, dim // num_heads, path)
        layer(x, x)  # build
        fn = train_step_fn(layer) if mode == "train" else infer_fn(layer)
        calls[label] = functools.partial(fn, x)
        warm_up(calls[label])  # compile, warm up
    times = time_alternating(calls, repeats, steps, seed=random.random())
    return {
        label: (
            median_time(times, label),
            median_ratio(times, label, REFERENCE),
        )
        for label in calls
    }


def goal_lines(results):
    """`met` / `MISSED` per goal, from one length's train results."""
    lines = []
    for label, goal in GOALS.items():
        ratio = results[label][1]
        verdict = "met" if ratio <= goal else "MISSED"
        lines.append(
            f"- goal {label} train <= {goal:.2f}x at S={GOAL_LENGTH}: "
            f"{ratio:.3f}x, {verdict}"
        )
    return "\n".join(lines)


def parse_args(argv):
    parser = step_parser(__doc__.splitlines()[0], [128, 512, 1024], 15, 0.3)
    args = parser.parse_args(argv)
    check_step_args(parser, args)
    if args.quick:
        use_quick_sizes(args, repeats=5, min_time=0.02)
    return args


def mha_steps(mode, batch, length, dim, heads, min_time):
    """Steps per timing so each takes about `min_time` seconds."""
    layer = make_layer("mha", heads, dim // heads, None)
    x = tf.zeros((batch, length, dim))
    layer(x, x)
    fn = train_step_fn(layer) if mode == "train" else infer_fn(layer)
    fn(x).numpy()
    return steps_for(functools.partial(fn, x), min_time)


def main(argv=None):
    args = parse_args(argv)
    random.seed(0)
    keras.utils.set_random_seed(0)
    title = (
        f"B={args.batch}, dim={args.dim}, heads={args.heads}, float32, "
        f"TensorFlow {tf.__version__} XLA, keras {keras.__version__}, "
        f"{machine_summary()}, CPU allocator {cpu_allocator()}, "
        f"{args.repeats} alternating repeats, median ratio to keras MHA"
        + (
            " (--quick smoke run: its timings mean nothing)"
            if args.quick
            else ""
        )
    )
    sections = [title]
    for mode in args.modes:
        results = {}
        for length in args.lengths:
            steps = mha_steps(
                mode, args.batch, length, args.dim, args.heads, args.min_time
            )
            results[length] = measure(
                mode,
                args.batch,
                length,
                args.dim,
                args.heads,
                args.repeats,
                steps,
            )
            print(f"[{mode} S={length}: {steps} steps/timing]", file=sys.stderr)
        sections.append(ratio_table(mode, results, REFERENCE, 1))
        if mode == "train" and GOAL_LENGTH in results:
            sections.append(goal_lines(results[GOAL_LENGTH]))
    write_report("\n\n".join(sections) + "\n", args.output)


if __name__ == "__main__":
    main()
