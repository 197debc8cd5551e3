"""The command line's handoff to the demo, the demo's reporting, scoring
and conversions, and two `evaluation` edges, pinned after a mutation
review (2026-12-02) of `__main__.py`, `demo.py` and `evaluation.py`: each
test fails on a mutation the suite let through (several were caught only
by the slow two-replica demo run). All fast: no training, no export, no
subprocess (the demo's pieces are patched)."""

import json

import keras
import numpy as np
import pytest
from cli_test import _refuse_to_start

from keras_attnvariants import evaluation
from keras_attnvariants.__main__ import main
from keras_attnvariants.__main__ import parse
from keras_attnvariants.testing.usage_errors import one_line_usage_error

# argument parsing

# The demo's parser refuses any other backend.
on_tf = pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="the demo runs on the TensorFlow backend",
)


def test_cpu_replicas_that_is_no_int_gives_one_line_error():
    line = one_line_usage_error(parse, ["demo", "--cpu-replicas", "x"])
    assert "--cpu-replicas: must be an int >= 1, got 'x'" in line


@on_tf
def test_jit_compile_alone_or_with_one_cpu_replica_is_accepted():
    # Only a MirroredStrategy over several logical CPUs is refused with XLA.
    args = parse(["demo", "--jit-compile"])
    assert args.jit_compile and args.cpu_replicas is None
    args = parse(["demo", "--jit-compile", "--cpu-replicas", "1"])
    assert args.jit_compile and args.cpu_replicas == 1


@on_tf
def test_variants_flag_strips_spaces_and_rejects_an_empty_list():
    args = parse(["demo", "--variants", " dnas, hnas+kq "])
    assert args.variants == ("dnas", "hnas+kq")
    # "," names no variant: it must not fall back to all six.
    assert "unknown variant(s) ','" in one_line_usage_error(
        parse, ["demo", "--variants", ","]
    )


@on_tf
def test_seed_zero_is_accepted():
    assert parse(["demo", "--seed", "0"]).seed == 0


