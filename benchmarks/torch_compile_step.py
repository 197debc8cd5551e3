"""PyTorch `jit_compile=True` (torch.compile) train step against keras MHA.

On the PyTorch backend `model.compile(jit_compile=True)` runs the train
step through torch.compile. Each model is one self-attention layer in a
functional model (`loss = mse`, Adam), trained with `train_on_batch` and
measured alternately in one process (shuffled order per repeat, median of
per-repeat ratios to keras MHA). Every layer has attention `dropout=0.1`
but the Gumbel one, whose training noise plays that part. The first
step's time (tracing and compiling) is reported too.

Until 2026-11-27 Dynamo broke the graph inside this package's layers (NumPy
constants of the noise hash, Keras's `SeedGenerator.next`, `ops.max`,
keras's flash-attention check), so it ran each layer call eagerly:
`tests/layers/torch_compile_graph_test.py` now traces them whole.

    python benchmarks/torch_compile_step.py --output /tmp/torch_compile.md
    python benchmarks/torch_compile_step.py --quick   # smoke run
"""

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402

# `benchmarks/` is sys.path[0] when this script runs.
from harness import machine_summary  # noqa: E402
from harness import median_ratio  # noqa: E402
from harness import median_time  # noqa: E402
from harness import output_file  # noqa: E402
from harness import time_alternating  # noqa: E402
from harness import warm_up  # noqa: E402
from harness import write_report  # noqa: E402

import keras_attnvariants as kav  # noqa: E402

REFERENCE = "keras MHA, dropout 0.1"


def layers(num_heads, key_dim):
    return {
        REFERENCE: lambda: keras.layers.MultiHeadAttention(
            num_heads, key_dim, dropout=0.1, seed=1
        ),
        "DNAS, dropout 0.1": lambda: kav.DoublyNormalizedAttention(
            num_heads, key_dim, dropout=0.1, seed=1
        ),
        "HNAS, dropout 0.1": lambda: kav.HybridAttention(
            num_heads, key_dim, dropout=0.1, seed=1
        ),
        "Gumbel (relaxed)": lambda: kav.GumbelDiscreteAttention(
            num_heads, key_dim, seed=1
        ),
    }


def build_step(factory, batch, length, dim):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((length, dim))
    model = keras.Model(inputs, factory()(inputs, inputs))
    model.compile("adam", "mse", jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, length, dim)).astype("float32")
    y = np.zeros_like(x)

    def step():
        return model.train_on_batch(x, y)

    return step


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--key-dim", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--output", type=output_file, default=None)
    args = parser.parse_args(argv)
    for name in ("batch_size", "length", "heads", "key_dim", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.quick:
        args.batch_size, args.length, args.repeats, args.steps = 2, 8, 2, 2
    return args


def main(argv=None):
    args = parse_args(argv)
    dim = args.heads * args.key_dim
    steps, compile_seconds = {}, {}
    for label, factory in layers(args.heads, args.key_dim).items():
        step = build_step(factory, args.batch_size, args.length, dim)
        start = time.perf_counter()
        step()
        compile_seconds[label] = time.perf_counter() - start
        warm_up(step, times=3)
        steps[label] = step
    times = time_alternating(steps, args.repeats, args.steps)
    lines = [
        "# PyTorch train step under `jit_compile=True` (torch.compile)",
        "",
        f"{machine_summary()}; torch backend, float32, batch "
        f"{args.batch_size} x {args.length}, {args.heads} heads of "
        f"{args.key_dim}; {args.repeats} repeats x {args.steps} steps.",
        "",
        "| layer | first step (s) | step (ms) | vs keras MHA |",
        "| --- | --- | --- | --- |",
    ]
    for label in steps:
        lines.append(
            f"| {label} | {compile_seconds[label]:.1f} | "
            f"{1e3 * median_time(times, label):.2f} | "
            f"{median_ratio(times, label, REFERENCE):.2f}x |"
        )
    write_report("\n".join(lines) + "\n", args.output)


if __name__ == "__main__":
    sys.exit(main())
