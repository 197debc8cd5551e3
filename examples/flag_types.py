"""argparse types shared by the example scripts: a bad value stops with a
one-line usage error naming the flag.

The scripts import this module by name (`examples/` is `sys.path[0]` when a
script in it runs).
"""

import argparse
import math
import os

from keras_attnvariants.validation import SEED_LIMIT


def positive_int(text):
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text):
    """argparse type: an int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text):
    """argparse type: a finite float > 0 (`inf` learning rates, scales or
    temperatures failed later, in the run, as NaN)."""
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {value}")
    return value


def non_negative_float(text):
    """argparse type: a finite float >= 0."""
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"must be finite and >= 0, got {value}"
        )
    return value


def unit_float(text):
    """argparse type: a float in [0, 1]."""
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return value


def seed(text):
    """argparse type: a seed, as `keras_attnvariants.validation.check_seed`
    takes it (an int in [0, 2**31), the range every Keras backend's
    SeedGenerator accepts)."""
    value = int(text)
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**31), got {value}")
    return value


def output_file(text):
    """argparse type: a file path whose folder exists and that is no folder
    (a figure written at the end of a run failed there, after all the
    work)."""
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder!r} does not exist")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    return text


def output_folder(text):
    """argparse type: a folder path that exists as a folder or can be made
    (no file in its place or above it): `os.makedirs` at the end of a run
    failed there, after all the work."""
    path = os.path.abspath(text)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise argparse.ArgumentTypeError(
            f"{path!r} is a file: no folder can be made at {text!r}"
        )
    return text