@on_tf
def test_main_passes_every_flag_to_the_demo_and_exits_1_without_parity(
    tmp_path, monkeypatch
):
    from keras_attnvariants import demo

    calls = []
    parity = [True]

    def fake_run(**kwargs):
        calls.append(kwargs)
        return {"reload_parity": parity[0]}

    monkeypatch.setattr(demo, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    out, exported = str(tmp_path / "out"), str(tmp_path / "exported")
    argv = [
        "demo",
        "--quick",
        "--variants",
        "gumbel,standard",
        "--seed",
        "7",
        "--jit-compile",
        "--cpu-replicas",
        "1",
        "--output",
        out,
        "--export-dir",
        exported,
    ]
    assert main(argv) == 0
    assert calls[-1] == {
        "size": "quick",
        "variants": ("gumbel", "standard"),
        "output": out,
        "seed": 7,
        "jit_compile": True,
        "export_dir": exported,
        "cpu_replicas": 1,
    }
    parity[0] = False
    assert main(["demo", "--full"]) == 1
    assert calls[-1]["size"] == "full"
    assert calls[-1]["variants"] == demo.VARIANTS
    assert calls[-1]["seed"] == 0 and not calls[-1]["jit_compile"]
    assert main(["demo"]) == 1
    assert calls[-1]["size"] == "default"


# demo.run


@pytest.mark.parametrize(
    "kwargs",
    [
        {"seed": 2**32 - 1},
        {"seed": 0},
        {"cpu_replicas": 1, "jit_compile": True},
    ],
)
def test_demo_run_accepts_the_edge_arguments(kwargs, tmp_path, monkeypatch):
    # The edges of what `run` documents: these reach the strategy.
    from keras_attnvariants import demo
    from keras_attnvariants import distribute

    monkeypatch.setattr(distribute, "split_cpu", lambda n: None)
    monkeypatch.setattr(distribute, "pick_strategy", _refuse_to_start)
    with pytest.raises(AssertionError, match="the demo started running"):
        demo.run(
            size="quick",
            output=str(tmp_path / "out"),
            export_dir=str(tmp_path / "exported"),
            **kwargs,
        )


class _FakeStrategy:
    num_replicas_in_sync = 1


def _fake_result(accuracy, step_time=0.1, hybrid=None):
    rng = np.random.default_rng(0)
    return {
        "accuracy": accuracy,
        "ece": 0.1,
        "explained_away": 0.0,
        "mmd": 0.01,
        "hybrid": hybrid,
        "column_sums": rng.uniform(0.1, 2.0, 8),
        "example_attention": rng.uniform(size=(4, 4)),
        "step_time": step_time,
        "metrics": ["accuracy", "loss"],
    }


@pytest.mark.parametrize("diff, parity", [(1e-5, True), (1e-3, False)])
def test_demo_run_exports_the_most_accurate_variant(
    diff, parity, tmp_path, monkeypatch
):
    # The orchestration of `run`, without training: which model is
    # exported, the parity verdict, the strategy it asks for, the files.
    from keras_attnvariants import demo
    from keras_attnvariants import distribute

    accuracy = {"standard": 0.6, "dnas": 0.9, "gumbel": 0.7}
    asked, exported = {}, []
    monkeypatch.setattr(
        distribute, "split_cpu", lambda n: asked.setdefault("split", n)
    )

    def pick_strategy(**kwargs):
        asked.update(kwargs)
        return _FakeStrategy()

    monkeypatch.setattr(distribute, "pick_strategy", pick_strategy)
    monkeypatch.setattr(
        demo,
        "load_task",
        lambda size, seed: {"name": "fake", "example": None, "seed": seed},
    )
    monkeypatch.setattr(
        demo,
        "run_variant",
        lambda variant, task, size, strategy, jit: (
            f"model of {variant}",
            _fake_result(accuracy[variant]),
        ),
    )
    monkeypatch.setattr(demo, "save_plots", lambda results, output, ex: [])

    def export_and_check(model, task, export_dir):
        exported.append((model, export_dir))
        return diff

    monkeypatch.setattr(demo, "export_and_check", export_and_check)
    out, export_dir = tmp_path / "out", str(tmp_path / "exported")
    summary = demo.run(
        size="quick",
        variants=tuple(accuracy),
        output=str(out),
        export_dir=export_dir,
        cpu_replicas=1,
    )
    assert asked == {"split": 1, "cpu_replicas": 1}
    assert exported == [("model of dnas", export_dir)]
    assert summary["best"] == "dnas"
    assert summary["reload_parity"] is parity
    assert summary["reload_max_abs_diff"] == diff
    with open(out / "summary.json") as f:
        written = json.load(f)
    assert written["best"] == "dnas" and written["reload_parity"] is parity
    assert set(written["results"]["dnas"]) == {
        "accuracy",
        "ece",
        "explained_away",
        "mmd",
        "hybrid",
        "step_time",
        "metrics",
    }
    assert (out / "table.md").read_text() == summary["table"] + "\n"


def test_demo_table_reports_relative_step_time_and_hybrid_per_layer():
    from keras_attnvariants import demo

    u = np.array([[0.0, 0.5], [1.0, 0.5]])  # (layers, heads)
    table = demo.format_table(
        {
            "standard": _fake_result(0.5, step_time=0.1),
            "hnas": _fake_result(0.75, step_time=0.25, hybrid=u),
        }
    )
    head, rule, standard, hnas = table.splitlines()
    # One rule cell per column.
    assert rule == "|" + "---|" * (head.count("|") - 1)
    assert "| 1.00x " in standard and standard.endswith("| - |")
    assert "| 2.50x " in hnas
    assert hnas.endswith("| 0.25 0.75 |")  # mean over each layer's heads
    # Without standard attention there is no reference time.
    only = demo.format_table({"dnas": _fake_result(0.5)}).splitlines()[-1]
    assert "| -         |" in only


def test_demo_run_variant_times_the_steps_after_the_first(monkeypatch):
    # The first step compiles: its time is left out. The guidance decays
    # over every step of the run: ceil(33 / 8) = 5 steps in one epoch.
    from keras_attnvariants import demo

    built = []

    class FakeModel:
        def fit(self, x, y, batch_size, epochs, callbacks, verbose):
            assert batch_size == 8 and epochs == 1 and len(y) == 33
            callbacks[0].times.extend([10.0, 1.0, 1.0, 2.0])
            return type("History", (), {"history": {"loss": [], "acc": []}})

    def build_variant(variant, task, steps, strategy, jit_compile):
        built.append(steps)
        return "backbone", FakeModel()

    monkeypatch.setattr(demo, "build_variant", build_variant)
    monkeypatch.setattr(demo, "evaluate", lambda *args: {"accuracy": 1.0})
    task = {
        "features": {"token_ids": np.zeros((40, 4), "int32")},
        "labels": np.zeros(40, "int32"),
        "n_train": 33,
    }
    _, result = demo.run_variant("hnas+guidance", task, "quick", None, False)
    assert built == [5]
    assert result["step_time"] == 1.0
    assert result["metrics"] == ["acc", "loss"]


def test_demo_converts_each_variant_to_its_attention_and_losses():
    pytest.importorskip("keras_hub")
    import keras_attnvariants as kav
    from keras_attnvariants import demo
    from keras_attnvariants.backbones import hybrid_weights
    from keras_attnvariants.backbones import pretrained
    from keras_attnvariants.backbones.conversion import self_attention_layers

    def converted(variant):
        backbone = pretrained.random_bert(20, 8, seed=0)
        return demo.convert(backbone, variant, backbone.num_heads, 7)

    import keras

    for variant, cls in (
        ("standard", keras.layers.MultiHeadAttention),
        ("dnas", kav.DoublyNormalizedAttention),
        ("gumbel", kav.GumbelDiscreteAttention),
        ("hnas", kav.HybridAttention),
    ):
        layers = self_attention_layers(converted(variant))
        assert [type(x) for x in layers] == [cls, cls], variant
    np.testing.assert_allclose(hybrid_weights(converted("hnas")), 0.1)
    for variant, term_class in (
        ("hnas+guidance", kav.AttentionGuidanceRegularizer),
        ("hnas+kq", kav.KQAlignment),
    ):
        layers = self_attention_layers(converted(variant))
        for layer in layers:
            assert isinstance(layer, kav.HybridAttention)
            terms = list(layer.attention_losses)
            assert len(terms) == 1 and isinstance(terms[0], term_class)
        if variant == "hnas+guidance":
            assert terms[0].decay_steps == 7


def test_demo_classifier_pools_over_real_tokens_only():
    # The mean is over the padding mask: what the padded positions hold
    # (their token ids) must not change the prediction.
    pytest.importorskip("keras_hub")
    import keras

    from keras_attnvariants import demo
    from keras_attnvariants.backbones import pretrained

    model = demo.build_classifier(
        pretrained.random_bert(20, 6, seed=0), 1e-3, jit_compile=False
    )
    mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]], "int32")
    features = {
        "token_ids": np.where(mask, 5, 0).astype("int32"),
        "padding_mask": mask,
        "segment_ids": np.zeros((2, 6), "int32"),
    }
    other = dict(features, token_ids=np.where(mask, 5, 17).astype("int32"))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(features)),
        keras.ops.convert_to_numpy(model(other)),
        rtol=1e-5,
        atol=1e-6,
    )


