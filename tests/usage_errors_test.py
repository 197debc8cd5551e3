"""`keras_attnvariants.testing.usage_errors`: it fails where it must."""

import argparse
import sys

import pytest

from keras_attnvariants.testing.usage_errors import last_error_line
from keras_attnvariants.testing.usage_errors import one_line_usage_error
from keras_attnvariants.testing.usage_errors import usage_error


def _parser():
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("--size", type=int, default=1)
    return parser


def _one_line(argv):
    if argv:
        sys.stderr.write(f"tool: error: bad {argv[0]}\n")
        raise SystemExit(2)


def test_usage_error_returns_argparse_stderr():
    err = usage_error(_parser().parse_args, ["--size", "x"])
    assert err.startswith("usage: tool")
    assert "argument --size: invalid int value: 'x'" in err
    line = last_error_line(_parser().parse_args, ["--size", "x"])
    assert line.startswith("tool: error: argument --size")
    assert one_line_usage_error(_one_line, ["--x"]) == "tool: error: bad --x"


def test_usage_error_fails_when_the_arguments_parse():
    with pytest.raises(AssertionError, match="parsed without a usage error"):
        usage_error(_parser().parse_args, ["--size", "3"])


@pytest.mark.parametrize("code", [0, 1, None, "message"])
def test_usage_error_fails_on_another_exit_status(code):
    def parse(argv):
        raise SystemExit(code)

    with pytest.raises(AssertionError, match="expected exit status 2"):
        usage_error(parse, [])


def test_usage_error_fails_when_stdout_is_written():
    def parse(argv):
        print("help text")
        raise SystemExit(2)

    with pytest.raises(AssertionError, match="wrote to stdout"):
        usage_error(parse, [])


def test_one_line_usage_error_fails_on_the_usage_text():
    with pytest.raises(AssertionError, match="expected one line"):
        one_line_usage_error(_parser().parse_args, ["--size", "x"])
    with pytest.raises(AssertionError, match="expected one line"):
        one_line_usage_error(lambda argv: sys.exit(2), [])


def test_last_error_line_fails_without_an_error_line():
    def parse(argv):
        sys.stderr.write("usage: tool\nsomething else\n")
        raise SystemExit(2)

    with pytest.raises(AssertionError, match="no error line"):
        last_error_line(parse, [])
    with pytest.raises(AssertionError, match="no error line"):
        last_error_line(lambda argv: sys.exit(2), [])


def test_other_exceptions_pass_through():
    def parse(argv):
        raise ValueError("not a usage error")

    with pytest.raises(ValueError, match="not a usage error"):
        usage_error(parse, [])
