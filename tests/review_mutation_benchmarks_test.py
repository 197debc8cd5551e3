"""The benchmark harness, pinned after a mutation review (2026-12-02) of
`benchmarks/harness.py`: each test fails on a mutation the suite let
through (ratio tables, report writing, the timed train and inference
steps, XLA by default, alternating timing and its seeded order, step
counts, FLOP counts, the CPU count and allocator, the step scripts'
flags). All fast: the harness's functions on tiny inputs.
"""

import os

import keras
import numpy as np
import pytest
from review_benchmarks_test import _load as _load_benchmark

from keras_attnvariants.testing.usage_errors import usage_error

# The harness's compiled steps are `tf.function`s of TensorFlow layers.
on_tf = pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="the harness's steps run on the TensorFlow backend",
)


@pytest.fixture(scope="module")
def harness():
    return _load_benchmark("harness")


def test_ratio_table_shows_the_reference_time_and_the_others_ratios(harness):
    # The tables the README quotes: columns in increasing S whatever the
    # order of the results, the reference row its time, the other rows
    # `ratio (time)`, one separator cell per column.
    results = {
        512: {"keras MHA": (0.004, 1.0), "DNAS": (0.006, 1.5, "extra")},
        128: {"keras MHA": (0.001, 1.0), "DNAS": (0.0012, 1.2, "extra")},
    }
    table = harness.ratio_table("train", results, "keras MHA", ms_digits=1)
    assert table.splitlines() == [
        "| train | S=128 | S=512 |",
        "|---|---|---|",
        "| keras MHA | 1.0 ms | 4.0 ms |",
        "| DNAS | 1.20x (1.2 ms) | 1.50x (6.0 ms) |",
    ]


def test_write_report_prints_and_writes_only_with_a_path(
    harness, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    harness.write_report("| a |")
    assert capsys.readouterr().out == "| a |\n"
    assert not list(tmp_path.iterdir())
    path = tmp_path / "report.md"
    harness.write_report("| b |\n", str(path))
    assert capsys.readouterr().out == "| b |\n\n"
    assert path.read_text() == "| b |\n"


@on_tf
def test_train_step_adds_the_attention_losses_of_a_training_call(harness):
    # The guidance / KQ overhead rows time the attached attention losses:
    # the step's loss is mean(y^2) plus the layer's `add_loss` terms, which
    # run only with training=True.
    import tensorflow as tf

    import keras_attnvariants as kav
    from keras_attnvariants.testing.layer_zoo import WeightSquareLoss

    x = tf.constant(np.random.default_rng(0).normal(size=(2, 6, 8)), "float32")
    layer = kav.DoublyNormalizedAttention(
        2, 4, attention_losses=[WeightSquareLoss(name="weight_square")]
    )
    y = layer(x, x, training=True)
    terms = [float(t) for t in layer.losses]
    assert terms and min(terms) > 0
    want = float(tf.reduce_mean(tf.square(y))) + sum(terms)
    step = harness.compiled_train_step(layer, False)
    assert float(step(x)) == pytest.approx(want, rel=1e-5)


@on_tf
def test_infer_step_runs_the_layer_in_inference_mode(harness):
    # Dropout is off at inference: two forward passes agree, and equal the
    # eager `training=False` call.
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(0).normal(size=(2, 6, 8)), "float32")
    layer = keras.layers.MultiHeadAttention(2, 4, dropout=0.5, seed=0)
    layer(x, x)
    infer = harness.compiled_infer(layer, False)
    want = float(tf.reduce_sum(layer(x, x, training=False)))
    assert float(infer(x)) == pytest.approx(want, rel=1e-5)
    assert float(infer(x)) == float(infer(x))


def test_compiled_steps_are_xla_unless_asked_otherwise(harness):
    # The README's step ratios are of XLA-compiled steps
    # (`train_step_fn` / `infer_fn`); `compiled_*` take XLA on or off.
    layer = keras.layers.MultiHeadAttention(2, 4, seed=0)
    assert harness.train_step_fn(layer)._jit_compile is True
    assert harness.infer_fn(layer)._jit_compile is True
    assert harness.compiled_train_step(layer, False)._jit_compile is False
    assert harness.compiled_infer(layer, False)._jit_compile is False


