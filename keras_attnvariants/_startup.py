"""What must happen before TensorFlow starts, in `python -m` runs.

`python -m keras_attnvariants` imports the package, and with it TensorFlow,
before `__main__` runs: TensorFlow's C++ start-up logs (CPU features, CUDA
probing) came ahead of the command line's one-line errors. The package
imports this module first.
"""

import os
import sys


def started_as_command_line(argv=None):
    """Whether `argv` (the interpreter's own, `sys.orig_argv`) runs
    `python -m keras_attnvariants`."""
    argv = list(getattr(sys, "orig_argv", []) if argv is None else argv)
    return any(
        arg == "-mkeras_attnvariants"
        or (arg == "-m" and argv[i + 1 : i + 2] == ["keras_attnvariants"])
        for i, arg in enumerate(argv)
    )


if started_as_command_line():
    # A user's own setting wins.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
