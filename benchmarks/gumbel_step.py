"""Step time of GumbelDiscreteAttention against keras MultiHeadAttention.

TensorFlow backend, XLA (`jit_compile=True`) unless `--no-xla`. Every
variant is built in the same process and measured alternately: each repeat
times every variant once, in a shuffled order, so a change in machine load
hits all of them alike. A cell is the median over repeats of the variant's
time divided by the MultiHeadAttention time of the same repeat.

- train: forward, backward and an SGD update of one self-attention layer
  (`loss = mean(y^2)`), `training=True`: the relaxed Gumbel-softmax sample
  (noise from `keras.random`, float32 log-softmax and softmax) and its
  straight-through variant, against MHA's softmax.
- infer: forward only, `training=False`: `inference_mode="argmax"` (scores,
  argmax, then a gather of one value row per query) and `"soft"`, against
  MHA (its fused `dot_product_attention` path).

Usage:

    python benchmarks/gumbel_step.py --output docs/bench.md
    python benchmarks/gumbel_step.py --quick   # CI: tiny, no XLA, < 30 s
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
from harness import compiled_infer  # noqa: E402
from harness import compiled_train_step  # noqa: E402
from harness import cpu_allocator  # noqa: E402
from harness import load_average_1min as load_average  # noqa: E402
from harness import machine_summary  # noqa: E402
from harness import median_ratio  # noqa: E402
from harness import median_time  # noqa: E402
from harness import ratio_table  # noqa: E402
from harness import step_parser  # noqa: E402
from harness import steps_for  # noqa: E402
from harness import time_alternating  # noqa: E402
from harness import use_quick_sizes  # noqa: E402
from harness import warm_up  # noqa: E402
from harness import write_report  # noqa: E402

from keras_attnvariants.layers.gumbel_discrete_attention import (  # noqa: E402
    GumbelDiscreteAttention,
)

REFERENCE = "keras MHA"
# Issue goals, ratio to keras MHA: `(mode, variant label) -> ratio`.
GOALS = {
    ("train", "Gumbel relaxed"): 1.10,
    ("train", "Gumbel straight-through"): 1.10,
    ("infer", "Gumbel argmax (gather)"): 0.90,
}


def make_layer(options, num_heads, key_dim):
    """MHA when `options` is None, else a `GumbelDiscreteAttention`."""
    if options is None:
        return keras.layers.MultiHeadAttention(num_heads, key_dim, seed=0)
    return GumbelDiscreteAttention(num_heads, key_dim, seed=0, **options)


def variants(mode):
    """`(label, GumbelDiscreteAttention options or None)` of one mode."""
    if mode == "train":
        return [
            (REFERENCE, None),
            ("Gumbel relaxed", {}),
            ("Gumbel straight-through", {"straight_through": True}),
        ]
    return [
        (REFERENCE, None),
        ("Gumbel argmax (gather)", {"inference_mode": "argmax"}),
        ("Gumbel soft", {"inference_mode": "soft"}),
    ]


def compiled(mode, options, x, num_heads, xla):
    """A built layer's compiled, warmed-up step, as a zero-argument call."""
    layer = make_layer(options, num_heads, x.shape[-1] // num_heads)
    layer(x, x)  # build
    if mode == "train":
        fn = compiled_train_step(layer, xla)
    else:
        fn = compiled_infer(layer, xla)
    call = functools.partial(fn, x)
    warm_up(call)  # compile, warm up
    return call


def measure(mode, x, num_heads, repeats, min_time, xla):
    """Median time per step (s), median ratio to MHA, steps per timing."""
    calls = {
        label: compiled(mode, options, x, num_heads, xla)
        for label, options in variants(mode)
    }
    steps = steps_for(calls[REFERENCE], min_time)
    times = time_alternating(calls, repeats, steps, seed=random.random())
    results = {
        label: (
            median_time(times, label),
            median_ratio(times, label, REFERENCE),
        )
        for label in calls
    }
    return results, steps


def goal_lines(mode, results):
    """`met` / `MISSED` per goal of `mode`, at every measured length."""
    lines = []
    for (goal_mode, label), goal in GOALS.items():
        if goal_mode != mode:
            continue
        cells = []
        for s in sorted(results):
            ratio = results[s][label][1]
            verdict = "met" if ratio <= goal else "MISSED"
            cells.append(f"S={s} {ratio:.3f}x {verdict}")
        lines.append(
            f"- goal {label} {mode} <= {goal:.2f}x: " + ", ".join(cells)
        )
    return "\n".join(lines)


def parse_args(argv):
    parser = step_parser(__doc__.splitlines()[0], [128, 512, 1024], 15, 0.3)
    parser.add_argument(
        "--no-xla", action="store_true", help="tf.function without XLA"
    )
    args = parser.parse_args(argv)
    check_step_args(parser, args)
    if args.quick:
        use_quick_sizes(args)
        args.no_xla = True  # XLA compiles dominate a smoke run
    return args


def main(argv=None):
    args = parse_args(argv)
    random.seed(0)
    keras.utils.set_random_seed(0)
    machine = machine_summary()
    sections = []
    for mode in args.modes:
        results = {}
        for length in args.lengths:
            x = tf.constant(
                np.random.default_rng(0).normal(
                    size=(args.batch, length, args.dim)
                ),
                "float32",
            )
            results[length], steps = measure(
                mode,
                x,
                args.heads,
                args.repeats,
                args.min_time,
                not args.no_xla,
            )
            print(f"[{mode} S={length}: {steps} steps/timing]", file=sys.stderr)
        sections.append(ratio_table(mode, results, REFERENCE, 2))
        sections.append(goal_lines(mode, results))
    load_after = load_average()
    title = (
        f"B={args.batch}, dim={args.dim}, heads={args.heads}, float32, "
        f"TensorFlow {tf.__version__} "
        f"{'tf.function without XLA' if args.no_xla else 'XLA'}"
        f", keras {keras.__version__}, {machine}; 1-min load average after "
        + ("unknown" if load_after is None else f"{load_after:.2f}")
        + f", CPU allocator {cpu_allocator()}, {args.repeats} alternating "
        "repeats, median ratio to keras MHA"
        + (
            " (--quick smoke run without XLA: its timings and verdicts "
            "mean nothing)"
            if args.quick
            else ""
        )
    )
    write_report("\n\n".join([title, *sections]) + "\n", args.output)


if __name__ == "__main__":
    main()
