"""Checking a command line's usage errors (argparse's exit status 2)."""

import contextlib
import io


def usage_error(parse, argv):
    """Runs `parse(argv)`, expecting a usage error; returns its stderr.

    A usage error is argparse's: `SystemExit` with status 2, nothing on
    stdout. stderr is read here (not through pytest's `capsys`), so the
    helper serves unittest-style tests too.

    Args:
        parse: the callable under test (a parser's `parse_args`, a
            `main`).
        argv: list of argument strings.

    Returns:
        The text `parse` wrote to stderr.

    Raises:
        AssertionError: `parse` returned, exited with another status, or
            wrote to stdout.
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parse(argv)
        except SystemExit as exit_info:
            code = exit_info.code
        else:
            raise AssertionError(f"{argv!r} parsed without a usage error")
    if code != 2:
        raise AssertionError(
            f"{argv!r}: expected exit status 2, got {code!r}; stderr: "
            f"{err.getvalue()!r}"
        )
    if out.getvalue():
        raise AssertionError(f"{argv!r} wrote to stdout: {out.getvalue()!r}")
    return err.getvalue()


def one_line_usage_error(parse, argv):
    """`usage_error` whose stderr is one line (no usage text); that line."""
    lines = usage_error(parse, argv).strip().splitlines()
    if len(lines) != 1:
        raise AssertionError(f"{argv!r}: expected one line, got {lines!r}")
    return lines[0]


def last_error_line(parse, argv):
    """`usage_error`'s last line, argparse's `prog: error: ...` line."""
    lines = usage_error(parse, argv).strip().splitlines()
    if not lines or "error:" not in lines[-1]:
        raise AssertionError(f"{argv!r}: no error line in {lines!r}")
    return lines[-1]
