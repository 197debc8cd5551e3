"""The examples' helpers and flags, pinned after a mutation review
(2026-12-02) of `examples/flag_types.py` and the examples' pure functions:
each test fails on a mutation the suite let through (flag bounds, the
receptive-field scoring without BOS, the arithmetic table and plot,
bucketed batches, the learning-rate schedules, the time limit, the MLM
helpers, the fine-tuning batches and flags). All fast: no training loop,
no `--quick` run.
"""

import argparse

import keras
import numpy as np
import pytest
from examples_test import _load

from keras_attnvariants.testing.usage_errors import usage_error


def test_flag_types_bounds():
    # The boundaries of the examples' argparse types, called directly.
    flags = _load("flag_types")
    bad = argparse.ArgumentTypeError
    assert flags.non_negative_float("0") == 0.0
    assert flags.non_negative_int("0") == 0
    assert flags.unit_float("0") == 0.0 and flags.unit_float("1") == 1.0
    assert flags.seed(str(2**31 - 1)) == 2**31 - 1
    assert flags.positive_float("1e-9") == 1e-9
    for parse, text in (
        (flags.non_negative_float, "inf"),
        (flags.non_negative_float, "nan"),
        (flags.non_negative_float, "-1e-9"),
        (flags.positive_float, "inf"),
        (flags.positive_float, "0"),
        (flags.unit_float, "nan"),
        (flags.unit_float, "1.0001"),
        (flags.seed, str(2**31)),
        (flags.seed, "-1"),
        (flags.positive_int, "0"),
        (flags.non_negative_int, "-1"),
    ):
        with pytest.raises(bad):
            parse(text)
    # Integers are integers: 2.5 epochs is no silent 2.
    with pytest.raises(ValueError):
        flags.positive_int("2.5")


def test_receptive_field_scoring_without_bos_scores_every_position():
    example = _load("thesis_receptive_field")
    _, _, truth = example.language_model_data(4, 10, seed=0, bos=False)
    fields = np.ones_like(truth)  # every position reads every position
    got = example.scored(fields, truth, bos=False)
    want = tuple(float(v) for v in example.precision_recall(fields, truth))
    assert got == want and got[0] < 1.0


def test_arithmetic_table_without_unseen_or_thesis_figures():
    # Four values: no "unseen" column; a model without thesis figures
    # (the transformer control) shows "(-)" in all four.
    example = _load("thesis_multiview_arithmetic")
    lines = example.table(
        {("transformer", "infix"): (50.0, 90.0, 40.0, 20.0)},
        {("transformer", "infix"): 2},
    ).splitlines()
    assert lines[0].endswith("| depth 3 (thesis) |")
    assert lines[1] == "|---|---|---|---|---|---|---|"
    assert lines[2] == (
        "| transformer | infix | 2 | 50.0 (-) | 90.0 (-) | 40.0 (-) "
        "| 20.0 (-) |"
    )


def test_arithmetic_plot_draws_the_per_depth_accuracies(tmp_path):
    import matplotlib.pyplot as plt

    example = _load("thesis_multiview_arithmetic")
    example.plot(
        {("separate", "infix"): (50.0, 90.0, 40.0, 30.0, 20.0)},
        tmp_path / "depths.png",
    )
    (line,) = plt.gcf().axes[0].lines
    np.testing.assert_array_equal(line.get_xdata(), example.DEPTHS)
    np.testing.assert_array_equal(line.get_ydata(), [90.0, 40.0, 30.0])
    plt.close("all")


def test_bucketed_batches_keep_a_bucket_smaller_than_a_batch_and_reshuffle():
    example = _load("thesis_multiview_arithmetic")
    ids = np.zeros((67, 40), "int32")
    ids[:64, :5] = 3  # 64 rows of width 16: 8 batches of 8
    ids[64:, :30] = 4  # 3 rows of width 32: fewer than a batch
    batches = example.BucketedBatches(
        {"prefix": ids}, np.arange(67), batch_size=8, seed=0
    )
    plan = [tuple(np.sort(rows)) for rows in batches.batches]
    assert (64, 65, 66) in plan
    assert sorted(r for rows in plan for r in rows) == list(range(67))
    batches.on_epoch_end()
    assert [tuple(np.sort(rows)) for rows in batches.batches] != plan


