"""Train-step time with attention guidance vs without (goal <= 1.03x).

Two identical softmax-attention encoders (this package's `VariantAttention`
base, explicit path) train on the same batch; one carries a shared
`AttentionGuidanceRegularizer` (paper default head map) on every layer.
Timed blocks of compiled `train_on_batch` steps alternate between the two
models (`harness.time_alternating`, order shuffled per repeat). Reported:
the median step times and the median over repeats of the per-repeat ratio
guided / plain (machine load hits both alike).

    python benchmarks/guidance_overhead.py [--quick] [--no-xla]
        [--layers 2 --hidden 768 --heads 12 --batch-size 8]
"""

import argparse
import functools
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

# `benchmarks/` is sys.path[0] when this script runs.
from harness import cpu_allocator  # noqa: E402
from harness import device_name  # noqa: E402
from harness import machine_summary  # noqa: E402
from harness import median_ratio  # noqa: E402
from harness import median_time  # noqa: E402
from harness import time_alternating  # noqa: E402
from harness import warm_up  # noqa: E402

from keras_attnvariants.layers.variant_attention import VariantAttention  # noqa: E402
from keras_attnvariants.losses.attention_guidance import (  # noqa: E402
    AttentionGuidanceRegularizer,
)
from keras_attnvariants.losses.attention_guidance import default_head_patterns  # noqa: E402
from keras_attnvariants.ops.normalization import masked_softmax  # noqa: E402

# Issue goal for the train-step overhead of the guidance term.
GOAL = 1.03


class SoftmaxAttention(VariantAttention):
    def normalize(self, scores, mask):
        return masked_softmax(scores, mask)


def encoder(args, guided):
    keras.utils.set_random_seed(0)
    losses = []
    if guided:
        losses = [
            AttentionGuidanceRegularizer(
                default_head_patterns(args.heads), alpha=1.0, decay_steps=10**6
            )
        ]
    x = inputs = keras.Input((args.length, args.hidden))
    mask = keras.Input((args.length, args.length), dtype="bool")
    for _ in range(args.layers):
        attention = SoftmaxAttention(
            args.heads,
            args.hidden // args.heads,
            attention_losses=losses,
            attention_path="explicit",
        )
        x = keras.layers.LayerNormalization()(
            x + attention(x, x, attention_mask=mask)
        )
        ffn = keras.layers.Dense(4 * args.hidden, activation="gelu")(x)
        x = keras.layers.LayerNormalization()(
            x + keras.layers.Dense(args.hidden)(ffn)
        )
    model = keras.Model([inputs, mask], x)
    model.compile(optimizer="adam", loss="mse", jit_compile=args.xla)
    return model


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--no-xla",
        dest="xla",
        action="store_false",
        help="compile without XLA (Keras' `jit_compile='auto'` on a "
        "CPU-only TensorFlow); the default is XLA, as in every other "
        "benchmark here and on TPUs",
    )
    args = parser.parse_args(argv)
    # 0 is an error, not "the default" (`args.repeats or 15` took it so).
    for name in ("layers", "hidden", "heads", "batch_size", "repeats", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = name.replace("_", "-")
            parser.error(f"--{flag} must be >= 1, got {value}")
    if args.length < 2:
        # Sequences are between half and the full length long.
        parser.error(f"--length must be >= 2, got {args.length}")
    if args.hidden % args.heads:
        parser.error(
            f"--hidden must be divisible by --heads, got {args.hidden} and "
            f"{args.heads}"
        )
    args.repeats = args.repeats or (3 if args.quick else 15)
    args.steps = args.steps or (3 if args.quick else 10)
    return args


def machine():
    if keras.config.backend() == "tensorflow":
        return f"{machine_summary()}, CPU allocator {cpu_allocator()}"
    return f"{device_name()}; host {machine_summary()}"


def main(argv=None):
    args = parse_args(argv)
    repeats, steps = args.repeats, args.steps
    host = machine()

    rng = np.random.default_rng(0)
    shape = (args.batch_size, args.length, args.hidden)
    x = rng.normal(size=shape).astype("float32")
    lengths = rng.integers(args.length // 2, args.length + 1, args.batch_size)
    real = np.arange(args.length)[None] < lengths[:, None]
    mask = real[:, :, None] & real[:, None, :]
    y = np.zeros_like(x)
    models = {"plain": encoder(args, False), "guided": encoder(args, True)}
    calls = {
        name: functools.partial(model.train_on_batch, [x, mask], y)
        for name, model in models.items()
    }
    for call in calls.values():
        warm_up(call, times=3)  # trace, compile and warm up
    times = time_alternating(calls, repeats, steps)
    plain = median_time(times, "plain")
    guided = median_time(times, "guided")
    ratio = median_ratio(times, "guided", "plain")
    verdict = "met" if ratio <= GOAL else "MISSED"
    print(
        f"backend {keras.backend.backend()}, {host}; {args.layers} layers, "
        f"hidden {args.hidden}, {args.heads} heads, batch {args.batch_size} "
        f"x {args.length}, XLA {args.xla}, "
        f"{repeats} repeats x {steps} steps: plain {1e3 * plain:.1f} ms/step,"
        f" guided {1e3 * guided:.1f} ms/step, median ratio {ratio:.3f} "
        f"(goal <= {GOAL:.2f}x: {verdict})"
        + (
            "; --quick smoke run: its timing and verdict mean nothing"
            if args.quick
            else ""
        )
    )


if __name__ == "__main__":
    main()
