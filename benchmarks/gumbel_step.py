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

import argparse
import os
import platform
import random
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_attnvariants.layers.gumbel_discrete_attention import (  # noqa: E402
    GumbelDiscreteAttention,
)

REFERENCE = "keras MHA"


def make_layer(options, num_heads, key_dim):
    """MHA when `options` is None, else a `GumbelDiscreteAttention`."""
    if options is None:
        return keras.layers.MultiHeadAttention(num_heads, key_dim, seed=0)
    return GumbelDiscreteAttention(num_heads, key_dim, seed=0, **options)


def train_step_fn(layer, xla):
    """A compiled train step: forward, backward, SGD update."""
    optimizer = keras.optimizers.SGD(1e-4)
    variables = layer.trainable_variables

    @tf.function(jit_compile=xla)
    def step(x):
        with tf.GradientTape() as tape:
            y = layer(x, x, training=True)
            loss = tf.reduce_mean(tf.square(y))
        grads = tape.gradient(loss, variables)
        optimizer.apply(grads, variables)
        return loss

    return step


def infer_fn(layer, xla):
    """A compiled forward pass."""

    @tf.function(jit_compile=xla)
    def forward(x):
        return tf.reduce_sum(layer(x, x, training=False))

    return forward


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
    """A built layer's compiled, warmed-up step function."""
    layer = make_layer(options, num_heads, x.shape[-1] // num_heads)
    layer(x, x)  # build
    fn = train_step_fn(layer, xla) if mode == "train" else infer_fn(layer, xla)
    fn(x).numpy()  # compile
    fn(x).numpy()  # warm up
    return fn


def measure(mode, x, num_heads, repeats, min_time, xla):
    """Median time per step (s), median ratio to MHA, steps per timing."""
    fns = {
        label: compiled(mode, options, x, num_heads, xla)
        for label, options in variants(mode)
    }
    start = time.perf_counter()
    fns[REFERENCE](x).numpy()
    once = time.perf_counter() - start
    steps = max(1, int(min_time / max(once, 1e-6)))
    times = {label: [] for label in fns}
    ratios = {label: [] for label in fns}
    order = list(fns)
    for _ in range(repeats):
        random.shuffle(order)
        this_repeat = {}
        for label in order:
            fn = fns[label]
            start = time.perf_counter()
            for _ in range(steps):
                out = fn(x)
            out.numpy()
            this_repeat[label] = (time.perf_counter() - start) / steps
        for label, seconds in this_repeat.items():
            times[label].append(seconds)
            ratios[label].append(seconds / this_repeat[REFERENCE])
    results = {
        label: (
            statistics.median(times[label]),
            statistics.median(ratios[label]),
        )
        for label in fns
    }
    return results, steps


def markdown_table(mode, results):
    """One Markdown table: rows = variants, columns = sequence lengths."""
    lengths = sorted(results)
    labels = list(results[lengths[0]])
    header = "| " + mode + " | " + " | ".join(f"S={s}" for s in lengths)
    lines = [header + " |", "|---" * (len(lengths) + 1) + "|"]
    for label in labels:
        cells = []
        for s in lengths:
            seconds, ratio = results[s][label]
            if label == REFERENCE:
                cells.append(f"{seconds * 1e3:.2f} ms")
            else:
                cells.append(f"{ratio:.2f}x ({seconds * 1e3:.2f} ms)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage="%(prog)s [--quick] [options] (see --help)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--output", help="also write the tables here")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[128, 512, 1024]
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["train", "infer"],
        choices=["train", "infer"],
    )
    parser.add_argument(
        "--repeats", type=int, default=15, help="alternating repeats"
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=0.3,
        help="seconds of work per variant per repeat (sets the step count)",
    )
    parser.add_argument(
        "--no-xla", action="store_true", help="tf.function without XLA"
    )
    args = parser.parse_args(argv)
    for name in ("batch", "dim", "heads", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.lengths) < 1:
        parser.error(f"--lengths must be >= 1, got {args.lengths}")
    if args.dim % args.heads:
        parser.error(
            f"--dim must be divisible by --heads, got {args.dim} and "
            f"{args.heads}"
        )
    if args.quick:
        args.batch, args.dim, args.heads = 2, 32, 2
        args.lengths, args.repeats, args.min_time = [32], 3, 0.01
        args.no_xla = True  # XLA compiles dominate a smoke run
    return args


def load_average():
    """The 1-minute load average, or `None` where unavailable."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def main(argv=None):
    args = parse_args(argv)
    random.seed(0)
    keras.utils.set_random_seed(0)
    load_before = load_average()
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
        sections.append(markdown_table(mode, results))
    title = (
        f"B={args.batch}, dim={args.dim}, heads={args.heads}, float32, "
        f"TensorFlow {tf.__version__} {'eager graph' if args.no_xla else 'XLA'}"
        f", keras {keras.__version__}, {os.cpu_count()} CPU "
        f"({platform.machine()}), 1-min load average {load_before} before / "
        f"{load_average()} after, {args.repeats} alternating repeats, "
        "median ratio to keras MHA"
    )
    text = "\n\n".join([title, *sections]) + "\n"
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
