"""Step time of every attention layer against keras MHA on a GPU (or CPU).

The CPU scripts (`attention_step.py`, `gumbel_step.py`) time TensorFlow
XLA steps; this one times the backends a GPU user runs, with no TensorFlow
needed:

- JAX: `jax.jit` over `layer.stateless_call` (train: `value_and_grad` and
  an SGD update of the trainable variables, donated; infer: the forward
  pass), XLA on the default device;
- PyTorch: eager steps on `cuda` when available (train: `backward` and
  `torch.optim.SGD`; infer: under `torch.no_grad`), as `model.fit` runs
  them by default.

Every variant is built in the same process and timed alternately (each
repeat times every variant once, in a shuffled order); a variant's ratio is
the median over repeats of its time over keras MHA's time in the same
repeat. keras MHA takes `keras.ops.dot_product_attention` (cuDNN / flash
kernels where the backend has them). The variants:

- DNAS and HNAS on both paths: `attention_path="explicit"` (the folded
  `normalize(scores) @ value`, `ops/combine.py`) and `"fused"`
  (`dot_product_attention` with the per-key DNAS bias);
- GumbelDiscreteAttention: relaxed and straight-through samples in train,
  the argmax gather in infer.

Under JAX the table also gives each compiled step's temporary memory
(`memory_analysis().temp_size_in_bytes`), under PyTorch the peak memory of
one step (`torch.cuda.max_memory_allocated`). Under JAX a second table
gives each step's FLOPs (XLA's `cost_analysis()` of the step compiled for
the host CPU, `harness.host_flops`) over keras MHA's: the
ratio a variant's time would have if it ran at keras MHA's FLOP rate (the
floor of the time ratio where the step is compute-bound). The last section
says which path is faster per length, the measurement behind
`attention_path="auto"`.

Usage:

    KERAS_BACKEND=jax python benchmarks/accelerator_step.py --output r.md
    KERAS_BACKEND=torch python benchmarks/accelerator_step.py
    KERAS_BACKEND=jax python benchmarks/accelerator_step.py --quick  # tiny
"""

import os
import random
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import keras  # noqa: E402
import numpy as np  # noqa: E402

# `benchmarks/` is sys.path[0] when this script runs.
from harness import check_step_args  # noqa: E402
from harness import device_name  # noqa: E402
from harness import dtype_policy  # noqa: E402
from harness import host_flops  # noqa: E402
from harness import length_table  # noqa: E402
from harness import machine_summary  # noqa: E402
from harness import median_ratio  # noqa: E402
from harness import median_time  # noqa: E402
from harness import step_parser  # noqa: E402
from harness import steps_for  # noqa: E402
from harness import time_alternating  # noqa: E402
from harness import use_quick_sizes  # noqa: E402
from harness import warm_up  # noqa: E402
from harness import write_report  # noqa: E402

from keras_attnvariants.layers.doubly_normalized_attention import (  # noqa: E402
    DoublyNormalizedAttention,
)
from keras_attnvariants.layers.gumbel_discrete_attention import (  # noqa: E402
    GumbelDiscreteAttention,
)
from keras_attnvariants.layers.hybrid_attention import HybridAttention  # noqa: E402
from keras_attnvariants.layers.variant_attention import prefer_fused_path  # noqa: E402

REFERENCE = "keras MHA"
PATHS = ("explicit", "fused")


def variants(mode):
    """`(label, class, constructor kwargs)` of the variants of one mode."""
    rows = [(REFERENCE, keras.layers.MultiHeadAttention, {})]
    for name, cls in (
        ("DNAS", DoublyNormalizedAttention),
        ("HNAS", HybridAttention),
    ):
        for path in PATHS:
            rows.append((f"{name} {path}", cls, {"attention_path": path}))
    if mode == "train":
        rows.append(("Gumbel relaxed", GumbelDiscreteAttention, {}))
        rows.append(
            (
                "Gumbel straight-through",
                GumbelDiscreteAttention,
                {"straight_through": True},
            )
        )
    else:
        rows.append(("Gumbel argmax", GumbelDiscreteAttention, {}))
    return rows


