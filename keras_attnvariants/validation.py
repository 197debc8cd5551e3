"""Argument checks shared by the layers, losses, data and tools."""

import numbers


def check_int(name, value, low=1):
    """`value` as a Python int, or `ValueError` naming `name`.

    Accepts Python and NumPy integers `>= low` (not booleans).
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < low
    ):
        raise ValueError(
            f"`{name}` must be an int >= {low}. Received: {name}={value!r}"
        )
    return int(value)