def test_inverse_sqrt_warms_up_linearly_then_decays():
    example = _load("thesis_multiview_arithmetic")
    schedule = example.InverseSqrt(2.0, 4)
    got = [float(schedule(step)) for step in range(8)]
    want = [0.5, 1.0, 1.5, 2.0] + [2.0 * np.sqrt(4 / t) for t in (5, 6, 7, 8)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_time_limit_stops_after_the_epoch_that_passes_it(monkeypatch):
    example = _load("thesis_multiview_arithmetic")
    clock = [0.0]
    monkeypatch.setattr(example.time, "perf_counter", lambda: clock[0])

    class Model:
        stop_training = False

    limit = example.TimeLimit(10.0)
    limit.set_model(Model())
    limit.on_train_begin()
    clock[0] = 4.0
    limit.on_epoch_end(0)
    assert not limit.model.stop_training and limit.epochs == 1
    clock[0] = 11.0
    limit.on_epoch_end(1)
    assert limit.model.stop_training and limit.epochs == 2


def test_mlm_helpers():
    example = _load("attention_guidance_mlm")
    # 15% of the words (length - [CLS] - [SEP]), rounded up.
    assert [example.max_predictions(n) for n in (3, 32, 128)] == [1, 5, 19]
    # Step losses from Keras's running means (4, 3, 3) -> 4, 2, 3.
    steps = example.StepLosses()
    for batch, mean in enumerate((4.0, 3.0, 3.0)):
        steps.on_train_batch_end(batch, {"mlm": mean})
    np.testing.assert_allclose(steps.values, [4.0, 2.0, 3.0])
    # Moving average: full windows only; a window longer than the curve
    # is the curve's mean.
    np.testing.assert_allclose(example.smooth([1, 2, 3, 4], 2), [1.5, 2.5, 3.5])
    np.testing.assert_allclose(example.smooth([1, 2, 3], 9), [2.0])
    # The loss is the mean over predicted slots (label >= 0) only.
    logits = np.log(np.array([[[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]]))
    labels = np.array([[0, 1, -1]])
    want = -(np.log(0.5) + np.log(0.1)) / 2
    got = float(example.mlm_loss(labels, logits.astype("float32")))
    assert got == pytest.approx(want, rel=1e-5)


def test_mlm_rejects_dropout_one():
    example = _load("attention_guidance_mlm")
    assert "--dropout" in usage_error(example.parse_args, ["--dropout", "1"])


def test_kq_batches_cover_every_row_once_in_order():
    example = _load("kq_alignment_finetune")
    inputs = {"token_ids": np.arange(7), "padding_mask": np.arange(7) * 2}
    chunks = example.batches(inputs, 3)
    assert all(len(chunk) == 1 for chunk in chunks)  # `(x,)` per batch
    np.testing.assert_array_equal(
        np.concatenate([c[0]["token_ids"] for c in chunks]), np.arange(7)
    )
    assert [len(c[0]["padding_mask"]) for c in chunks] == [3, 3, 1]


def test_kq_and_finetune_flags_at_their_limits():
    kq = _load("kq_alignment_finetune")
    assert kq.parse_args(["--layers", "6"]).layers == 6
    finetune = _load("finetune_pretrained_with_variants")
    assert "--variants" in usage_error(
        finetune.parse_args, ["--variants", "dnas,hnsa"]
    )


def test_hybrid_weights_take_the_multiplied_rate_and_no_decay():
    example = _load("finetune_pretrained_with_variants")
    hybrid = keras.Variable(np.ones(3, "float32"), name="hybrid_weight")
    kernel = keras.Variable(np.ones(3, "float32"), name="kernel")
    optimizer = example.HybridLearningRateAdamW(1e-3, 100.0)
    # Adam's first step is the learning rate (times the gradient's sign).
    optimizer.apply([np.ones(3, "float32")] * 2, [hybrid, kernel])
    np.testing.assert_allclose(1 - hybrid.numpy(), 0.1, rtol=1e-3)
    decay = 1e-3 * optimizer.weight_decay
    np.testing.assert_allclose(1 - kernel.numpy(), 1e-3 + decay, rtol=1e-3)
    # No gradient: the kernel still decays, the hybrid weight stays.
    hybrid.assign(np.ones(3)), kernel.assign(np.ones(3))
    zeros = np.zeros(3, "float32")
    fresh = example.HybridLearningRateAdamW(1e-3, 100.0)
    fresh.apply([zeros, zeros], [hybrid, kernel])
    np.testing.assert_array_equal(hybrid.numpy(), np.ones(3))
    assert (kernel.numpy() < 1).all()