class Fetched:
    """A PyTorch tensor that `np.asarray` copies to the host (a sync)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __array__(self, dtype=None, copy=None):
        return self.tensor.detach().float().cpu().numpy()


def jax_step(layer, x, mode, learning_rate=1e-4):
    """`(call, temp_bytes, flops)`: a jitted train step or forward pass,
    its compiled temporaries and XLA's FLOP count of one call."""
    import jax
    import jax.numpy as jnp

    state = [
        [v.value for v in layer.trainable_variables],
        [v.value for v in layer.non_trainable_variables],
    ]

    if mode == "infer":

        @jax.jit
        def forward(trainable, non_trainable, x):
            y, _ = layer.stateless_call(
                trainable, non_trainable, x, x, training=False
            )
            return jnp.sum(y.astype("float32"))

        compiled = forward.lower(*state, x).compile()
        return (
            (lambda: compiled(*state, x)),
            temp_bytes(compiled),
            host_flops(forward, *state, x),
        )

    def loss_fn(trainable, non_trainable, x):
        y, non_trainable, losses = layer.stateless_call(
            trainable, non_trainable, x, x, training=True, return_losses=True
        )
        loss = jnp.mean(jnp.square(y.astype("float32")))
        for term in losses:
            loss = loss + term.astype("float32")
        return loss, non_trainable

    def step(trainable, non_trainable, x):
        (loss, non_trainable), grads = jax.value_and_grad(
            loss_fn, has_aux=True
        )(trainable, non_trainable, x)
        trainable = [
            v - learning_rate * g.astype(v.dtype)
            for v, g in zip(trainable, grads)
        ]
        return trainable, non_trainable, loss

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(*state, x).compile()

    def call():
        state[0], state[1], loss = compiled(state[0], state[1], x)
        return loss

    # Counted before the first call donates `state`'s buffers.
    flops = host_flops(step, *state, x)
    return call, temp_bytes(compiled), flops


def temp_bytes(compiled):
    """Temporary buffer bytes of a compiled JAX function, or `None`."""
    try:
        return compiled.memory_analysis().temp_size_in_bytes
    except Exception:  # not every platform reports it
        return None


def torch_step(layer, x, mode, learning_rate=1e-4):
    """`(call, peak_bytes, None)`: an eager train step or forward pass (no
    FLOP count: eager PyTorch has no compiled program to count)."""
    import torch

    if mode == "infer":

        def call():
            with torch.no_grad():
                return Fetched(torch.sum(layer(x, x, training=False).float()))

    else:
        optimizer = torch.optim.SGD(list(layer.parameters()), learning_rate)

        def call():
            optimizer.zero_grad(set_to_none=True)
            y = layer(x, x, training=True)
            loss = torch.mean(torch.square(y.float()))
            for term in layer.losses:
                loss = loss + term.float()
            loss.backward()
            optimizer.step()
            return Fetched(loss)

    if not torch.cuda.is_available():
        return call, None, None
    np.asarray(call())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    np.asarray(call())
    return call, torch.cuda.max_memory_allocated() - before, None


def make_step(layer, x, mode):
    if keras.config.backend() == "jax":
        return jax_step(layer, x, mode)
    if keras.config.backend() == "torch":
        return torch_step(layer, x, mode)
    raise ValueError(
        "accelerator_step.py times the `jax` and `torch` backends (the "
        "TensorFlow scripts are attention_step.py and gumbel_step.py). "
        f"Received: KERAS_BACKEND={keras.config.backend()!r}"
    )


