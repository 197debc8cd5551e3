"""Data plumbing of the examples.

The examples are scripts, not package modules; these tests import them by
path and check what a wrong answer would silently corrupt: the alignment
of inputs, targets and true dependencies, the batches of the bucketed
training set, padding kept out of the small classifiers, and the variants
of the fine-tuning example starting from the same classifier head.
"""

import importlib.util
import pathlib
import sys

import keras
import numpy as np
import pytest

from keras_attnvariants.datasets.stack_language import dependencies
from keras_attnvariants.testing.usage_errors import last_error_line

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _load(name):
    # As when a script runs: `examples/` on the path for `flag_types`.
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_receptive_field_bos_data_aligns_inputs_targets_and_truth():
    example = _load("thesis_receptive_field")
    inputs, targets, truth = example.language_model_data(6, 12, seed=3)
    assert inputs.shape == targets.shape == (6, 12)
    assert truth.shape == (6, 12, 12)
    np.testing.assert_array_equal(inputs[:, 0], example.BOS)
    # Teacher forcing: input position p holds the target of position p - 1.
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
    # BOS is no word: it is never a dependency, and predicting the first
    # token depends on nothing.
    assert not truth[:, 0].any() and not truth[:, :, 0].any()
    for row, field in zip(targets - 2, truth):
        # Input position p >= 1 holds token p - 1 and predicts token p:
        # its field is that of the prediction made at token p - 1, over
        # input positions (token q sits at input position q + 1).
        np.testing.assert_array_equal(
            field[1:, 1:], dependencies(row)[:-1, :-1]
        )


def test_receptive_field_scoring_ignores_bos():
    example = _load("thesis_receptive_field")
    _, _, truth = example.language_model_data(4, 10, seed=0)
    fields = truth.copy()
    fields[:, :, 0] = True  # every prediction also "reads" BOS
    precision, recall = example.scored(fields, truth, bos=True)
    assert precision == recall == 1.0
    precision, _ = example.precision_recall(fields[:, 1:], truth[:, 1:])
    assert float(precision) < 1.0


def test_bucketed_batches_cover_each_example_once_and_trim_padding():
    example = _load("thesis_multiview_arithmetic")
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 60, size=200)
    ids = np.zeros((200, 62), "int32")
    for row, n in zip(ids, lengths):
        row[:n] = rng.integers(1, 10, size=n)
    other = np.roll(ids, 1, axis=0)  # a second view with other lengths
    labels = np.arange(200)
    batches = example.BucketedBatches(
        {"prefix": ids, "infix": other}, labels, batch_size=8, seed=1
    )
    seen = []
    for index in range(len(batches)):
        x, y = batches[index]
        np.testing.assert_array_equal(y["prefix"], y["infix"])
        rows = y["prefix"]
        width = x["prefix"].shape[1]
        assert width == x["infix"].shape[1]
        assert width % 16 == 0 or width == ids.shape[1]
        for view, full in (("prefix", ids), ("infix", other)):
            # Only padding is cut off.
            np.testing.assert_array_equal(x[view], full[rows, :width])
            assert not full[rows, width:].any()
        seen.extend(rows.tolist())
    assert len(seen) == len(set(seen))
    # Only the remainders of the buckets are left out of an epoch.
    assert len(seen) > 200 - 8 * len(batches.buckets)


