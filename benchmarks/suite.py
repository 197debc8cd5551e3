"""Benchmark suite: every attention variant and loss against keras MHA.

One self-attention layer (query = key = value = x, float32, no mask) per
configuration, TensorFlow backend with XLA (`jit_compile=True`):

- variants: `keras.layers.MultiHeadAttention` (the reference),
  `DoublyNormalizedAttention`, `HybridAttention` (mix 0.5),
  `GumbelDiscreteAttention` (relaxed sample in training, argmax at
  inference);
- losses, attached with `attention_losses=[...]` to
  `HybridAttention(hybrid_init=0.0)` and compared with the same layer
  without loss: `AttentionGuidanceRegularizer(default_head_patterns(N),
  alpha=1.0)` and `KQAlignment(method)` for gan, ct, ot, mmd.

Per sequence length S and mode (train: forward, backward of `mean(y^2)`
plus the attached loss terms, SGD update; infer: forward with
`training=False`), all configurations and a dense matmul are built in one
process and timed alternately (order shuffled per repeat); a cell is the
median over repeats of the per-repeat ratio to keras MHA. Achieved FLOP/s =
analytic matmul FLOPs of the layer / step time, relative to the matmul
FLOP/s of the same repeat. Peak memory = peak bytes held by TensorFlow's
CPU allocator during one step above those held before it (inputs,
weights), in a fresh subprocess that runs the BFC allocator
(`TF_CPU_ALLOCATOR_USE_BFC=true`), whose statistics count every tensor and
every XLA temporary buffer, its pool first grown by one region larger than
any step (`reserve_mib`) so that each buffer is counted at its own size.
(The process RSS high-water mark, used before 2026-11-25, missed the step's
buffers: XLA:CPU reuses its memory between calls.)

Usage:

    python benchmarks/suite.py --output benchmarks/results.md   # full
    python benchmarks/suite.py --quick --output /tmp/quick.md   # CI, < 60 s
"""

import argparse
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if "--quick" in sys.argv:
    # Smoke run: unoptimized XLA code generation compiles ~2x faster.
    os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Every configuration gets its own tf.function: silence retracing warnings.
tf.get_logger().setLevel("ERROR")

# `benchmarks/` is sys.path[0] when this script runs.
from harness import infer_fn  # noqa: E402
from harness import load_average  # noqa: E402
from harness import machine_info  # noqa: E402
from harness import matmul_fn  # noqa: E402
from harness import median_ratio  # noqa: E402
from harness import median_time  # noqa: E402
from harness import output_file  # noqa: E402
from harness import steps_for  # noqa: E402
from harness import time_alternating  # noqa: E402
from harness import train_step_fn  # noqa: E402
from harness import warm_up  # noqa: E402

import keras_attnvariants as kav  # noqa: E402
from keras_attnvariants.losses import default_head_patterns  # noqa: E402

REFERENCE = "keras MHA"
NO_LOSS = "HybridAttention(hybrid_init=0.0)"
MATMUL = "dense matmul"
KQ_METHODS = ("gan", "ct", "ot", "mmd")
MODES = ("train", "infer")
# TensorFlow's CPU allocator keeps statistics (current and peak bytes)
# only as a BFC allocator.
ALLOCATOR_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}
# One free region of this size, made before any step (`memory_child`). BFC
# hands out a free chunk whole unless it is at least twice the request or
# 128 MiB more; grown on demand its pool is power-of-two chunks, and the
# cells read chunk sizes, not the step's bytes (until 2026-11-29: keras MHA
# 128 MiB at S=512 where its step holds 69 at inference; two layers of one
# compiled program 7.1 and 12.8 MiB). A region larger than every step is
# split to the bytes requested; a step beyond it would grow the pool again.
# 4 GiB at the default sizes (32 of their largest (B, N, S, S) float32
# tensors, 128 MiB), at most; smaller sizes take less (`reserve_mib`): the
# `--quick` run's steps of under 2 MiB held 4 GiB of zeros.
RESERVE_MIB = 4096


