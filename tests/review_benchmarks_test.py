"""The benchmark harness and the scripts' argument checks.

Timings are not asserted (performance is measured, not tested): these
tests check what would make a reported ratio wrong: the median is taken
over per-repeat ratios, every repeat times every callable once in a
shuffled order and waits for its result, nothing is timed cold or while
retracing, the explicit / fused pick compares the two paths directly, and
bad sizes are rejected instead of silently replaced by defaults.
"""

import importlib.util
import os
import pathlib
import sys

import numpy as np
import pytest

from keras_attnvariants.testing.usage_errors import usage_error

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    """Imports `benchmarks/<name>.py`, leaving `os.environ` as it was (the
    scripts `setdefault` their backend)."""
    environ = dict(os.environ)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            f"review_benchmarks_{name}", BENCHMARKS / f"{name}.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
        os.environ.clear()
        os.environ.update(environ)
    return module


@pytest.fixture(scope="module")
def harness():
    return _load("harness")


def test_median_ratio_is_the_median_of_per_repeat_ratios(harness):
    times = {"a": [2.0, 3.0, 10.0], "ref": [1.0, 6.0, 4.0]}
    # Per repeat: 2, 0.5, 2.5 -> 2; the ratio of the medians would be 0.75.
    assert harness.median_ratio(times, "a", "ref") == pytest.approx(2.0)
    assert harness.median_time(times, "a") == 3.0


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _Result:
    """A step's output; `np.asarray` on it is the wait for the device."""

    def __init__(self, log, label):
        self.log, self.label = log, label

    def __array__(self, dtype=None, copy=None):
        self.log.append(("fetch", self.label))
        return np.zeros(())


def test_time_alternating_times_each_callable_once_per_repeat(
    harness, monkeypatch
):
    clock = _Clock()
    monkeypatch.setattr(harness.time, "perf_counter", clock)
    log = []
    cost = {"a": 1.0, "b": 2.0, "c": 4.0, "d": 8.0}

    def step(label):
        clock.now += cost[label]
        log.append(("call", label))
        return _Result(log, label)

    calls = {label: (lambda label=label: step(label)) for label in cost}
    steps = {"a": 3, "b": 2, "c": 1, "d": 2}
    repeats = 6
    times = harness.time_alternating(calls, repeats, steps, seed=1)

    # Seconds per step, one per repeat.
    assert times == {label: [cost[label]] * repeats for label in cost}
    # Each timing: `steps` calls in a row, then one fetch of the last result.
    blocks, orders = [], []
    i = 0
    while i < len(log):
        label = log[i][1]
        count = steps[label]
        assert log[i : i + count] == [("call", label)] * count
        assert log[i + count] == ("fetch", label)
        blocks.append(label)
        i += count + 1
    assert len(blocks) == repeats * len(cost)
    for r in range(repeats):
        order = blocks[r * len(cost) : (r + 1) * len(cost)]
        assert sorted(order) == sorted(cost)  # everyone, once
        orders.append(tuple(order))
    assert len(set(orders)) > 1  # shuffled, not a fixed order


def test_warm_up_runs_past_the_compiling_call(harness):
    count = []
    harness.warm_up(lambda: count.append(1) or np.zeros(()))
    assert len(count) >= 2


