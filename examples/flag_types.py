"""argparse types shared by the example scripts: a bad value stops with a
one-line usage error naming the flag.

The scripts import this module by name (`examples/` is `sys.path[0]` when a
script in it runs).
"""

import argparse
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
    """argparse type: a float > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def non_negative_float(text):
    """argparse type: a float >= 0."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
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
    """argparse type: a file path whose folder exists (a figure written at
    the end of a run failed there, after all the work)."""
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder!r} does not exist")
    return text