def reserve_mib(args):
    """The region `memory_child` grows first: 32 of the largest
    `(B, N, S, S)` float32 tensors, between 256 MiB and `RESERVE_MIB`."""
    largest = max(
        batch_for(args, s) * args.heads * s * s * 4 / 2**20
        for s in args.lengths
    )
    return int(min(RESERVE_MIB, max(256, 32 * largest)))


def configurations(heads, key_dim):
    """`(label, group, factory)` of every configuration.

    group `"variant"` rows are compared with keras MHA; group `"loss"`
    rows are `HybridAttention(hybrid_init=0.0)` with one attached loss
    (or none: the `NO_LOSS` row they are compared with).
    """

    def hybrid0(*losses):
        return kav.HybridAttention(
            heads, key_dim, hybrid_init=0.0, attention_losses=list(losses)
        )

    rows = [
        (
            REFERENCE,
            "variant",
            lambda: keras.layers.MultiHeadAttention(heads, key_dim, seed=0),
        ),
        (
            "DoublyNormalizedAttention",
            "variant",
            lambda: kav.DoublyNormalizedAttention(heads, key_dim, seed=0),
        ),
        (
            "HybridAttention",
            "variant",
            lambda: kav.HybridAttention(heads, key_dim, seed=0),
        ),
        (
            "GumbelDiscreteAttention",
            "variant",
            lambda: kav.GumbelDiscreteAttention(heads, key_dim, seed=0),
        ),
        (NO_LOSS, "loss", hybrid0),
        (
            "+ AttentionGuidanceRegularizer",
            "loss",
            lambda: hybrid0(
                kav.AttentionGuidanceRegularizer(
                    default_head_patterns(heads), alpha=1.0
                )
            ),
        ),
    ]
    for method in KQ_METHODS:
        rows.append(
            (
                f"+ KQAlignment({method})",
                "loss",
                functools.partial(
                    lambda m: hybrid0(kav.KQAlignment(method=m)), method
                ),
            )
        )
    return rows


def runs_in(mode, label, group):
    """Attached losses only run in training: infer times the others."""
    return mode == "train" or group == "variant" or label == NO_LOSS


def attention_flops(batch, length, dim, mode, label):
    """Analytic matmul FLOPs of one self-attention step.

    Forward: Q, K, V and output projections `4 * 2 B S D^2`, scores
    `Q K^T` `2 B S^2 D` and combine `A V` `2 B S^2 D` (summed over heads,
    `D = N H`); the Gumbel argmax inference gathers one value row per
    query instead of `A V`. Train = 3x forward (backward = 2x forward).
    Normalizations and loss terms are not counted: their cost shows as a
    lower achieved FLOP/s.
    """
    projections = 8 * batch * length * dim * dim
    scores = 2 * batch * length * length * dim
    combine = scores
    if mode == "infer" and label == "GumbelDiscreteAttention":
        combine = 0
    forward = projections + scores + combine
    return float(forward if mode == "infer" else 3 * forward)


def batch_for(args, length):
    """Batch size at `length` (`--long-batch` from `--long-from` on)."""
    if args.long_from and length >= args.long_from:
        return min(args.batch, args.long_batch)
    return args.batch


def inputs(batch, length, dim):
    return tf.constant(
        np.random.default_rng(0).normal(size=(batch, length, dim)),
        "float32",
    )


def compiled_step(factory, mode, x):
    """`(layer, call)`: a built layer and its compiled step on `x`."""
    layer = factory()
    # Build on a short slice (weights do not depend on S); training=True
    # also builds the attached losses' own weights (GAN adversary).
    layer(x[:1, :8], x[:1, :8], training=mode == "train")
    fn = train_step_fn(layer) if mode == "train" else infer_fn(layer)
    return layer, functools.partial(fn, x)


def log(message, start):
    print(f"[{time.perf_counter() - start:7.1f}s] {message}", file=sys.stderr)


