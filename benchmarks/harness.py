"""Shared timing harness of the benchmark scripts (TensorFlow backend, XLA).

- `train_step_fn` / `infer_fn`: one compiled (`jit_compile=True`) train step
  or forward pass of one self-attention layer. The train step minimizes
  `mean(y^2)` plus every loss the layer added with `add_loss` (attached
  attention losses), with an SGD update; `compiled_train_step` /
  `compiled_infer` take XLA on or off.
- `time_alternating`: every callable is timed once per repeat, in a shuffled
  order, so a change in machine load hits all of them alike;
  `median_ratio` then gives the median over repeats of the per-repeat
  ratio to a reference.
- `machine_info`: CPU model, cores, load average, versions, date;
  `machine_summary`: the same machine in one line (the per-feature
  scripts' headers); `load_average_1min`: the 1-minute load average alone.

The scripts import this module by name (`benchmarks/` is `sys.path[0]`
when a script in it runs). The compiled-step helpers need TensorFlow (set
`KERAS_BACKEND=tensorflow` before importing); the timing helpers
(`time_alternating`, `median_ratio`, `steps_for`, `warm_up`) take any
callables and serve `accelerator_step.py` without TensorFlow installed.
"""

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import time

import keras
import numpy as np

# `--output`'s type (a file whose folder exists), as the examples check it.
from keras_attnvariants._argparse_types import output_file  # noqa: F401

try:  # the timing helpers below serve every backend
    import tensorflow as tf
except ImportError:  # e.g. a JAX / PyTorch-only accelerator machine
    tf = None


def train_step_fn(layer, learning_rate=1e-4):
    """A compiled train step of `layer` (built): forward, backward, SGD.

    The loss is `mean(y^2)` plus the layer's `add_loss` terms of the call
    (attention losses run only with `training=True`).
    """
    return compiled_train_step(layer, True, learning_rate)


def infer_fn(layer):
    """A compiled forward pass of `layer`, `training=False`."""
    return compiled_infer(layer, True)


def compiled_train_step(layer, jit_compile, learning_rate=1e-4):
    """`train_step_fn`, with XLA on or off (`tf.function(jit_compile=...)`)."""
    optimizer = keras.optimizers.SGD(learning_rate)
    variables = layer.trainable_variables

    @tf.function(jit_compile=jit_compile)
    def step(x):
        with tf.GradientTape() as tape:
            y = layer(x, x, training=True)
            loss = tf.reduce_mean(tf.square(tf.cast(y, "float32")))
            for term in layer.losses:
                loss = loss + tf.cast(term, "float32")
        grads = tape.gradient(loss, variables)
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])
        return loss

    return step


def compiled_infer(layer, jit_compile):
    """`infer_fn`, with XLA on or off (`tf.function(jit_compile=...)`)."""

    @tf.function(jit_compile=jit_compile)
    def forward(x):
        return tf.reduce_sum(tf.cast(layer(x, x, training=False), "float32"))

    return forward


def matmul_fn(size):
    """A compiled dense `(size, size) @ (size, size)` float32 matmul.

    Returns `(call, flops)`: a zero-argument callable and its FLOP count
    `2 size^3`.
    """
    rng = np.random.default_rng(1)
    a = tf.constant(rng.normal(size=(size, size)), "float32")
    b = tf.constant(rng.normal(size=(size, size)), "float32")

    @tf.function(jit_compile=True)
    def matmul(a, b):
        return tf.reduce_sum(tf.matmul(a, b))

    return (lambda: matmul(a, b)), 2.0 * size**3


def dtype_policy(text):
    """argparse type: a Keras dtype policy name (a bad one failed after
    the benchmark had started)."""
    try:
        keras.DTypePolicy(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).splitlines()[0]) from None
    return text


def step_parser(description, lengths, repeats, min_time):
    """`argparse` parser with the options every step benchmark shares.

    `--quick`, `--output`, `--batch` (8), `--dim` (256), `--heads` (4),
    `--lengths`, `--modes` (train, infer), `--repeats`, `--min-time`;
    `check_step_args` validates them after parsing.
    """
    parser = argparse.ArgumentParser(
        description=description,
        usage="%(prog)s [--quick] [options] (see --help)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument(
        "--output", type=output_file, help="also write the tables here"
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs="+", default=lengths)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["train", "infer"],
        choices=["train", "infer"],
    )
    parser.add_argument(
        "--repeats", type=int, default=repeats, help="alternating repeats"
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=min_time,
        help="seconds of keras MHA work per timing (sets the step count)",
    )
    return parser