def measure(mode, policy, batch, length, dim, heads, repeats, min_time):
    """`({label: (seconds, ratio, memory_bytes, flops)}, {layer: explicit /
    fused})` for one configuration (`flops`: XLA's count, JAX only).

    The second dict is the median over repeats of the explicit path's time
    over the fused path's time of the same repeat, per layer (DNAS, HNAS).
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        x = keras.ops.convert_to_tensor(
            np.random.default_rng(0).normal(size=(batch, length, dim)),
            "float32",
        )
        calls, memory, flops = {}, {}, {}
        for label, cls, kwargs in variants(mode):
            layer = cls(heads, dim // heads, seed=0, **kwargs)
            layer(x, x)  # build
            calls[label], memory[label], flops[label] = make_step(
                layer, x, mode
            )
            warm_up(calls[label])
    finally:
        keras.config.set_dtype_policy(previous)
    steps = steps_for(calls[REFERENCE], min_time)
    times = time_alternating(calls, repeats, steps, seed=random.random())
    results = {
        label: (
            median_time(times, label),
            median_ratio(times, label, REFERENCE),
            memory[label],
            flops[label],
        )
        for label in calls
    }
    paths = {
        name: median_ratio(times, f"{name} explicit", f"{name} fused")
        for name in ("DNAS", "HNAS")
    }
    return results, paths


def mib(value):
    return "-" if value is None else f"{value / 2**20:.1f}"


def markdown_table(mode, policy, results):
    """Rows = variants, columns = lengths: ratio (ms, MiB)."""

    def cell(label, length):
        seconds, ratio, memory, _ = results[length][label]
        timing = f"{seconds * 1e3:.2f} ms, {mib(memory)} MiB"
        return timing if label == REFERENCE else f"{ratio:.2f}x ({timing})"

    return length_table(f"{mode}, {policy}", results, cell)


def flops_table(mode, policy, results):
    """Rows = variants, columns = lengths: XLA's FLOPs of one step over
    keras MHA's, the compute floor of the time ratio; `None` when the
    backend has no compiled program to count (PyTorch)."""
    if any(
        row[3] is None for rows in results.values() for row in rows.values()
    ):
        return None

    def cell(label, length):
        flops = results[length][label][3]
        if label == REFERENCE:
            return f"{flops / 1e9:.3g} GFLOP"
        return f"{flops / results[length][REFERENCE][3]:.3f}x"

    return length_table(f"{mode}, {policy}: FLOPs / keras MHA's", results, cell)


def path_lines(mode, policy, results, paths):
    """Which path is faster, per layer and length.

    Decided by `paths[S][layer]`, the median over repeats of explicit /
    fused time in the same repeat (not by comparing the two medians of
    ratios to keras MHA); the cells also show both ratios to keras MHA.
    """
    lines = []
    for name in ("DNAS", "HNAS"):
        cells = []
        for s in sorted(results):
            explicit = results[s][f"{name} explicit"][1]
            fused = results[s][f"{name} fused"][1]
            direct = paths[s][name]
            faster = "explicit" if direct < 1.0 else "fused"
            cells.append(
                f"S={s} {faster} (explicit / fused {direct:.2f}x; "
                f"{explicit:.2f}x / {fused:.2f}x of keras MHA)"
            )
        lines.append(
            f"- {mode}, {policy}, {name} explicit / fused: " + ", ".join(cells)
        )
    return lines


def parse_args(argv):
    parser = step_parser(
        __doc__.splitlines()[0], [512, 1024, 2048, 4096], 11, 0.05
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        type=dtype_policy,
        default=["mixed_bfloat16", "float32"],
        help="Keras dtype policies",
    )
    args = parser.parse_args(argv)
    check_step_args(parser, args)
    if args.quick:
        use_quick_sizes(args)
        args.policies = args.policies[:1]
    return args


def main(argv=None):
    args = parse_args(argv)
    random.seed(0)
    keras.utils.set_random_seed(0)
    title = (
        f"B={args.batch}, dim={args.dim}, heads={args.heads}, "
        f"{device_name()}, host {machine_summary()}, keras "
        f"{keras.__version__}, backend "
        f"{keras.config.backend()}, {args.repeats} alternating repeats, "
        "median ratio to keras MHA (ms per step, memory: JAX compiled "
        "temporaries / PyTorch peak of one step). attention_path='auto' "
        f"picks {'fused' if prefer_fused_path() else 'explicit'} here."
        + (
            " --quick smoke run: its timings mean nothing."
            if args.quick
            else ""
        )
    )
    sections, choices = [title], []
    for mode in args.modes:
        for policy in args.policies:
            results, paths = {}, {}
            for length in args.lengths:
                results[length], paths[length] = measure(
                    mode,
                    policy,
                    args.batch,
                    length,
                    args.dim,
                    args.heads,
                    args.repeats,
                    args.min_time,
                )
                print(f"[{mode} {policy} S={length} done]", file=sys.stderr)
            sections.append(markdown_table(mode, policy, results))
            choices.extend(path_lines(mode, policy, results, paths))
            print(sections[-1], flush=True)
            counted = flops_table(mode, policy, results)
            if counted is not None:
                sections.append(counted)
                print(counted, flush=True)
    sections.append("Faster path:\n" + "\n".join(choices))
    write_report("\n\n".join(sections) + "\n", args.output)


if __name__ == "__main__":
    main()