def time_length(args, length, start):
    """Timing results of one sequence length, per mode.

    Returns dict `mode -> {"times": {label: [s]}, "steps": int, ...}`.
    """
    batch = batch_for(args, length)
    x = inputs(batch, length, args.dim)
    key_dim = args.dim // args.heads
    results = {}
    for mode in MODES:
        calls = {}
        for label, group, factory in configurations(args.heads, key_dim):
            if not runs_in(mode, label, group):
                continue
            layer, call = compiled_step(factory, mode, x)
            warm_up(call)  # compile, then one warm-up run
            if mode == "infer" and layer.losses:
                raise RuntimeError(f"{label} added losses at inference")
            if mode == "train" and group == "loss" and label != NO_LOSS:
                if not layer.losses:
                    raise RuntimeError(f"{label} added no loss in training")
            calls[label] = call
        matmul, matmul_flops = matmul_fn(args.matmul_size)
        warm_up(matmul)
        calls[MATMUL] = matmul
        steps = dict.fromkeys(calls, steps_for(calls[REFERENCE], args.min_time))
        steps[MATMUL] = steps_for(matmul, args.min_time)
        log(
            f"{mode} S={length} B={batch}: {len(calls)} compiled, "
            f"{steps[REFERENCE]} steps/timing, load {load_average()}",
            start,
        )
        times = time_alternating(calls, args.repeats, steps, seed=length)
        results[mode] = {
            "times": times,
            "steps": steps[REFERENCE],
            "batch": batch,
            "matmul_flops": matmul_flops,
        }
        del calls
        gc.collect()
    return results


def peak_increase_mib(call):
    """Peak allocator bytes (MiB) during one `call()` above those held
    before it (needs the BFC CPU allocator, `ALLOCATOR_ENV`)."""
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    np.asarray(call())
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return (peak - before) / 2**20


def grow_pool(mib):
    """Grows the BFC allocator's pool by one free region of `mib` MiB,
    which later requests below it split to their own size (`reserve_mib`)."""
    reserve = tf.zeros([mib * 2**18], "float32")
    np.asarray(reserve[:1])
    del reserve
    gc.collect()


def memory_child(args):
    """Peak memory per configuration, mode and S; prints one JSON line."""
    grow_pool(reserve_mib(args))
    out = {}
    key_dim = args.dim // args.heads
    for length in args.lengths:
        x = inputs(batch_for(args, length), length, args.dim)
        out[length] = {}
        for label, group, factory in configurations(args.heads, key_dim):
            out[length][label] = {}
            for mode in MODES:
                if not runs_in(mode, label, group):
                    continue
                _, call = compiled_step(factory, mode, x)
                np.asarray(call())  # compile
                out[length][label][mode] = peak_increase_mib(call)
                del call
                gc.collect()
    print("MEMORY-JSON " + json.dumps(out))


