"""argparse types shared by the example scripts: a bad value stops with a
one-line usage error naming the flag.

The scripts import this module by name (`examples/` is `sys.path[0]` when a
script in it runs).
"""

import argparse
import math

# Output paths, checked as the demo CLI and the benchmarks check theirs:
# `output_file` (a file whose folder exists) and `output_folder` (a folder
# that exists or can be made, and written).
from keras_attnvariants._argparse_types import folder as output_folder
from keras_attnvariants._argparse_types import output_file
from keras_attnvariants.validation import SEED_LIMIT

__all__ = [
    "non_negative_float",
    "non_negative_int",
    "output_file",
    "output_folder",
    "positive_float",
    "positive_int",
    "seed",
    "unit_float",
]


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