def use_quick_sizes(args, repeats=3, min_time=0.01):
    """`--quick`: the tiny sizes of a CI smoke run (its timings mean
    nothing): batch 2, dim 32, 2 heads, S=32."""
    args.batch, args.dim, args.heads = 2, 32, 2
    args.lengths, args.repeats, args.min_time = [32], repeats, min_time


def check_step_args(parser, args):
    """`parser.error` for sizes below 1, a negative `--min-time` or `--dim`
    not divisible."""
    for name in ("batch", "dim", "heads", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.lengths) < 1:
        parser.error(f"--lengths must be >= 1, got {args.lengths}")
    if not args.min_time >= 0:  # also NaN
        parser.error(f"--min-time must be >= 0, got {args.min_time}")
    if args.dim % args.heads:
        parser.error(
            f"--dim must be divisible by --heads, got {args.dim} and "
            f"{args.heads}"
        )


def write_report(text, path=None):
    """Prints `text` and, with `path`, writes it there too."""
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text)


def length_table(title, results, cell):
    """One Markdown table: rows = variants, columns = sequence lengths.

    `results`: `{length: {label: row, ...}}` (every length has the same
    labels, in row order); `cell(label, length)` is the text of one cell.
    """
    lengths = sorted(results)
    labels = list(results[lengths[0]])
    header = f"| {title} | " + " | ".join(f"S={s}" for s in lengths)
    lines = [header + " |", "|---" * (len(lengths) + 1) + "|"]
    for label in labels:
        cells = [cell(label, s) for s in lengths]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_table(title, results, reference, ms_digits=1):
    """`length_table` of `{length: {label: (seconds, ratio to reference,
    ...)}}`: the reference row shows its time, the others `ratio (time)`.
    """

    def cell(label, length):
        seconds, ratio = results[length][label][:2]
        time = f"{seconds * 1e3:.{ms_digits}f} ms"
        return time if label == reference else f"{ratio:.2f}x ({time})"

    return length_table(title, results, cell)


def warm_up(call, times=2):
    """Runs `call` `times` times (the first call compiles).

    Keep `times >= 2`: the first run after compiling is slower than the
    steady state (measured ~10% for a small XLA train step), so a
    configuration warmed up by its compiling call alone starts its first
    timing cold.
    """
    for _ in range(times):
        np.asarray(call())


def steps_for(call, min_time):
    """Steps per timing so that one timing takes about `min_time` seconds."""
    start = time.perf_counter()
    np.asarray(call())
    once = time.perf_counter() - start
    return max(1, int(min_time / max(once, 1e-6)))


def time_alternating(calls, repeats, steps, seed=0):
    """Seconds per step of every callable, one value per repeat.

    Args:
        calls: dict `label -> callable()` returning a tensor (compiled and
            warmed up).
        repeats: int. Each repeat times every callable once, in an order
            shuffled per repeat.
        steps: int, or dict `label -> int`: calls per timing (the result
            is fetched once at the end of the timing).
        seed: int. Seed of the shuffles.

    Returns:
        dict `label -> list` of seconds per step, in repeat order.
    """
    shuffler = random.Random(seed)
    times = {label: [] for label in calls}
    order = list(calls)
    for _ in range(repeats):
        shuffler.shuffle(order)
        for label in order:
            call = calls[label]
            count = steps[label] if isinstance(steps, dict) else steps
            start = time.perf_counter()
            for _ in range(count):
                out = call()
            np.asarray(out)
            times[label].append((time.perf_counter() - start) / count)
    return times


def median_ratio(times, label, reference):
    """Median over repeats of `times[label] / times[reference]`."""
    return statistics.median(
        a / b for a, b in zip(times[label], times[reference])
    )


def median_time(times, label):
    """Median seconds per step of `label`."""
    return statistics.median(times[label])