def test_bucketed_batches_fit_whatever_the_first_widths():
    # On TensorFlow Keras fixed the PyDataset's shapes from its first two
    # batches: when both came from one bucket a wider batch later failed
    # (the --quick run crashed for seeds 1 and 2).
    example = _load("thesis_multiview_arithmetic")
    ids = np.zeros((48, 40), "int32")
    ids[:32, :10] = 3  # two batches of width 16 ...
    ids[32:, :35] = 4  # ... and one of width 48 (the full width: 40)
    batches = example.BucketedBatches(
        {"prefix": ids}, np.arange(48) % 5, batch_size=16, seed=0
    )
    widths = [batches[i][0]["prefix"].shape[1] for i in range(len(batches))]
    batches.batches.sort(key=lambda rows: ids[rows].astype(bool).sum())
    assert sorted(widths) == [16, 16, 40]
    inputs = keras.Input((None,), dtype="int32", name="prefix")
    pooled = keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(10, 4)(inputs)
    )
    model = keras.Model(
        {"prefix": inputs}, {"prefix": keras.layers.Dense(5)(pooled)}
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(True))
    history = model.fit(batches.for_fit(), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


def test_arithmetic_models_ignore_trailing_padding():
    # Bucketed batches feed each batch at its own width: a prediction must
    # not depend on how much padding follows the expression.
    example = _load("thesis_multiview_arithmetic")
    args = example.parse_args(["--quick", "--num-layers", "2"])
    data = example.multiview_arithmetic(4, max_depth=1, seed=0)
    length = 40
    x = example.encode(data, length)
    width = max(int((x[v] > 0).sum(1).max()) for v in example.VIEWS)
    for kind, views in (
        ("multiview", example.VIEWS),
        ("transformer", ("infix",)),
    ):
        model = example.build_model(kind, views, length, args)
        full = model.predict({v: x[v] for v in views}, verbose=0)
        trimmed = model.predict({v: x[v][:, :width] for v in views}, verbose=0)
        for v in views:
            np.testing.assert_allclose(full[v], trimmed[v], atol=1e-5)


def _tiny_bert(length):
    """A 1-layer, 8-wide keras-hub BERT over 30 token ids (random init)."""
    import keras_hub

    return keras_hub.models.BertBackbone(
        vocabulary_size=30,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=length,
    )


def _padding_row_changed(model, tokens):
    """Predictions before and after the padding id's embedding changes."""
    embedding = next(
        layer
        for layer in model.layers
        if layer.__class__.__name__ == "Embedding"
    )
    before = model.predict(tokens, verbose=0)
    table = embedding.get_weights()[0]
    table[0] = np.random.default_rng(1).normal(size=table.shape[1]) * 3
    embedding.set_weights([table])
    return before, model.predict(tokens, verbose=0)


def test_quickstart_classifiers_ignore_padding():
    # The prediction of a sequence must not depend on its padding: Keras
    # MHA drops the Keras mask of its inputs, so the residual sum carries
    # none and the pooling averaged the padded positions too.
    import keras

    import keras_attnvariants as kav

    example = _load("quickstart_functional")
    tokens, _ = example.make_data(16, seed=0)
    assert (tokens == 0).any()
    for make in (
        lambda: keras.layers.MultiHeadAttention(4, 8),
        lambda: kav.DoublyNormalizedAttention(4, 8),
        lambda: kav.HybridAttention(4, 8, hybrid_init=0.5),
    ):
        keras.utils.set_random_seed(0)
        before, after = _padding_row_changed(example.build(make()), tokens)
        np.testing.assert_allclose(before, after, atol=1e-5)


def test_distributed_example_model_ignores_padding():
    # Both attention layers must mask the padded keys (the second one got
    # no mask at all) and the pooling must skip the padded positions.
    example = _load("distributed_fit_and_export")
    tokens, _ = example.make_data(16)
    assert (tokens == 0).any()
    before, after = _padding_row_changed(example.build_model(), tokens)
    np.testing.assert_allclose(before, after, atol=1e-5)


def test_finetune_variants_start_from_the_same_classifier_head():
    # The seed is set per variant so that the variants compare; the
    # conversion draws random numbers, so the converted variants' heads
    # were initialized differently from the standard one's.
    import argparse

    example = _load("finetune_pretrained_with_variants")
    backbone = _tiny_bert(8)
    args = argparse.Namespace(
        seed=3,
        hybrid_init=0.1,
        learning_rate=1e-4,
        hybrid_lr_multiplier=100.0,
        run_eagerly=True,
    )
    heads = {
        name: [
            w.numpy()
            for w in example.build_classifier(
                backbone, name, args
            ).output_dense.weights
        ]
        for name in example.VARIANTS
    }
    for name in example.VARIANTS:
        for got, want in zip(heads[name], heads["standard"]):
            np.testing.assert_array_equal(got, want, err_msg=name)


def _quick_and_explicit(name, flag, attribute, explicit):
    """`attribute` under `--quick` alone and with `flag explicit` too."""
    example = _load(name)
    quick = getattr(example.parse_args(["--quick"]), attribute)
    given = getattr(
        example.parse_args(["--quick", flag, str(explicit)]), attribute
    )
    return quick, given


def test_mlm_masking_follows_bert():
    example = _load("attention_guidance_mlm")
    rng = np.random.default_rng(0)
    count, length, vocab = 4000, 32, 50
    specials = len(example.SPECIALS)
    windows = np.full((count, length), example.PAD, "int32")
    sizes = rng.integers(0, length - 1, count)  # words per window
    for row, size in enumerate(sizes):
        body = rng.integers(example.UNK, vocab, size)
        body[body < specials] = example.UNK  # [UNK] is a word
        windows[row, : size + 2] = [example.CLS, *body, example.SEP]
    inputs, positions, labels = example.mask_tokens(windows, vocab, rng)
    slots = example.max_predictions(length)
    assert positions.shape == labels.shape == (count, slots)
    used = labels >= 0
    # round(15%) of the words, at least one (when there is one), at most
    # `slots`; distinct positions, only on words.
    expected = np.clip(np.rint(0.15 * sizes), 1, slots) * (sizes > 0)
    np.testing.assert_array_equal(used.sum(1), expected)
    rows = np.arange(count)[:, None]
    picked = windows[rows, positions]
    np.testing.assert_array_equal(labels[used], picked[used])
    assert not np.isin(
        picked[used], [example.PAD, example.CLS, example.SEP]
    ).any()
    for row in range(count):
        assert len(set(positions[row][used[row]])) == used[row].sum()
    np.testing.assert_array_equal(positions[~used], 0)
    # Only predicted positions change: 80% to [MASK], 10% to a random
    # word, 10% kept.
    changed = inputs != windows
    predicted = np.zeros_like(changed)
    predicted[np.broadcast_to(rows, positions.shape)[used], positions[used]] = (
        True
    )
    assert not changed[~predicted].any()
    now = inputs[rows, positions][used]
    masked = np.mean(now == example.MASK)
    assert 0.77 < masked < 0.83, masked
    other = (now != example.MASK) & (now != picked[used])
    # 10% of 9,000 predictions, less the random word equal to the old one.
    assert 0.08 < np.mean(other) < 0.12, np.mean(other)
    assert (now[other] >= specials).all()  # random words, no specials
    np.testing.assert_array_equal(
        example.model_inputs(inputs, positions)["padding_mask"],
        inputs != example.PAD,
    )


def test_quick_sets_defaults_that_explicit_flags_override():
    # `--quick` overwrote flags given with it, so `--quick --num-layers 2`
    # silently ran 1 layer (the padding test above asked for 2).
    for name, flag, attribute, quick_value, explicit in (
        ("thesis_multiview_arithmetic", "--num-layers", "num_layers", 1, 2),
        ("thesis_multiview_arithmetic", "--epochs", "epochs", 1, 3),
        ("thesis_receptive_field", "--num-layers", "num_layers", 2, 3),
        ("thesis_receptive_field", "--train-size", "train_size", 256, 100),
        (
            "finetune_pretrained_with_variants",
            "--num-layers",
            "num_layers",
            2,
            1,
        ),
        ("finetune_pretrained_with_variants", "--train", "train", 16, 32),
        ("kq_alignment_finetune", "--layers", "layers", 1, 2),
        ("attention_guidance_mlm", "--steps", "steps", 40, 10),
    ):
        quick, given = _quick_and_explicit(name, flag, attribute, explicit)
        assert (quick, given) == (quick_value, explicit), (name, flag)


def test_invalid_flags_exit_with_a_one_line_usage_error():
    # Zero sizes were silently replaced by the defaults (`args.x or
    # default`), and the others failed deep inside Keras or NumPy
    # (ZeroDivisionError for short windows, a ValueError from the layer,
    # a key dim silently truncated when --hidden % --heads != 0).
    for name, argv, flag in (
        (
            "finetune_pretrained_with_variants",
            ["--num-layers", "0"],
            "--num-layers",
        ),
        (
            "finetune_pretrained_with_variants",
            ["--hybrid-init", "1.5"],
            "--hybrid-init",
        ),
        ("finetune_pretrained_with_variants", ["--test", "0"], "--test"),
        ("kq_alignment_finetune", ["--layers", "0"], "--layers"),
        ("kq_alignment_finetune", ["--quick", "--layers", "7"], "--layers"),
        ("kq_alignment_finetune", ["--weights", "0.1", "-1"], "--weights"),
        ("kq_alignment_finetune", ["--epochs", "0"], "--epochs"),
        ("attention_guidance_mlm", ["--quick", "--steps", "0"], "--steps"),
        ("attention_guidance_mlm", ["--heads", "5"], "--hidden"),
        ("attention_guidance_mlm", ["--length", "9"], "--length"),
        ("attention_guidance_mlm", ["--vocab-size", "5"], "--vocab-size"),
        ("thesis_multiview_arithmetic", ["--d-model", "30"], "--d-model"),
        ("thesis_receptive_field", ["--length", "2"], "--length"),
        # Bad seeds ended in tracebacks (np.random.seed, the block's
        # check_seed after `seed + i`).
        ("thesis_receptive_field", ["--seed", "-1"], "--seed"),
        ("thesis_multiview_arithmetic", ["--seed", str(2**32)], "--seed"),
        ("attention_guidance_mlm", ["--seed", "-3"], "--seed"),
        ("finetune_pretrained_with_variants", ["--seed", "-1"], "--seed"),
        # Figures were written after all the work: a missing folder ended
        # in a FileNotFoundError traceback then; a scale of 0 ran.
        ("explain_away_histogram", ["--output", "/no/such/x.png"], "--output"),
        ("explain_away_histogram", ["--scale", "0"], "--scale"),
        ("dnas_mode_collapse", ["--output", "/no/such/x.png"], "--output"),
        ("thesis_receptive_field", ["--plot", "/no/such/x.png"], "--plot"),
        ("thesis_multiview_arithmetic", ["--plot", "/no/x.png"], "--plot"),
    ):
        error = last_error_line(_load(name).parse_args, argv)
        assert flag in error, (name, argv, error)


def test_arithmetic_models_start_from_the_seed_whatever_ran_before():
    # The seed was set once before all models, so a model's initial
    # weights depended on which models had been built before it.
    import keras

    example = _load("thesis_multiview_arithmetic")
    args = example.parse_args(["--quick", "--seed", "4"])

    def initial_weights():
        model = example.build_model("multiview", example.VIEWS, 12, args)
        return [w.numpy() for w in model.weights]

    first = initial_weights()
    keras.random.normal((3,), seed=None)  # another model's draws
    keras.utils.set_random_seed(99)
    second = initial_weights()
    assert len(first) == len(second)
    for got, want in zip(second, first):
        np.testing.assert_array_equal(got, want)


def test_arithmetic_table_states_the_epochs_run():
    # With --time-limit the summary claimed `--epochs` epochs for every
    # model, however few had run.
    example = _load("thesis_multiview_arithmetic")
    results = {
        ("separate", "prefix"): (50.0, 90.0, 40.0, 20.0),
        ("multiview", "prefix"): (60.0, 95.0, 50.0, 30.0),
    }
    lines = example.table(
        results, {("separate", "prefix"): 56, ("multiview", "prefix"): 75}
    ).splitlines()
    assert "| epochs |" in lines[0]
    assert lines[2].startswith("| separate | prefix | 56 | 50.0 (45.9) |")
    assert lines[3].startswith("| multiview | prefix | 75 | 60.0 (65.3) |")


@pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="a tf.distribute strategy",
)
def test_finetune_trains_every_variant_under_a_strategy(monkeypatch, tmp_path):
    # Under a tf.distribute strategy (one GPU or more: a MirroredStrategy)
    # "standard" fit the pretrained backbone, loaded outside the strategy
    # scope, and failed ("`colocate_vars_with` must only be passed a
    # variable created in this tf.distribute.Strategy.scope()").
    # OneDeviceStrategy checks variables the same way, on the CPU.
    import tensorflow as tf

    from keras_attnvariants import distribute

    example = _load("finetune_pretrained_with_variants")
    length = 8

    def load_minilm(sequence_length):
        backbone = _tiny_bert(length)

        def preprocessor(texts):
            ids = np.array([[2 + len(t) % 20] * length for t in texts])
            return {
                "token_ids": ids.astype("int32"),
                "segment_ids": np.zeros_like(ids, "int32"),
                "padding_mask": np.ones_like(ids, bool),
            }

        return backbone, preprocessor

    def rotten_tomatoes(count, seed):
        return [f"review {i}" for i in range(count)], np.arange(count) % 2

    strategies = []

    def pick_strategy(**kwargs):
        strategies.append(tf.distribute.OneDeviceStrategy("/cpu:0"))
        return strategies[-1]

    monkeypatch.setattr(example, "load_minilm", load_minilm)
    monkeypatch.setattr(example, "rotten_tomatoes", rotten_tomatoes)
    monkeypatch.setattr(distribute, "pick_strategy", pick_strategy)
    example.main(
        [
            "--quick",
            "--variants",
            "dnas,standard",
            "--sequence-length",
            str(length),
            "--out",
            str(tmp_path),
        ]
    )
    assert strategies