def test_time_alternating_takes_one_step_count_for_all(harness, monkeypatch):
    # torch_compile_step.py and the overhead scripts pass an int.
    from review_benchmarks_test import _Clock

    clock = _Clock()
    monkeypatch.setattr(harness.time, "perf_counter", clock)
    calls = []

    def step(label, cost):
        clock.now += cost
        calls.append(label)
        return np.zeros(())

    times = harness.time_alternating(
        {"a": lambda: step("a", 1.0), "b": lambda: step("b", 3.0)}, 2, 4
    )
    assert times == {"a": [1.0, 1.0], "b": [3.0, 3.0]}
    assert calls.count("a") == calls.count("b") == 8


def test_time_alternating_orders_follow_the_seed(harness, monkeypatch):
    order = []
    calls = {
        label: (lambda label=label: order.append(label) or np.zeros(()))
        for label in "abcdefgh"
    }

    def orders(seed):
        order.clear()
        harness.time_alternating(calls, 3, 1, seed=seed)
        return list(order)

    assert orders(5) == orders(5)
    assert orders(5) != orders(6)


def test_steps_for_fills_min_time_for_fast_steps(harness, monkeypatch):
    from review_benchmarks_test import _Clock

    clock = _Clock()
    monkeypatch.setattr(harness.time, "perf_counter", clock)

    def fast():
        clock.now += 1e-4
        return np.zeros(())

    assert harness.steps_for(fast, 0.5) == 5000


def test_matmul_fn_counts_two_flops_per_multiply_add(harness):
    call, flops = harness.matmul_fn(8)
    assert flops == 2 * 8**3
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(8, 8)), rng.normal(size=(8, 8))
    assert float(call()) == pytest.approx(float((a @ b).sum()), rel=1e-4)


def test_compiled_flops_without_a_flop_count_is_none(harness):
    # A cost dict without "flops" (or with None) is no count, not 0.
    class Cost:
        def __init__(self, cost):
            self.cost = cost

        def cost_analysis(self):
            return self.cost

    for cost in ({"bytes accessed": 64.0}, {"flops": None}, [{"x": 1.0}]):
        assert harness.compiled_flops(Cost(cost)) is None, cost


def test_cpu_count_is_the_affinity_not_the_host(harness, monkeypatch):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no sched_getaffinity")
    monkeypatch.setattr(harness.os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(harness.os, "cpu_count", lambda: 64)
    assert harness.cpu_count() == 1


@pytest.mark.parametrize(
    "value, pooled", [("1", True), ("true", True), ("True", True), ("0", False)]
)
def test_cpu_allocator_reads_the_bfc_variable(
    harness, monkeypatch, value, pooled
):
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", value)
    assert harness.cpu_allocator().startswith("BFC pool") is pooled
    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC")
    assert harness.cpu_allocator() == "TensorFlow default (malloc)"


@pytest.mark.parametrize(
    "name", ["attention_step", "gumbel_step", "dropout_step"]
)
def test_step_scripts_reject_zero_heads_and_dim(name):
    # --heads 0 reached `dim % heads` (ZeroDivisionError); --dim 0 passed
    # the divisibility check.
    script = _load_benchmark(name)
    for argv in (["--heads", "0"], ["--dim", "0"]):
        usage_error(script.parse_args, argv)


def test_step_quick_sizes_and_default_modes():
    # --quick: the CI smoke sizes of the docstring (batch 2, dim 32, 2
    # heads, S=32), in place of sizes given with it (benchmarks/README.md);
    # both modes by default.
    script = _load_benchmark("attention_step")
    for argv in (["--quick"], ["--quick", "--batch", "4", "--lengths", "64"]):
        args = script.parse_args(argv)
        sizes = (args.batch, args.dim, args.heads, args.lengths)
        assert sizes == (2, 32, 2, [32]), argv
    assert script.parse_args([]).modes == ["train", "infer"]
