"""Argument checks shared by the layers, losses, data and tools.

Each accepts Python and NumPy scalars (the numeric checks: not booleans;
`check_bool`: booleans only), raises `ValueError` naming the argument, the
expected form and the received value, and returns the value as a Python
scalar (so configs stay JSON).
"""

import math
import numbers

import numpy as np


def _is_bool(value):
    return isinstance(value, (bool, np.bool_))


def check_bool(name, value):
    """`value` as a Python bool; only Python and NumPy booleans are accepted
    (not `0` / `1`, strings such as `"false"`, or None)."""
    if not _is_bool(value):
        raise ValueError(f"`{name}` must be a bool. Received: {name}={value!r}")
    return bool(value)


def check_int(name, value, low=1, high=None):
    """`value` as a Python int in `[low, high]` (`high` None: no bound)."""
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        ok = False
    else:
        ok = value >= low and (high is None or value <= high)
    if not ok:
        expected = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(
            f"`{name}` must be an int {expected}. Received: {name}={value!r}"
        )
    return int(value)


def check_float(name, value, low=0.0, low_inclusive=False):
    """`value` as a finite Python float `> low` (`>= low` if inclusive;
    `low=None`: any finite float)."""
    ok = not _is_bool(value) and isinstance(value, numbers.Real)
    if ok and low is not None:
        ok = value >= low if low_inclusive else value > low
    if ok:
        ok = math.isfinite(value)
    if not ok:
        if low is None:
            bound = ""
        else:
            bound = f" >= {low}" if low_inclusive else f" > {low}"
        raise ValueError(
            f"`{name}` must be a finite float{bound}. "
            f"Received: {name}={value!r}"
        )
    return float(value)


# Seeds are ints in [0, SEED_LIMIT): see `check_seed`.
SEED_LIMIT = 2**31


def layer_seed(seed, index):
    """The seed of the `index`-th of several layers seeded from one `seed`
    (`seed + index`, wrapped into the seed range); None stays None."""
    return None if seed is None else (seed + index) % SEED_LIMIT


def check_seed(seed, allow_none=True):
    """`seed` as a Python int in `[0, 2**31)`, or None (unseeded) where
    `allow_none`.

    The range every backend takes (Keras stores a PyTorch SeedGenerator's
    state as int32, and JAX's as uint32); larger TensorFlow seeds would
    also draw the noise of their low 32 bits.
    """
    if seed is None and allow_none:
        return None
    if (
        seed is None
        or _is_bool(seed)
        or not isinstance(seed, numbers.Integral)
        or not 0 <= seed < SEED_LIMIT
    ):
        allowed = " or None" if allow_none else ""
        raise ValueError(
            f"`seed` must be an int in [0, 2**31){allowed}. "
            f"Received: seed={seed!r}"
        )
    return int(seed)


def check_attention_losses(attention_losses):
    """`ValueError` unless `attention_losses` is None, a list or a tuple (a
    single term raised `TypeError`, not iterable; a string was split into
    characters)."""
    if attention_losses is not None and not isinstance(
        attention_losses, (list, tuple)
    ):
        raise ValueError(
            "`attention_losses` must be a list of "
            "`keras_attnvariants.losses.AttentionLoss` instances. "
            f"Received: attention_losses={attention_losses!r}"
        )
