"""The command line: one-line errors for bad flags, non-zero exits."""

import os
import subprocess
import sys

import pytest

from keras_attnvariants.__main__ import main


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--bogus"], "unrecognized arguments: --bogus"),
        (["demo", "--variants", "nope"], "unknown variant(s) ['nope']"),
        (["demo", "--seed", "x"], "invalid int value: 'x'"),
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