def measure_memory(args, start):
    """Runs `memory_child` in a fresh subprocess; dict or an error str."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--memory-child",
        "--batch",
        str(args.batch),
        "--dim",
        str(args.dim),
        "--heads",
        str(args.heads),
        "--long-batch",
        str(args.long_batch),
        "--long-from",
        str(args.long_from),
        "--lengths",
        *map(str, args.lengths),
    ]
    env = dict(os.environ, **ALLOCATOR_ENV)
    log("memory: fresh subprocess", start)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("MEMORY-JSON "):
            raw = json.loads(line[len("MEMORY-JSON ") :])
            return {int(k): v for k, v in raw.items()}
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
    return f"memory subprocess failed (rc {done.returncode}): {tail}"


def flops_ratio(result, mode, label, length, dim):
    """Median over repeats of (layer FLOP/s) / (matmul FLOP/s)."""
    times = result["times"]
    flops = attention_flops(result["batch"], length, dim, mode, label)
    return statistics.median(
        (flops / t) / (result["matmul_flops"] / m)
        for t, m in zip(times[label], times[MATMUL])
    )


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def length_header(args, results, modes):
    header = ["configuration"]
    for length in args.lengths:
        batch = results[length]["train"]["batch"]
        note = "" if batch == args.batch else f", B={batch}"
        header += [f"S={length}{note} {mode}" for mode in modes]
    return header


def report(args, info, results, memory, load_end, elapsed):
    """The Markdown report."""
    key_dim = args.dim // args.heads
    labels = [
        (label, group)
        for label, group, _ in configurations(args.heads, key_dim)
    ]
    dash = "–"
    parts = [
        "# keras_attnvariants benchmark suite",
        (
            f"- Machine: {info['cpu']} ({info['arch']}, {info['cpu_flags']}),"
            f" nproc = {info['nproc']}.\n"
            f"- Backend: {info['backend']} {info['tensorflow']} with XLA "
            f"(`jit_compile=True`), keras {info['keras']}, numpy "
            f"{info['numpy']}, Python {info['python']}; CPU allocator: "
            f"{info['allocator']}.\n"
            f"- Date: {info['date']}; wall time {elapsed / 60:.1f} min.\n"
            f"- Load average (1/5/15 min) at start: {info['load']}; at end: "
            f"{load_end} (the machine was shared).\n"
            f"- Command: `{info['argv']}`"
            + (
                " (smoke run: unoptimized XLA code, timings meaningless)"
                if args.quick
                else ""
            )
            + ".\n"
            f"- Shapes: self-attention, float32, batch {args.batch}, model "
            f"dim {args.dim}, {args.heads} heads (key dim {key_dim}), no "
            "mask"
            + (
                f"; batch {args.long_batch} from S={args.long_from} on "
                "(time and memory)"
                if args.long_from
                and any(s >= args.long_from for s in args.lengths)
                and args.long_batch < args.batch
                else ""
            )
            + ". Layers on their default `attention_path` (the package's "
            "pick).\n"
            f"- Timing: per S and mode, every configuration and a "
            f"{args.matmul_size}^3 dense matmul compiled in one process and "
            f"timed alternately, order shuffled per repeat, {args.repeats} "
            "repeats of about "
            f"{args.min_time} s (at least one step); a cell is the median "
            "over repeats of the ratio to the keras MHA time of the same "
            "repeat."
        ),
    ]
    # Step time.
    rows = []
    for label, group in labels:
        row = [label]
        for length in args.lengths:
            for mode in MODES:
                result = results[length][mode]
                if label not in result["times"]:
                    row.append(dash)
                elif label == REFERENCE:
                    ms = median_time(result["times"], label) * 1e3
                    row.append(f"{ms:.1f} ms")
                else:
                    ratio = median_ratio(result["times"], label, REFERENCE)
                    row.append(f"{ratio:.2f}x")
        rows.append(row)
    parts += [
        "## Step time, ratio to keras MHA (keras MHA row: median time)",
        table(length_header(args, results, MODES), rows),
        (
            f"{dash}: attached losses run only with `training=True` (the "
            "suite checks that none is added at inference), so their "
            f"inference is the `{NO_LOSS}` row."
        ),
    ]
    # Loss overhead.
    rows = []
    for label, group in labels:
        if group != "loss" or label == NO_LOSS:
            continue
        row = [label]
        for length in args.lengths:
            result = results[length]["train"]
            ratio = median_ratio(result["times"], label, NO_LOSS)
            row.append(f"{ratio:.2f}x")
        rows.append(row)
    parts += [
        f"## Loss overhead: train step ratio to `{NO_LOSS}` without loss",
        table(length_header(args, results, ["train"]), rows),
        (
            "Without a loss the layer folds its weights into the value "
            "product and never writes them out; a term that reads the "
            "weights (`needs_attention_weights`: "
            "AttentionGuidanceRegularizer) makes it materialize them, so "
            "that row includes the materialization as well as the term. "
            "KQAlignment terms read only the queries and keys."
        ),
    ]
    # Memory.
    if isinstance(memory, dict) and memory:
        rows = []
        for label, group in labels:
            row = [label]
            for length in args.lengths:
                cell = memory[length][label]
                row += [
                    f"{cell[mode]:.1f}" if mode in cell else dash
                    for mode in MODES
                ]
            rows.append(row)
        parts += [
            "## Peak memory during one step (MiB)",
            table(length_header(args, results, MODES), rows),
            (
                "Peak bytes held by TensorFlow's CPU allocator during one "
                "step (after compiling) above those held before it: every "
                "tensor and XLA temporary buffer of the step, outputs and "
                "gradients included; a fresh subprocess with the BFC "
                "allocator (`TF_CPU_ALLOCATOR_USE_BFC=true`), whose "
                "statistics these are, its pool first grown by one "
                f"{reserve_mib(args)} MiB region so that each buffer "
                "counts at its own size, not as a power-of-two chunk. "
                "One (B, N, S, S) float32 tensor "
                "is "
                + ", ".join(
                    f"{batch_for(args, s) * args.heads * s * s * 4 / 2**20:.0f}"
                    f" MiB at S={s}"
                    for s in args.lengths
                )
                + "."
            ),
        ]
    else:
        parts += ["## Peak memory", f"Not measured: {memory}."]
    # FLOP/s.
    rows = []
    for label, group in labels:
        row = [label]
        for length in args.lengths:
            for mode in MODES:
                result = results[length][mode]
                if label not in result["times"]:
                    row.append(dash)
                    continue
                ratio = flops_ratio(result, mode, label, length, args.dim)
                row.append(f"{100 * ratio:.1f}%")
        rows.append(row)
    row = [f"{MATMUL} (GFLOP/s)"]
    for length in args.lengths:
        for mode in MODES:
            result = results[length][mode]
            seconds = median_time(result["times"], MATMUL)
            row.append(f"{result['matmul_flops'] / seconds / 1e9:.1f}")
    rows.append(row)
    parts += [
        "## Achieved FLOP/s, relative to a dense matmul",
        table(length_header(args, results, MODES), rows),
        (
            "Analytic matmul FLOPs of the layer (projections `8 B S D^2`, "
            "`Q K^T` and `A V` `2 B S^2 D` each; train = 3x forward; the "
            "Gumbel argmax inference gathers instead of `A V`) divided by "
            "the step time, over the FLOP/s of the "
            f"{args.matmul_size}^3 float32 matmul (`2 n^3` FLOPs, XLA) of "
            "the same repeat; median over repeats. Normalization and loss "
            "work is not counted, so it shows as a lower percentage."
        ),
    ]
    return "\n\n".join(parts) + "\n"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (CI smoke run)"
    )
    parser.add_argument(
        "--output", type=output_file, help="write the Markdown report here"
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[128, 512, 1024, 2048]
    )
    parser.add_argument(
        "--long-batch",
        type=int,
        default=2,
        help="batch from --long-from on (time and memory)",
    )
    parser.add_argument(
        "--long-from",
        type=int,
        default=2048,
        help="first S that uses --long-batch (0: never)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--min-time",
        type=float,
        default=0.2,
        help="seconds per timing (sets the step count; at least 1 step)",
    )
    parser.add_argument("--matmul-size", type=int, default=1024)
    parser.add_argument(
        "--memory",
        choices=["subprocess", "off"],
        default="subprocess",
        help="peak memory, measured in a fresh subprocess (default), or "
        "not at all",
    )
    parser.add_argument(
        "--memory-child", action="store_true", help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.dim, args.heads = 2, 32, 4
        args.lengths, args.repeats, args.min_time = [32, 64], 3, 0.02
        args.matmul_size = 256
    for name in ("batch", "dim", "heads", "repeats", "matmul_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.long_batch < 1:
        parser.error("--long-batch must be >= 1")
    if args.long_from < 0:
        parser.error("--long-from must be >= 0 (0: never)")
    if not args.min_time >= 0:  # also NaN
        parser.error("--min-time must be >= 0")
    if args.dim % args.heads:
        parser.error(f"--dim ({args.dim}) must be a multiple of --heads")
    if min(args.lengths) < 8:
        parser.error("--lengths must be >= 8")
    return args


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(0)
    if args.memory_child:
        memory_child(args)
        return
    start = time.perf_counter()
    info = machine_info()
    log(f"load average {info['load']}", start)
    results = {}
    for length in args.lengths:
        results[length] = time_length(args, length, start)
        if args.output:  # partial report, in case the run is cut short
            done = argparse.Namespace(**vars(args))
            done.lengths = list(results)
            text = report(
                done,
                info,
                results,
                "pending",
                load_average(),
                time.perf_counter() - start,
            )
            with open(args.output, "w") as f:
                f.write(text)
    load_end = load_average()
    if args.memory == "off":
        memory = "skipped (--memory off)"
    else:
        memory = measure_memory(args, start)
    text = report(
        args, info, results, memory, load_end, time.perf_counter() - start
    )
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    log("done", start)


if __name__ == "__main__":
    main()