def test_steps_for_is_at_least_one(harness, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(harness.time, "perf_counter", clock)

    def slow():
        clock.now += 5.0
        return np.zeros(())

    def fast():
        clock.now += 0.01
        return np.zeros(())

    assert harness.steps_for(slow, 0.2) == 1
    assert harness.steps_for(fast, 0.2) == 20


def test_machine_summary_names_cpu_cores_and_date(harness):
    line = harness.machine_summary()
    assert harness.cpu_model() in line
    assert f"{harness.cpu_count()} cores" in line
    assert "UTC" in line
    if hasattr(os, "sched_getaffinity"):
        assert harness.cpu_count() == len(os.sched_getaffinity(0))


def test_compiled_steps_do_not_retrace_while_timed(harness):
    import keras
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(0).normal(size=(2, 6, 8)), "float32")
    layer = keras.layers.MultiHeadAttention(2, 4, seed=0)
    layer(x, x)
    before = [v.numpy().copy() for v in layer.trainable_variables]
    train = harness.train_step_fn(layer)
    infer = harness.infer_fn(layer)
    calls = {"train": lambda: train(x), "infer": lambda: infer(x)}
    for call in calls.values():
        harness.warm_up(call)
    traces = {
        "train": train.experimental_get_tracing_count(),
        "infer": infer.experimental_get_tracing_count(),
    }
    harness.time_alternating(calls, 2, 2)
    assert train.experimental_get_tracing_count() == traces["train"]
    assert infer.experimental_get_tracing_count() == traces["infer"]
    # The train step does the SGD update it is timed for.
    after = [v.numpy() for v in layer.trainable_variables]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize(
    "name", ["attention_step", "gumbel_step", "dropout_step"]
)
def test_step_scripts_reject_bad_sizes(name):
    script = _load(name)
    for argv in (
        ["--batch", "0"],
        ["--repeats", "0"],
        ["--lengths", "128", "0"],
        ["--dim", "30", "--heads", "4"],
        ["--min-time", "-1"],
        ["--min-time", "nan"],
    ):
        usage_error(script.parse_args, argv)
    args = script.parse_args(["--quick"])
    assert args.repeats >= 1 and args.lengths


def test_torch_compile_step_rejects_bad_sizes():
    script = _load("torch_compile_step")
    for argv in (
        ["--batch-size", "0"],
        ["--length", "0"],
        ["--heads", "-1"],
        ["--key-dim", "0"],
        ["--repeats", "0"],
        ["--steps", "0"],
    ):
        usage_error(script.parse_args, argv)
    args = script.parse_args(["--quick"])
    assert args.repeats >= 1 and args.steps >= 1
    assert script.REFERENCE in script.layers(2, 4)


def test_suite_rejects_bad_sizes():
    suite = _load("suite")
    for argv in (
        ["--long-batch", "0"],
        ["--long-from", "-1"],
        ["--min-time", "-0.5"],
        ["--dim", "30", "--heads", "4"],
        ["--lengths", "4"],
    ):
        usage_error(suite.parse_args, argv)
    assert suite.parse_args(["--long-from", "0"]).long_from == 0


@pytest.mark.parametrize("name", ["guidance_overhead", "kq_alignment_overhead"])
def test_overhead_scripts_reject_zero_instead_of_defaulting(name):
    script = _load(name)
    for argv in (
        ["--repeats", "0"],
        ["--steps", "0"],
        ["--layers", "0"],
        ["--batch-size", "0"],
        ["--length", "1"],
        ["--hidden", "130", "--heads", "4"],
    ):
        usage_error(script.parse_args, argv)
    args = script.parse_args(["--repeats", "2", "--steps", "1"])
    assert (args.repeats, args.steps) == (2, 1)
    args = script.parse_args(["--quick"])
    assert args.repeats >= 1 and args.steps >= 1


def test_kq_alignment_overhead_rejects_unknown_methods():
    # An unknown method raised a `ValueError` traceback, not a usage error.
    script = _load("kq_alignment_overhead")
    for argv in (["--methods", "gan", "wgan"], ["--methods", "none"]):
        err = usage_error(script.parse_args, argv)
        assert err.startswith("usage:")
        assert "error: argument --methods: invalid choice" in err
    assert script.parse_args(["--methods", "ot", "gan"]).methods == [
        "ot",
        "gan",
    ]
    assert script.parse_args([]).methods == list(script.METHODS)


@pytest.mark.parametrize(
    "platforms, flag, expected",
    [
        ((), "1", ""),  # JAX on the CPU: nothing to report
        (("cuda",), "1", " Fused Sinkhorn kernel (CUDA): on."),
        (("cuda",), "0", " Fused Sinkhorn kernel (CUDA): off."),
        # A ROCm GPU lowers the generic loop whatever the variable says.
        (("rocm",), "1", " Fused Sinkhorn kernel: not used (CUDA only)."),
    ],
)
def test_kq_header_says_which_gpus_run_the_fused_sinkhorn_kernel(
    monkeypatch, platforms, flag, expected
):
    jax = pytest.importorskip("jax")
    import keras

    script = _load("kq_alignment_overhead")
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(
        jax, "default_backend", lambda: "gpu" if platforms else "cpu"
    )

    def devices(platform=None):
        if platform not in platforms:
            raise RuntimeError(f"Unknown backend {platform}")
        return ["device"]

    monkeypatch.setattr(jax, "devices", devices)
    monkeypatch.setenv("KERAS_ATTNVARIANTS_FUSED_SINKHORN", flag)
    assert script.fused_kernels_note() == expected