def test_demo_evaluate_reports_accuracy_calibration_and_explaining_away(
    monkeypatch,
):
    # `evaluate` on crafted attention: valid queries attend key 0 only,
    # padded queries attend every key. With padded queries left out, every
    # valid key but key 0 is explained away.
    pytest.importorskip("keras_hub")
    import keras

    from keras_attnvariants import backbones
    from keras_attnvariants import demo
    from keras_attnvariants.backbones import pretrained

    rng = np.random.default_rng(0)
    lengths = np.array([8, 8, 8, 8, 4, 5, 8, 2])
    mask = np.arange(8)[None] < lengths[:, None]
    features = {
        "token_ids": np.where(mask, rng.integers(4, 20, (8, 8)), 0),
        "padding_mask": mask.astype("int32"),
        "segment_ids": np.zeros((8, 8), "int32"),
    }
    backbone = pretrained.random_bert(20, 8, seed=0)
    model = demo.build_classifier(backbone, 1e-3, jit_compile=False)
    test = {k: v[4:] for k, v in features.items()}
    probs = keras.ops.convert_to_numpy(model(test))
    labels = np.concatenate([[0, 1, 0, 1], probs.argmax(-1)])
    labels[-1] = 1 - labels[-1]  # 3 of 4 right
    task = {"features": features, "labels": labels, "n_train": 4}

    def crafted(heads):
        w = np.zeros((4, heads, 8, 8))
        w[..., 0] = 1.0
        padded_query = ~mask[4:][:, None, :, None]
        return np.where(padded_query, 1 / 8, w)

    layers = [crafted(4), crafted(4) * 0 + 1 / 8]
    monkeypatch.setattr(backbones, "attention_weights", lambda b, x: layers)
    result = demo.evaluate(model, backbone, "standard", task, batch=4)
    assert result["accuracy"] == pytest.approx(0.75)
    assert result["ece"] == pytest.approx(
        evaluation.expected_calibration_error(probs, labels[4:])
    )
    # Layer 0: all valid keys but key 0 (15 of 19); layer 1: none.
    first = (lengths[4:] - 1).sum() / lengths[4:].sum()
    assert result["explained_away"] == pytest.approx(first / 2)
    np.testing.assert_array_equal(result["example_attention"], layers[-1][0, 0])
    assert result["hybrid"] is None


