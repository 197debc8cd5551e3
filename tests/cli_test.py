"""The command line: one-line errors for bad flags, non-zero exits."""

import os
import subprocess
import sys

import pytest

from keras_attnvariants.__main__ import main
from keras_attnvariants.__main__ import parse


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
    ],
)
def test_bad_flags_give_one_line_error_and_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err


def test_negative_seed_gives_one_line_error_before_running(capsys):
    # Seeds NumPy's generators, which take ints >= 0 only: without the
    # check the demo failed with a traceback after loading the model.
    with pytest.raises(SystemExit) as exit_info:
        parse(["demo", "--seed", "-1"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--seed: must be an int >= 0" in lines[0]


def test_module_entry_point_exits_nonzero_without_traceback():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-m", "keras_attnvariants", "demo", "--bogus"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith("(see --help)")


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