def test_faster_path_is_the_direct_same_repeat_comparison():
    script = _load("accelerator_step")
    # Medians of the ratios to keras MHA say explicit (1.00x < 1.01x), the
    # same-repeat explicit / fused median says fused (1.05x).
    results = {
        512: {
            "DNAS explicit": (1.0, 1.00, None),
            "DNAS fused": (1.0, 1.01, None),
            "HNAS explicit": (1.0, 1.20, None),
            "HNAS fused": (1.0, 1.10, None),
        }
    }
    paths = {512: {"DNAS": 1.05, "HNAS": 0.97}}
    dnas, hnas = script.path_lines("train", "float32", results, paths)
    assert "S=512 fused (explicit / fused 1.05x" in dnas
    assert "S=512 explicit (explicit / fused 0.97x" in hnas


def test_dropout_step_compares_the_two_dropouts_on_one_layer():
    # The "Keras Dropout" row must trace Keras's generator (a stateless
    # random op), the package's rows none, and the swap must not leak.
    import tensorflow as tf

    from keras_attnvariants.layers import variant_attention

    script = _load("dropout_step")
    original = variant_attention.positional_dropout
    x = tf.zeros((2, 8, 16))
    random_ops = {}
    for label in (script.FOLDED, script.MATERIALIZED, script.KERAS_DROPOUT):
        call = script.compiled(label, x, 2, 0.5, False)
        assert variant_attention.positional_dropout is original
        graph = call.func.get_concrete_function(x).graph
        random_ops[label] = [
            op.type for op in graph.get_operations() if "Random" in op.type
        ]
        # Traced once (by `compiled`): the timed calls reuse that trace.
        assert call.func.experimental_get_tracing_count() == 1
    assert random_ops[script.KERAS_DROPOUT], random_ops
    assert not random_ops[script.FOLDED], random_ops
    assert not random_ops[script.MATERIALIZED], random_ops


def test_dropout_step_times_the_train_step_only():
    # Dropout is off at inference and the script times train steps only:
    # `--modes infer` (a shared option of the step scripts) was accepted
    # and silently ignored, as were the `--modes` shown in its `--help`.
    script = _load("dropout_step")
    for argv in (
        ["--modes", "infer"],
        ["--modes", "train", "infer"],
        ["--rate", "0"],
        ["--rate", "1"],
        ["--rate", "nan"],
    ):
        usage_error(script.parse_args, argv)
    assert script.parse_args([]).modes == ["train"]
    assert script.parse_args(["--modes", "train"]).modes == ["train"]


def test_compiled_flops_is_xla_count_of_the_program(harness):
    # The FLOP columns (accelerator_step.py, and kq_alignment_overhead.py
    # under JAX) divide these counts: a matmul must count 2 n^3, and a
    # platform without a count must give None, not 0 (a ratio of 0).
    import jax
    import jax.numpy as jnp

    a = jnp.ones((64, 64), "float32")
    compiled = jax.jit(lambda x, y: x @ y).lower(a, a).compile()
    assert harness.compiled_flops(compiled) == pytest.approx(2 * 64**3)

    class NoCount:
        def __init__(self, cost):
            self.cost = cost

        def cost_analysis(self):
            if isinstance(self.cost, Exception):
                raise self.cost
            return self.cost

    for cost in (RuntimeError("unsupported"), None, [], {}, [{}]):
        assert harness.compiled_flops(NoCount(cost)) is None
    assert harness.compiled_flops(NoCount([{"flops": 8.0}])) == 8.0


