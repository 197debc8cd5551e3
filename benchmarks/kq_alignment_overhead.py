"""Train-step time with `KQAlignment` vs without (goals: GAN <= 1.10x,
CT <= 1.15x, OT <= 1.5x; the paper measured 1.24x GAN and 1.44x CT).

One small transformer classifier per method, all built in one process from
the same seed: token embeddings, `--layers` blocks of softmax
`HybridAttention(hybrid_init=0.0)` (exactly MHA, explicit path in every
model so only the term differs) plus a GELU feed-forward, mean pooling and a
softmax head. Each aligned model shares one `KQAlignment` instance across its
layers (as `convert_backbone` attaches it). The batch has padding (lengths
between half and full), so the masked paths are timed.

Under JAX the table adds each model's train-step FLOPs over the plain
model's (XLA's `cost_analysis()` of `train_step` compiled for the host
CPU, also on a GPU machine, `harness.host_flops`): the ratio
the step time would have if the alignment ran at the model's FLOP rate.
XLA counts a loop's body once, so the OT figure (Sinkhorn iterations in a
loop) is a lower bound.

Timing (`harness.time_alternating`): compiled `train_on_batch` steps
(TensorFlow, `jit_compile=True`), blocks of `--steps` steps per model, the
order of the models shuffled in every repeat; the reported ratio is the
median over repeats of `aligned / plain` from the same repeat, so machine
load hits both alike.

    python benchmarks/kq_alignment_overhead.py --quick     # CI smoke run
    python benchmarks/kq_alignment_overhead.py             # full, minutes
"""

import argparse
import functools
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

# `benchmarks/` is sys.path[0] when this script runs.
from harness import cpu_allocator  # noqa: E402
from harness import device_name  # noqa: E402
from harness import dtype_policy  # noqa: E402
from harness import host_flops  # noqa: E402
from harness import load_average_1min  # noqa: E402
from harness import machine_summary  # noqa: E402
from harness import median_ratio  # noqa: E402
from harness import median_time  # noqa: E402
from harness import output_file  # noqa: E402
from harness import time_alternating  # noqa: E402
from harness import warm_up  # noqa: E402

from keras_attnvariants.layers.hybrid_attention import HybridAttention  # noqa: E402
from keras_attnvariants.losses.kq_alignment import ADVERSARIAL_METHODS  # noqa: E402
from keras_attnvariants.losses.kq_alignment import KQAlignment  # noqa: E402

METHODS = ("gan", "ct", "ot", "mmd")
GOALS = {"gan": 1.10, "ct": 1.15, "ot": 1.5}


def classifier(args, method):
    keras.utils.set_random_seed(0)
    losses = []
    if method is not None:
        per_head = args.adversary_per_head and method in ADVERSARIAL_METHODS
        losses = [KQAlignment(method=method, adversary_per_head=per_head)]
    token_ids = keras.Input((args.length,), dtype="int32")
    padding = keras.Input((args.length,), dtype="bool")
    x = keras.layers.Embedding(args.vocabulary, args.hidden)(token_ids)
    mask = padding[:, None, :]
    for _ in range(args.layers):
        attention = HybridAttention(
            num_heads=args.heads,
            key_dim=args.hidden // args.heads,
            hybrid_init=0.0,
            self_attention_padding=True,
            attention_path="explicit",
            attention_losses=losses,
        )
        x = keras.layers.LayerNormalization()(
            x + attention(x, x, attention_mask=mask)
        )
        ffn = keras.layers.Dense(4 * args.hidden, activation="gelu")(x)
        x = keras.layers.LayerNormalization()(
            x + keras.layers.Dense(args.hidden)(ffn)
        )
    weights = keras.ops.cast(padding, "float32")[..., None]
    pooled = keras.ops.sum(x * weights, 1) / keras.ops.sum(weights, 1)
    probs = keras.layers.Dense(2, activation="softmax")(pooled)
    model = keras.Model([token_ids, padding], probs)
    model.compile(
        keras.optimizers.Adam(1e-4),
        "sparse_categorical_crossentropy",
        jit_compile=args.jit_compile,
    )
    return model


def padded_batch(args):
    """`([token ids, padding mask], labels)`, seeded: sequences between
    half and the full `--length` long."""
    rng = np.random.default_rng(0)
    shape = (args.batch_size, args.length)
    ids = rng.integers(1, args.vocabulary, shape).astype("int32")
    lengths = rng.integers(args.length // 2, args.length + 1, args.batch_size)
    padding = np.arange(args.length)[None] < lengths[:, None]
    labels = rng.integers(0, 2, args.batch_size).astype("int32")
    return [ids, padding], labels


def train_step_flops(model, batch):
    """XLA's FLOP count of one `train_step` of a built, compiled model,
    compiled for the host CPU (JAX backend; `None` on the others)."""
    if keras.config.backend() != "jax":
        return None
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.optimizer.variables],
        [v.value for v in model.metrics_variables],
    )
    return host_flops(model.train_step, state, batch)


def machine():
    host = machine_summary()
    if keras.config.backend() == "tensorflow":
        return f"{host}, CPU allocator {cpu_allocator()}"
    return f"{device_name()}; host {host}"