def cpu_model():
    """CPU model name from `/proc/cpuinfo` (or `platform.processor()`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags():
    """The vector extensions among the CPU flags (avx2, fma, avx512f)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    wanted = ("avx2", "fma", "avx512f")
                    return [flag for flag in wanted if flag in flags]
    except OSError:
        pass
    return []


def load_average():
    """The 1/5/15-minute load averages, formatted."""
    try:
        return " / ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def load_average_1min():
    """The 1-minute load average, or `None` where unavailable."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def cpu_count():
    """CPU cores this process may run on (its affinity), else `os.cpu_count`.

    `os.cpu_count()` counts the host's cores, also those a container or
    `taskset` keeps the process off.
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def utc_date():
    """The current date and time, `YYYY-MM-DD HH:MM UTC`."""
    return datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"
    )


def machine_summary():
    """The host in one line: CPU model, usable cores, architecture, vector
    extensions, 1-minute load average and date."""
    load = load_average_1min()
    load = "unknown" if load is None else f"{load:.2f}"
    flags = ", ".join(cpu_flags()) or "none listed"
    return (
        f"{cpu_model()}, {cpu_count()} cores ({platform.machine()}; "
        f"{flags}), 1-min load average {load}, {utc_date()}"
    )


def cpu_allocator():
    """Which TensorFlow CPU allocator this process uses, in words.

    TensorFlow's default CPU allocator takes every large buffer from
    `malloc`; glibc serves blocks above its 32 MiB mmap ceiling with fresh
    `mmap`s, so each such buffer is page-faulted in again on every step.
    `TF_CPU_ALLOCATOR_USE_BFC=true` pools them (README, "CPU notes").
    """
    value = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "")
    if value.lower() in ("1", "true"):
        return "BFC pool (TF_CPU_ALLOCATOR_USE_BFC=true)"
    return "TensorFlow default (malloc)"


def compiled_flops(compiled):
    """XLA's FLOP count of one call of a compiled JAX function, or `None`
    where the platform reports none.

    `compiled` is `jax.jit(f).lower(*args).compile()`. XLA counts every
    instruction of the optimized program (two per multiply-add, one per
    elementwise operation), so a ratio of two counts is the time ratio the
    two programs would have at the same FLOP rate.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:  # not every platform reports it
        return None
    if isinstance(cost, (list, tuple)):  # one dict per device (older jax)
        cost = cost[0] if cost else None
    if not cost or cost.get("flops") is None:
        return None
    return float(cost["flops"])


def host_flops(function, *args):
    """XLA's FLOP count of `function(*args)` compiled for the host CPU
    (JAX), or `None` where there is no count.

    Counted on the CPU on every machine: XLA:GPU's `cost_analysis()` leaves
    out the matmuls it hands to cuBLAS (on an H100 the 6-block KQ train step
    of `kq_alignment_overhead.py` counted 71 GFLOP of its ~970, its
    64-wide adversaries in full), so GPU counts understate exactly the
    large matmuls a ratio compares against. The CPU program is the same
    computation; the count is of its arithmetic, not of a platform's time.
    """
    import jax

    try:
        cpu = jax.devices("cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS without the CPU
        return None
    args = jax.device_put(args, cpu)
    return compiled_flops(jax.jit(function).lower(*args).compile())


def device_name():
    """The device the backend computes on, in words (JAX, PyTorch)."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}: {device.device_kind}; jax {jax.__version__}"
    if backend == "torch":
        import torch

        name = (
            torch.cuda.get_device_name(0)
            if torch.cuda.is_available()
            else f"cpu ({platform.machine()})"
        )
        return f"{name}; torch {torch.__version__}"
    return keras.config.backend()


def machine_info():
    """dict describing the machine, backend, versions and date."""
    return {
        "date": utc_date(),
        "cpu": cpu_model(),
        "cpu_flags": ", ".join(cpu_flags()) or "none listed",
        "nproc": cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__ if tf is not None else "not installed",
        "keras": keras.__version__,
        "numpy": np.__version__,
        "backend": keras.backend.backend(),
        "load": load_average(),
        "allocator": cpu_allocator(),
        "argv": " ".join(sys.argv),
    }