def test_demo_export_check_reports_the_largest_difference(monkeypatch):
    import tensorflow as tf

    from keras_attnvariants import demo

    class FakeModel:
        def export(self, path, verbose):
            self.path = path

        def __call__(self, sample, training):
            return np.zeros((len(sample["token_ids"]), 2), "float32")

    class Served:
        def serve(self, sample):
            got = np.zeros((len(sample["token_ids"]), 2), "float32")
            got[1, 0] = 0.5
            return got

    monkeypatch.setattr(tf.saved_model, "load", lambda path: Served())
    task = {"features": {"token_ids": np.zeros((6, 3), "int32")}}
    assert demo.export_and_check(FakeModel(), task, "somewhere") == 0.5


def test_demo_synthetic_task_features_are_int32(monkeypatch):
    # Under several replicas Keras sums the first batch with AddN, which
    # rejects bool: every feature the demo feeds is int32.
    pytest.importorskip("keras_hub")
    from keras_attnvariants import demo
    from keras_attnvariants.datasets import offline

    monkeypatch.setattr(offline, "minilm_path", lambda: None)
    task = demo.load_task("quick", 0)
    assert {k: v.dtype.name for k, v in task["features"].items()} == {
        "token_ids": "int32",
        "padding_mask": "int32",
        "segment_ids": "int32",
    }
    assert task["n_train"] == 32 and len(task["labels"]) == 64


# evaluation


def test_ece_takes_boolean_binary_labels():
    p1 = np.array([[0.9], [0.2], [0.6]])
    got = evaluation.expected_calibration_error(
        p1, np.array([True, False, False])
    )
    want = evaluation.expected_calibration_error(p1, np.array([1, 0, 0]))
    assert got == pytest.approx(want)


def test_explained_away_default_epsilon_is_the_papers_1e_8():
    # Key 1 receives 1e-7 in all: not explained away at epsilon = 1e-8.
    weights = np.array([[[[1.0 - 1e-7, 1e-7], [1.0, 0.0]]]])
    assert evaluation.explained_away_fraction(weights) == 0.0
    weights[0, 0, 0] = [1.0 - 1e-9, 1e-9]
    assert evaluation.explained_away_fraction(weights) == 0.5