def fused_kernels_note():
    """Whether the run could use the fused Sinkhorn kernel, for the report.

    The kernel is lowered for CUDA only (`jax.lax.platform_dependent` in
    `keras_attnvariants/ops/transport.py`): a JAX run on an NVIDIA GPU
    uses it unless `KERAS_ATTNVARIANTS_FUSED_SINKHORN` turns it off, and a
    JAX run on any other GPU (ROCm) never does, whatever that variable
    says."""
    if keras.backend.backend() != "jax":
        return ""
    import jax

    from keras_attnvariants.ops import fused_sinkhorn

    if jax.default_backend() != "gpu":
        return ""
    try:
        cuda = bool(jax.devices("cuda"))
    except RuntimeError:  # no CUDA platform: a ROCm GPU
        cuda = False
    if not cuda:
        return " Fused Sinkhorn kernel: not used (CUDA only)."
    sinkhorn = "on" if fused_sinkhorn.enabled() else "off"
    return f" Fused Sinkhorn kernel (CUDA): {sinkhorn}."


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=list(METHODS),
        metavar="METHOD",
        help=f"any of {', '.join(METHODS)} (default: all)",
    )
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--vocabulary", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--jit-compile",
        choices=("on", "off"),
        default=None,
        help="XLA; defaults to on (off with --quick, where compiling "
        "five models would dominate)",
    )
    parser.add_argument(
        "--adversary-per-head",
        action="store_true",
        help="gan / ct: one adversary per head (not shared)",
    )
    parser.add_argument(
        "--dtype-policy",
        type=dtype_policy,
        default="float32",
        help="keras dtype policy of every model, e.g. mixed_bfloat16 on a "
        "GPU; the alignment terms compute in float32 under any of them",
    )
    parser.add_argument(
        "--output", type=output_file, default=None, help="Markdown file"
    )
    args = parser.parse_args(argv)
    # 0 is an error, not "the default" (`args.layers or 2` took it so).
    for name in (
        "layers",
        "hidden",
        "heads",
        "batch_size",
        "repeats",
        "steps",
    ):
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = name.replace("_", "-")
            parser.error(f"--{flag} must be >= 1, got {value}")
    if args.length is not None and args.length < 2:
        # Sequences are between half and the full length long.
        parser.error(f"--length must be >= 2, got {args.length}")
    if args.vocabulary < 2:  # token ids are drawn from 1 .. vocabulary - 1
        parser.error(f"--vocabulary must be >= 2, got {args.vocabulary}")
    if args.hidden % args.heads:
        parser.error(
            f"--hidden must be divisible by --heads, got {args.hidden} and "
            f"{args.heads}"
        )
    args.jit_compile = (
        args.jit_compile or ("off" if args.quick else "on")
    ) == "on"
    args.layers = args.layers or (1 if args.quick else 2)
    args.length = args.length or (32 if args.quick else 64)
    args.batch_size = args.batch_size or (8 if args.quick else 16)
    args.repeats = args.repeats or (3 if args.quick else 15)
    args.steps = args.steps or (2 if args.quick else 5)
    return args


def main(argv=None):
    args = parse_args(argv)
    keras.config.set_dtype_policy(args.dtype_policy)
    repeats, steps = args.repeats, args.steps
    # The machine as the timing found it: read after the run, the load
    # average counted this script's own work (and the FLOP counts'
    # compiles) as the machine's, and the date was the end's.
    host = machine()

    batch = padded_batch(args)

    start = time.perf_counter()
    names = ["none"] + list(dict.fromkeys(args.methods))  # once each
    models = {
        name: classifier(args, None if name == "none" else name)
        for name in names
    }
    calls = {
        name: functools.partial(model.train_on_batch, *batch)
        for name, model in models.items()
    }
    for call in calls.values():
        warm_up(call)  # trace, compile and warm up
    times = time_alternating(calls, repeats, steps)
    after = load_average_1min()  # before the FLOP counts compile
    after = "unknown" if after is None else f"{after:.2f}"
    flops = {
        name: train_step_flops(model, batch) for name, model in models.items()
    }
    counted = all(value is not None for value in flops.values())
    lines = [
        f"KQAlignment train-step overhead: backend {keras.backend.backend()}"
        f", jit_compile={args.jit_compile}, {args.dtype_policy}, "
        f"{host}; 1-min load average after {after}.",
        f"Model: {args.layers} blocks, hidden {args.hidden}, {args.heads} "
        f"heads x {args.hidden // args.heads}, batch {args.batch_size} x "
        f"length {args.length} (padded), {repeats} repeats x {steps} steps"
        + (", one adversary per head." if args.adversary_per_head else ".")
        + fused_kernels_note()
        + (
            " --quick smoke run: its timings and verdicts mean nothing."
            if args.quick
            else ""
        ),
        "",
        "| method | ms/step (median) | ratio vs none (median) | goal |"
        + (" FLOPs vs none (XLA) |" if counted else ""),
        "| --- | --- | --- | --- |" + (" --- |" if counted else ""),
        f"| none | {1e3 * median_time(times, 'none'):.1f} | 1.00 | |"
        + (f" {flops['none'] / 1e9:.2f} GFLOP |" if counted else ""),
    ]
    for name in names[1:]:
        ratio = median_ratio(times, name, "none")
        goal = GOALS.get(name)
        verdict = "" if goal is None else f"<= {goal:.2f}x"
        if goal is not None:
            verdict += " met" if ratio <= goal else " MISSED"
        lines.append(
            f"| {name} | {1e3 * median_time(times, name):.1f} | "
            f"{ratio:.2f}x | {verdict} |"
            + (f" {flops[name] / flops['none']:.3f}x |" if counted else "")
        )
    lines.append("")
    lines.append(f"Total {time.perf_counter() - start:.1f} s.")
    text = "\n".join(lines)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
