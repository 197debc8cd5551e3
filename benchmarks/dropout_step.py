"""Train-step time with attention dropout against keras MultiHeadAttention.

This package's layers drop attention weights with
`ops.noise.positional_dropout` (a hash of the generator state and each
weight's index: stable under padding, distinct per replica); Keras MHA uses
`keras.layers.Dropout` (`keras.random`). Every layer here has the same
`dropout` rate, so the table compares the whole train step of one
self-attention layer (`loss = mean(y^2)`, SGD, `training=True`), measured
alternately in one process (shuffled order per repeat, median of per-repeat
ratios to keras MHA with dropout). Rows:

- keras MHA, dropout: the reference.
- keras MHA, no dropout: what the reference's dropout costs.
- softmax (`HybridAttention(hybrid_init=0.0)`: MHA's weights, but computed
  as a hybrid with share 0, both normalizations and the mix, so its step
  is not keras MHA's) without dropout, and with this package's dropout:
  folded into the value product (the default), on written-out weights,
  and with Keras's `Dropout` swapped in on written-out weights: the two
  dropouts side by side on one layer.
- DNAS, HNAS and Gumbel (relaxed) with this package's dropout.

A second table gives what each dropout costs: the median over repeats of
the step time with dropout over the same layer's without it in the same
repeat (keras MHA over keras MHA, the softmax rows over "softmax, no
dropout"). Comparing the softmax rows with keras MHA without dropout
instead would count the hybrid layer's own overhead as dropout's. The
"weights written out" and "Keras Dropout" rows write the weights out,
which "softmax, no dropout" does not (it folds them into the value
product): their cost includes that write-out, and says so.

TensorFlow backend with XLA (`tf.function(jit_compile=True)`) unless
`--no-xla`.

    python benchmarks/dropout_step.py --output /tmp/dropout.md
    python benchmarks/dropout_step.py --quick   # CI smoke run, < 30 s
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

tf.get_logger().setLevel("ERROR")

# `benchmarks/` is sys.path[0] when this script runs.
from harness import check_step_args  # noqa: E402
from harness import compiled_train_step  # noqa: E402
from harness import length_table  # noqa: E402
from harness import load_average  # noqa: E402
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

from keras_attnvariants.layers import variant_attention  # noqa: E402
from keras_attnvariants.layers.doubly_normalized_attention import (  # noqa: E402
    DoublyNormalizedAttention,
)
from keras_attnvariants.layers.gumbel_discrete_attention import (  # noqa: E402
    GumbelDiscreteAttention,
)
from keras_attnvariants.layers.hybrid_attention import HybridAttention  # noqa: E402

REFERENCE = "keras MHA, dropout"
FOLDED = "softmax, this package's dropout"
KERAS_DROPOUT = "softmax, Keras Dropout"
# The package's dropout on materialized weights (folding turned off).
MATERIALIZED = "softmax, this package's dropout, weights written out"
# The same softmax layer without dropout: the baseline of the three above.
NO_DROPOUT = "softmax, no dropout"
MHA_NO_DROPOUT = "keras MHA, no dropout"
# Rows that write the weights out, where "softmax, no dropout" folds them
# into the value product: their cost over it includes the write-out.
WRITTEN_OUT = (MATERIALIZED, KERAS_DROPOUT)
# Dropout cost: `row with dropout -> the same layer without dropout`.
COST_BASELINES = {
    REFERENCE: MHA_NO_DROPOUT,
    FOLDED: NO_DROPOUT,
    MATERIALIZED: NO_DROPOUT,
    KERAS_DROPOUT: NO_DROPOUT,
}


def make_layer(label, heads, key_dim, rate):
    """The layer of one row (unbuilt)."""
    common = {"num_heads": heads, "key_dim": key_dim, "seed": 0}
    if label == REFERENCE:
        return keras.layers.MultiHeadAttention(dropout=rate, **common)
    if label == MHA_NO_DROPOUT:
        return keras.layers.MultiHeadAttention(**common)
    if label == NO_DROPOUT:
        return HybridAttention(hybrid_init=0.0, **common)
    if label in (FOLDED, MATERIALIZED, KERAS_DROPOUT):
        return HybridAttention(hybrid_init=0.0, dropout=rate, **common)
    if label == "DNAS":
        return DoublyNormalizedAttention(dropout=rate, **common)
    if label == "HNAS":
        return HybridAttention(dropout=rate, **common)
    return GumbelDiscreteAttention(dropout=rate, **common)


LABELS = (
    REFERENCE,
    MHA_NO_DROPOUT,
    NO_DROPOUT,
    FOLDED,
    MATERIALIZED,
    KERAS_DROPOUT,
    "DNAS",
    "HNAS",
    "Gumbel (relaxed)",
)


def dropout_costs(times):
    """`{row with dropout: median over repeats of its time over the same
    layer's time without dropout in the same repeat}` (`COST_BASELINES`)."""
    return {
        label: median_ratio(times, label, baseline)
        for label, baseline in COST_BASELINES.items()
    }


def cost_table(costs):
    """`{length: dropout_costs(...)}` as a table, one row per
    `COST_BASELINES` pair."""
    rows = {
        f"{label} / {base}"
        + (
            " (incl. writing the weights out)" if label in WRITTEN_OUT else ""
        ): label
        for label, base in COST_BASELINES.items()
    }

    def cell(row, length):
        return f"{costs[length][rows[row]]:.2f}x"

    return length_table(
        "train, with dropout / the same layer without",
        {length: dict.fromkeys(rows) for length in costs},
        cell,
    )


def keras_dropout(layer):
    """`layer`'s `positional_dropout` replaced by its Keras `Dropout`
    layer while the step is traced (the comparison row)."""

    def dropout(weights, rate, seed_generator):
        return layer._dropout_layer(weights, training=True)

    return dropout


def compiled(label, x, heads, rate, xla):
    layer = make_layer(label, heads, x.shape[-1] // heads, rate)
    layer(x, x)  # build
    if label in (MATERIALIZED, KERAS_DROPOUT):
        # Dropout on written-out weights (`VariantAttention._attend`), as
        # before the folded paths took it.
        layer._folds_dropout = lambda: False
    step = compiled_train_step(layer, xla)
    if label == KERAS_DROPOUT:
        original = variant_attention.positional_dropout
        variant_attention.positional_dropout = keras_dropout(layer)
        try:
            step.get_concrete_function(x)  # traced with Keras's Dropout
        finally:
            variant_attention.positional_dropout = original
    call = functools.partial(step, x)
    warm_up(call)
    return call


def parse_args(argv):
    parser = step_parser(__doc__.splitlines()[0], [128, 512], 11, 0.3)
    # Dropout is off at inference: only the train step is timed.
    parser.set_defaults(modes=["train"])
    parser.add_argument(
        "--rate", type=float, default=0.1, help="attention dropout rate"
    )
    parser.add_argument(
        "--no-xla", action="store_true", help="tf.function without XLA"
    )
    args = parser.parse_args(argv)
    check_step_args(parser, args)
    if not 0.0 < args.rate < 1.0:
        parser.error(f"--rate must be in (0, 1), got {args.rate}")
    if set(args.modes) != {"train"}:
        parser.error(
            "--modes: only train (attention dropout is off at inference), "
            f"got {' '.join(args.modes)}"
        )
    if args.quick:
        use_quick_sizes(args)
        args.no_xla = True  # XLA compiles dominate a smoke run
    return args


def main(argv=None):
    args = parse_args(argv)
    random.seed(0)
    keras.utils.set_random_seed(0)
    machine = machine_summary()
    results, costs = {}, {}
    for length in args.lengths:
        x = tf.constant(
            np.random.default_rng(0).normal(
                size=(args.batch, length, args.dim)
            ),
            "float32",
        )
        calls = {
            label: compiled(label, x, args.heads, args.rate, not args.no_xla)
            for label in LABELS
        }
        steps = steps_for(calls[REFERENCE], args.min_time)
        times = time_alternating(calls, args.repeats, steps, seed=length)
        results[length] = {
            label: (
                median_time(times, label),
                median_ratio(times, label, REFERENCE),
            )
            for label in LABELS
        }
        costs[length] = dropout_costs(times)
        print(f"[S={length}: {steps} steps/timing]", file=sys.stderr)
    lines = [
        f"Attention dropout {args.rate}, train step, B={args.batch}, "
        f"dim={args.dim}, heads={args.heads}, float32, TensorFlow "
        f"{tf.__version__} "
        f"{'tf.function without XLA' if args.no_xla else 'XLA'}, keras "
        f"{keras.__version__}, {machine}; load average after "
        f"{load_average()}; {args.repeats} alternating repeats"
        + (" (--quick: timings mean nothing)" if args.quick else "")
        + ".",
        "",
        ratio_table(
            "train, ratio to keras MHA with dropout", results, REFERENCE
        ),
        "",
        cost_table(costs),
    ]
    write_report("\n".join(lines) + "\n", args.output)


if __name__ == "__main__":
    main()
