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


def is_int(value):
    """True for a Python or NumPy integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def check_bool(name, value):
    """`value` as a Python bool; only Python and NumPy booleans are accepted
    (not `0` / `1`, strings such as `"false"`, or None)."""
    if not _is_bool(value):
        raise ValueError(f"`{name}` must be a bool. Received: {name}={value!r}")
    return bool(value)


def check_int(name, value, low=1, high=None):
    """`value` as a Python int in `[low, high]` (`high` None: no bound)."""
    if not is_int(value):
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
        # Comparisons, not `math.isfinite`: torch.compile traces a float
        # attribute's `math.isfinite` as a tensor op and broke the graph
        # (every dropout call under `jit_compile=True` on PyTorch). On the
        # value as a Python float, as returned: a NumPy longdouble beyond
        # float64's range becomes inf there. False for NaN too.
        ok = -math.inf < float(value) < math.inf
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
    if not is_int(seed) or not 0 <= seed < SEED_LIMIT:
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


def check_unit_float(name, value):
    """`value` as a Python float in `[0, 1]` (Python and NumPy numbers, not
    booleans or nan)."""
    ok = not _is_bool(value) and isinstance(value, numbers.Real)
    if ok:
        ok = math.isfinite(value) and 0.0 <= value <= 1.0
    if not ok:
        raise ValueError(
            f"`{name}` must be a float in [0, 1]. Received: {name}={value!r}"
        )
    return float(value)


def _static_dim(dim):
    """An int for a dimension known when tracing, None otherwise (None, a
    tensor, a symbolic dimension of a JAX export)."""
    if not is_int(dim):
        return None
    try:
        return int(dim)
    except Exception:  # a symbolic dimension without a value
        return None


def static_shape(x):
    """The shape of `x` known when tracing: a tuple of ints and None
    (unknown sizes), or None for an unknown rank. Reads `x.shape` only
    (no op runs); array-likes without one (lists, Python numbers) get
    NumPy's shape."""
    shape = getattr(x, "shape", None)
    try:
        if shape is None:
            shape = np.shape(x)
        dims = tuple(shape)
    except (TypeError, ValueError):  # unknown rank; ragged lists
        return None
    return tuple(_static_dim(d) for d in dims)


def check_broadcastable(name, shape, target_shape, target):
    """`ValueError` unless the static `shape` of argument `name` broadcasts
    to `target_shape` (the shape of `target`, words for the message): no
    more axes, and each trailing size 1 or equal. Unknown sizes (None) and
    an unknown rank (`shape` None) pass."""
    if shape is None or target_shape is None:
        return
    ok = len(shape) <= len(target_shape) and all(
        d is None or t is None or d in (1, t)
        for d, t in zip(reversed(shape), reversed(target_shape))
    )
    if not ok:
        raise ValueError(
            f"`{name}` must be broadcastable to {target}, shape "
            f"{target_shape}. Received: {name} with shape {shape}"
        )


def check_rank(name, shape, ranks, expected):
    """`ValueError` unless the static `shape` of argument `name` has one of
    the `ranks` (an unknown rank, `shape` None, passes). `expected` words
    the form, e.g. `"(B, N, T)"`."""
    if shape is not None and len(shape) not in ranks:
        raise ValueError(
            f"`{name}` must have shape {expected}. "
            f"Received: {name} with shape {shape}"
        )


def same_size(a, b):
    """False only when both static sizes are known and differ."""
    return a is None or b is None or a == b


def check_shape(name, shape):
    """`shape` as a tuple of sizes: Python or NumPy ints >= 0, or scalar
    tensors (dynamic sizes, passed unchecked). `ValueError` for an int
    instead of a sequence, a string, or a size that is None, a bool, a
    float or negative."""
    dims = None
    if not isinstance(shape, (str, bytes)) and hasattr(shape, "__len__"):
        try:
            dims = tuple(shape)
        except (TypeError, ValueError):  # unknown rank; a symbolic tensor
            dims = None
    ok = dims is not None and all(
        not (
            d is None
            or isinstance(d, (str, bytes))
            or _is_bool(d)
            or (
                isinstance(d, numbers.Number)
                and not (isinstance(d, numbers.Integral) and d >= 0)
            )
        )
        for d in dims
    )
    if not ok:
        raise ValueError(
            f"`{name}` must be a tuple of ints >= 0. Received: {name}={shape!r}"
        )
    return dims


def static_sizes(shape):
    """A shape tuple (e.g. from `ops.shape`, which may hold tensors for
    dynamic sizes) as ints and None (unknown sizes)."""
    return tuple(_static_dim(d) for d in shape)


def check_integer_dtype(name, x, form):
    """`ValueError` unless `x` (a tensor or array-like) has an integer
    dtype; `form` describes the expected value (e.g. `"ids (B, T)"`).
    Reads the dtype only, never the values."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    # Keras's names ("int32", "uint8", ...); imported here, as this module
    # is otherwise free of Keras.
    from keras import backend

    dtype = backend.standardize_dtype(dtype)
    if "int" not in dtype:
        raise ValueError(
            f"`{name}` must be integer {form}. "
            f"Received: {name} with dtype {dtype}"
        )


def is_python_value(value):
    """True for None, strings and Python or NumPy scalars: the arguments a
    check reads by value (tensors, variables and arrays are not)."""
    return value is None or isinstance(
        value, (str, bytes, numbers.Number, np.generic)
    )


def python_scalars(kwargs, names):
    """`kwargs` with the NumPy scalars under `names` made Python ones.

    Keras turns NumPy call arguments into tensors, which a layer's checks
    of a Python flag or index (`use_causal_mask`, the two-stream `view`)
    cannot read.
    """
    if not any(isinstance(kwargs.get(name), np.generic) for name in names):
        return kwargs
    return {
        key: value.item()
        if key in names and isinstance(value, np.generic)
        else value
        for key, value in kwargs.items()
    }
