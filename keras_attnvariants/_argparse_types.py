"""argparse types for output paths, shared by the demo CLI
(`python -m keras_attnvariants`), the example scripts
(`examples/flag_types.py`) and the benchmarks (`benchmarks/harness.py`).

Each script writes its outputs after the work (training, timings), so a
path it cannot write must stop it at parse time, with argparse's one-line
usage error, not with a traceback at the end.
"""

import argparse
import os


def folder_problem(path):
    """Why `path` could not be made or written as a folder, or `None`.

    The demo writes its outputs and its SavedModel after training, so a file
    in the way must be caught before the minutes of fine-tuning.
    """
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        if os.path.islink(existing):
            # A dangling link: `os.makedirs` would raise FileExistsError.
            return f"{existing!r} is a link to a missing target"
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing!r} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing!r} is not writable"
    return None


def folder(text):
    """argparse type: a folder that exists or can be made, and written."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a folder, got ''")
    problem = folder_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(
            f"must name a folder, got {text!r}: {problem}"
        )
    return text


def output_file(text):
    """argparse type: a file path whose folder exists and that is no
    folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a file, got ''")
    folder_name = os.path.dirname(text) or "."
    if not os.path.isdir(folder_name):
        raise argparse.ArgumentTypeError(
            f"folder {folder_name!r} does not exist"
        )
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    return text