def test_finetune_features_have_no_bool_inputs():
    # Keras sums the first batch's inputs across replicas with AddN, which
    # takes no bool: the preprocessor's bool padding mask failed `fit`
    # under a MirroredStrategy over 2 devices (see the MLM test below).
    example = _load("finetune_pretrained_with_variants")

    def preprocessor(texts):
        mask = np.arange(6)[None] < np.array([[4], [6]])
        return {
            "token_ids": np.where(mask, 7, 0).astype("int32"),
            "segment_ids": np.zeros((2, 6), "int32"),
            "padding_mask": mask,
        }

    features = example.encode(preprocessor, ["a b", "c d e"])
    assert {k: v.dtype for k, v in features.items()} == {
        "token_ids": "int32",
        "segment_ids": "int32",
        "padding_mask": "int32",
    }
    np.testing.assert_array_equal(
        features["padding_mask"], preprocessor(None)["padding_mask"]
    )


MLM_UNDER_MIRRORED = """
import argparse, json, sys
sys.path.insert(0, {examples!r})
import numpy as np
import keras_attnvariants as kav
from keras_attnvariants import distribute

distribute.split_cpu(2)
pick = distribute.pick_strategy
distribute.pick_strategy = lambda **kwargs: pick(cpu_replicas=2)
import attention_guidance_mlm as example

terms = []
class Recorded(kav.AttentionGuidanceRegularizer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        terms.append(self)
kav.AttentionGuidanceRegularizer = Recorded
args = argparse.Namespace(
    steps=3, batch_size=4, layers=1, heads=2, hidden=8, length=12,
    dropout=0.0, learning_rate=1e-3, alpha=1.0, reduction="mean", seed=0,
)
rng = np.random.default_rng(0)
windows = np.zeros((12, 12), "int32")
windows[:, 0], windows[:, 1:11], windows[:, 11] = 2, 7, 3
windows[:, 1:11] = rng.integers(5, 30, (12, 10))
inputs, positions, labels = example.mask_tokens(windows, 30, rng)
features = example.model_inputs(inputs, positions)
curve, _ = example.train(args, 30, features, labels, guided=True)
(term,) = terms
print(json.dumps({{
    "step": float(term.step.numpy()),
    "sync_on_read": type(term.step.value).__name__,
    "curve": [float(v) for v in curve],
}}))
"""


@pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="a tf.distribute strategy",
)
def test_mlm_guidance_counts_steps_under_mirrored_strategy():
    # The guidance term was once created before `model_scope()` was
    # entered, with a step counter made in its constructor: a plain
    # variable that both replicas advanced, so `alpha_t` decayed twice as
    # fast on 2 GPUs (the counter is now made at build, in the scope; see
    # tests/distribute_test.py). And a bool padding mask
    # failed under several replicas (Keras reduces the first batch's
    # inputs with AddN, which takes no bool): keras-hub's inputs are int.
    from keras_attnvariants.testing.subprocesses import run_json_script

    script = MLM_UNDER_MIRRORED.format(examples=str(EXAMPLES))
    result = run_json_script(script, timeout=600, KERAS_BACKEND="tensorflow")
    assert result["sync_on_read"] == "SyncOnReadVariable"
    assert result["step"] == 3.0
    assert len(result["curve"]) == 3
    assert np.all(np.isfinite(result["curve"]))


def test_kq_classifier_takes_no_bool_input():
    # A bool `padding_mask` input failed `fit` under a multi-replica
    # MirroredStrategy (Keras reduces the first batch's inputs with AddN).

    example = _load("kq_alignment_finetune")
    backbone = _tiny_bert(6)
    model = example.build_classifier(backbone, "none", 0.0, 6, 1e-3, seed=0)
    dtypes = {
        x.name: keras.backend.standardize_dtype(x.dtype) for x in model.inputs
    }
    assert dtypes == dict.fromkeys(
        ("token_ids", "segment_ids", "padding_mask"), "int32"
    )
    # Padding still masked: the padded token's id does not matter.
    mask = np.array([[1, 1, 1, 1, 0, 0]], "int32")
    outputs = [
        model.predict(
            {
                "token_ids": np.array([[2, 5, 6, 3, pad, pad]], "int32"),
                "segment_ids": np.zeros((1, 6), "int32"),
                "padding_mask": mask,
            },
            verbose=0,
        )
        for pad in (0, 9)
    ]
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-6)