def test_host_flops_counts_the_program_compiled_for_the_cpu(harness):
    # XLA:GPU's count leaves out the matmuls handed to cuBLAS (71 of ~970
    # GFLOP for a KQ train step on an H100), so the FLOP columns compile
    # for the host CPU on every machine: arrays committed to another
    # device are moved, and the count is the program's, 2 n^3 for a matmul.
    import jax
    import jax.numpy as jnp

    a = jax.device_put(jnp.ones((32, 32), "float32"), jax.devices()[0])
    assert harness.host_flops(lambda x, y: x @ y, a, a) == pytest.approx(
        2 * 32**3
    )
    # Nested arguments (a model's state lists and its batch) are moved too.
    count = harness.host_flops(
        lambda state, batch: state[0] @ batch["x"], [a], {"x": a}
    )
    assert count == pytest.approx(2 * 32**3)


def test_flops_table_divides_by_keras_mha_of_the_same_length():
    script = _load("accelerator_step")
    results = {
        128: {
            script.REFERENCE: (1.0, 1.0, None, 200.0e9),
            "Gumbel argmax": (1.0, 0.95, None, 182.0e9),
        },
        512: {
            script.REFERENCE: (1.0, 1.0, None, 400.0e9),
            "Gumbel argmax": (1.0, 0.85, None, 310.0e9),
        },
    }
    table = script.flops_table("infer", "float32", results)
    assert "| keras MHA | 200 GFLOP | 400 GFLOP |" in table
    assert "| Gumbel argmax | 0.910x | 0.775x |" in table
    # PyTorch steps have no count: no table rather than a wrong one.
    results[512]["Gumbel argmax"] = (1.0, 0.85, None, None)
    assert script.flops_table("infer", "float32", results) is None


POOL_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import tensorflow as tf
import suite
suite.grow_pool(int(sys.argv[2]))
one = suite.peak_increase_mib(lambda: tf.zeros([40 * 2**18]))  # 40 MiB
two = suite.peak_increase_mib(lambda: tf.random.uniform([40 * 2**18]) * 2.0)
print(json.dumps([one, two]))
"""


@pytest.mark.skipif(
    os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
    reason="TensorFlow's allocator statistics",
)
def test_suite_memory_counts_buffers_at_their_own_size():
    # A pool grown on demand is power-of-two chunks, handed out whole below
    # twice the request: the suite's cells read chunk sizes (keras MHA
    # "128 MiB" at S=512, where its inference step holds 69). Here a
    # 40 MiB tensor read 64 MiB, two of them 128.
    import json
    import subprocess

    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true")
    out = subprocess.run(
        [sys.executable, "-c", POOL_PROBE, str(BENCHMARKS), "256"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    one, two = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose([one, two], [40.0, 80.0], atol=0.01)


@pytest.mark.parametrize(
    "name, extra",
    [
        ("attention_step", []),
        ("gumbel_step", []),
        ("dropout_step", []),
        ("accelerator_step", []),
        ("suite", []),
        ("kq_alignment_overhead", []),
        ("torch_compile_step", []),
    ],
)
def test_output_paths_are_checked_before_the_timings(name, extra, tmp_path):
    # The report was written after all the timings: a missing folder or a
    # folder in the file's place failed then, with a traceback.
    script = _load(name)
    for bad in (str(tmp_path / "missing" / "report.md"), str(tmp_path)):
        usage_error(script.parse_args, [*extra, "--output", bad])
    good = str(tmp_path / "report.md")
    assert script.parse_args([*extra, "--output", good]).output == good


def test_dtype_policies_are_checked_before_the_timings():
    for name, flag in (
        ("kq_alignment_overhead", "--dtype-policy"),
        ("accelerator_step", "--policies"),
    ):
        script = _load(name)
        usage_error(script.parse_args, [flag, "float31"])
        assert script.parse_args([flag, "mixed_bfloat16"])


def test_suite_memory_reserve_follows_the_sizes():
    # The --quick run's steps (under 2 MiB) grew a 4 GiB pool of zeros.
    suite = _load("suite")
    assert suite.reserve_mib(suite.parse_args(["--quick"])) == 256
    # The default sizes keep the 4 GiB the memory table was measured with:
    # 32 of their largest (B, N, S, S) float32 tensors (128 MiB).
    assert suite.reserve_mib(suite.parse_args([])) == 4096
    assert suite.reserve_mib(suite.parse_args(["--lengths", "512"])) == 1024
    big = suite.parse_args(["--lengths", "4096", "--long-batch", "8"])
    assert suite.reserve_mib(big) == suite.RESERVE_MIB
