"""Review of the examples: arms that must compare like with like.

Each test fails without the fix it names (see the comments).
"""

import numpy as np

# The examples' loader and tiny BERT (pytest puts `tests/` on the path).
from examples_test import _load  # noqa: E402
from examples_test import _tiny_bert  # noqa: E402

from keras_attnvariants.testing.usage_errors import last_error_line  # noqa: E402
from keras_attnvariants.testing.usage_errors import usage_error  # noqa: E402


def test_kq_methods_start_from_the_baseline_classifier_head():
    # The seed was set before the conversion, where the adversaries of
    # "gan" and "ct" draw their weights: their classifier heads started
    # from other weights than the "none" baseline's they are compared to.
    example = _load("kq_alignment_finetune")
    backbone = _tiny_bert(6)

    def head(method):
        model = example.build_classifier(backbone, method, 0.1, 6, 1e-3, seed=0)
        return [w.numpy() for w in model.layers[-1].weights]

    baseline = head("none")
    for method in ("gan", "ct", "ot"):
        for got, want in zip(head(method), baseline):
            np.testing.assert_array_equal(got, want, err_msg=method)


def test_kq_adversarial_arm_at_weight_zero_trains_like_the_baseline():
    # With the term's weight at 0 an arm must train exactly as "none":
    # same head, same batches, same dropout masks. The adversaries of
    # "gan" and "ct" advanced the global random stream from which the
    # attention dropout layers drew their seeds, so their masks differed.
    import keras_hub

    example = _load("kq_alignment_finetune")
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=30,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=6,
        dropout=0.1,
    )
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(4, 30, (16, 6)).astype("int32"),
        "segment_ids": np.zeros((16, 6), "int32"),
        "padding_mask": np.ones((16, 6), "int32"),
    }
    y = rng.integers(0, 2, 16)

    def trained_head(method):
        model = example.build_classifier(backbone, method, 0.0, 6, 1e-2, seed=0)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        return model.layers[-1].weights[0].numpy()

    baseline = trained_head("none")
    for method in ("gan", "ct"):
        np.testing.assert_array_equal(
            trained_head(method), baseline, err_msg=method
        )


def test_arithmetic_rejects_a_negative_warmup():
    # `--warmup-steps -5` was accepted and made every learning rate NaN
    # (`sqrt(warmup / step)` of a negative warm-up).
    example = _load("thesis_multiview_arithmetic")
    error = last_error_line(example.parse_args, ["--warmup-steps", "-5"])
    assert "--warmup-steps" in error, error
    assert example.parse_args(["--warmup-steps", "0"]).warmup_steps == 0


def test_arithmetic_reports_overlap_and_unseen_accuracy():
    # Train and test are i.i.d. draws (as in the thesis): at the thesis's
    # sizes ~81% of the depth-1 test expressions are training examples,
    # so the table also gives the accuracy on the unseen ones.
    example = _load("thesis_multiview_arithmetic")
    train = {"infix": np.array(["1 + 2", "3 * 4", "(1 + 2) * 3"])}
    test = {
        "infix": np.array(["1 + 2", "4 + 4", "(1 + 2) * 3", "2 * 2"]),
        "depth": np.array([1, 1, 2, 1]),
        "label": np.array([3, 3, 4, 4]),
    }
    seen = example.seen_in_training(train, test)
    np.testing.assert_array_equal(seen, [True, False, True, False])
    overlap = example.overlap_by_depth(seen, test["depth"])
    np.testing.assert_allclose(overlap[:3], [50.0, 100 / 3, 100.0])
    assert np.isnan(overlap[3])  # no depth-3 example
    # Correct on the two seen examples only.
    logits = np.eye(5)[[3, 0, 4, 0]]
    values = example.accuracy_by_depth(
        logits, test["label"], test["depth"], seen
    )
    assert values[0] == 50.0 and values[4] == 0.0
    lines = example.table(
        {("separate", "infix"): values}, {("separate", "infix"): 3}
    ).splitlines()
    assert lines[0].endswith("| unseen |")
    assert lines[2].endswith("| 0.0 |")


def test_arithmetic_plot_takes_results_with_the_unseen_column(tmp_path):
    # The fifth ("unseen") value made `--plot` fail after all training
    # (4 values against 3 depths).

    example = _load("thesis_multiview_arithmetic")
    path = tmp_path / "depths.png"
    example.plot({("separate", "infix"): (50.0, 90.0, 40.0, 30.0, 20.0)}, path)
    assert path.stat().st_size > 0


def test_output_folders_and_scales_are_checked_before_the_work(tmp_path):
    # A file in an output folder's place (or above it) failed only at the
    # end, in `os.makedirs` or the export, after the training; `--scale inf`
    # failed in `np.histogram`.

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for name, flag in (
        ("attention_guidance_mlm", "--output-dir"),
        ("distributed_fit_and_export", "--output"),
        ("finetune_pretrained_with_variants", "--out"),
    ):
        example = _load(name)
        for bad in (str(blocker), str(blocker / "below")):
            assert "is a file" in usage_error(example.parse_args, [flag, bad])
        fresh = str(tmp_path / "new" / "folder")
        args = vars(example.parse_args([flag, fresh]))
        assert fresh in args.values()
    example = _load("explain_away_histogram")
    for bad in ("inf", "-inf", "nan", "0"):
        assert "--scale" in last_error_line(
            example.parse_args, ["--scale", bad]
        )
    assert example.parse_args(["--scale", "2.5"]).scale == 2.5
