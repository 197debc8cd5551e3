"""Gumbel-softmax sampling of attention weights.

Pure functions on `keras.ops`. Scores are `(..., T, S)`: queries on axis -2,
keys on axis -1. Everything runs in float32. Masked keys get weight exactly
0 and are never selected; a query row with no valid key gives all zeros,
never NaN.

The relaxed sample (Jang et al. 2017; Maddison et al. 2017) is

`y = softmax((log_softmax(s) + g) / temperature)`, `g = -log(-log(U))`,

with `U ~ Uniform(0, 1)`. Like the thesis code, both logs are clamped with
`1e-20` so `U = 0` and `U = 1` stay finite.
"""

import numbers

import keras
from keras import ops

from keras_attnvariants.ops.masking import MASK_FILL
from keras_attnvariants.ops.normalization import as_scores
from keras_attnvariants.ops.normalization import row_max
from keras_attnvariants.ops.normalization import statically_empty
from keras_attnvariants.validation import check_broadcastable
from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_integer_dtype
from keras_attnvariants.validation import check_rank
from keras_attnvariants.validation import check_seed
from keras_attnvariants.validation import check_shape
from keras_attnvariants.validation import is_int
from keras_attnvariants.validation import is_python_value
from keras_attnvariants.validation import same_size
from keras_attnvariants.validation import static_shape

FLOAT32_MIN = -3.4028234663852886e38
# Clamp inside both logs of the Gumbel transform (thesis code).
GUMBEL_EPS = 1e-20
# Floor of a tensor temperature (`relaxed_logits`), the value at which
# `GumbelDiscreteAttention` floors its temperature variable: a schedule or
# a tensor that reaches 0 cannot divide by zero (NaN weights).
MIN_TEMPERATURE = 1e-4


def _temperature(temperature, scores_shape):
    """The float32 temperature of `relaxed_logits`.

    A Python or NumPy number must be a finite float > 0 (`ValueError`:
    `np.float32(0)` gave NaN weights, a negative one inverted the sample;
    None and strings failed in the backend). A tensor (e.g. a schedule's
    variable) is floored at `MIN_TEMPERATURE`, as the layer floors its
    own: its value is not known when tracing, and a 0 gave NaN weights.
    So is a number: at 1e-38, `(s + g) / temperature` overflowed to inf
    (NaN weights), and below 1e-20 the mask fill rose above valid keys
    (a row of zeros).
    """
    if is_python_value(temperature):
        temperature = check_float("temperature", temperature)
        return ops.cast(max(temperature, MIN_TEMPERATURE), "float32")
    check_broadcastable(
        "temperature", static_shape(temperature), scores_shape, "`scores`"
    )
    return ops.maximum(ops.cast(temperature, "float32"), MIN_TEMPERATURE)


def _check_mask(mask, target_shape, target="`scores`"):
    """`ValueError` unless `mask` (or None) broadcasts to `target_shape`."""
    if mask is not None:
        check_broadcastable("mask", static_shape(mask), target_shape, target)


def gumbel_from_uniform(uniform):
    """Standard Gumbel noise `-log(-log(U))` from float32 uniforms.

    Args:
        uniform: tensor of values in `[0, 1)`.

    Returns:
        A float32 tensor of the same shape, finite for every input in
        `[0, 1]`.
    """
    u = ops.cast(uniform, "float32")
    return -ops.log(-ops.log(u + GUMBEL_EPS) + GUMBEL_EPS)


def gumbel_noise(shape, seed=None):
    """Float32 standard Gumbel noise drawn with `keras.random`.

    Args:
        shape: tuple of ints >= 0, the noise shape.
        seed: int in `[0, 2**31)` (Python or NumPy),
            `keras.random.SeedGenerator` or `None`. With an int or a
            generator in a given state the noise is reproducible.

    Returns:
        A float32 tensor of shape `shape`.

    Note: the layers of this package draw their training noise with
    `positional_uniform` instead: there an entry depends on its index, not
    on the whole shape, so a sample on real tokens does not change with
    the amount of padding after them. On the TensorFlow backend under XLA
    on CPU, `keras.random`'s default stateless algorithm is also very slow
    (8M uniforms: about 3 s, against 40 ms with `alg="threefry"`;
    TensorFlow 2.21).
    """
    check_shape("shape", shape)
    if not isinstance(seed, keras.random.SeedGenerator):
        # keras.random takes Python ints only (not NumPy ones).
        seed = check_seed(seed)
    uniform = keras.random.uniform(shape, dtype="float32", seed=seed)
    return gumbel_from_uniform(uniform)


def _word_dtype():
    """The dtype of hash words: uint32, or int32 on PyTorch (no uint32
    shifts on its CPU). On TensorFlow uint32 also keeps the multiplies on
    a GPU: its int32 `Mul` kernel computes in host memory."""
    return "int32" if keras.backend.backend() == "torch" else "uint32"


def _shift_right(x, bits):
    """Logical `x >> bits` on 32-bit words (int32 read as uint32)."""
    shifted = ops.right_shift(x, hash_words(bits))
    if _word_dtype() == "int32":  # arithmetic shift: clear the sign copies
        # `~(-1 << (32 - bits))` as word ops, not the Python int
        # `(1 << (32 - bits)) - 1`: under `jit_compile` on PyTorch,
        # torch.compile may trace `bits` as a symbolic int, and PyTorch
        # 2.11 (CUDA) failed to evaluate a symbolic `1 << n`.
        low = ops.left_shift(hash_words(-1), hash_words(32 - bits))
        shifted = ops.bitwise_and(shifted, ops.bitwise_not(low))
    return shifted


# MurmurHash3's finalizer multipliers, the golden-ratio increment, and the
# salts of the two row words.
_FMIX_1 = 0x85EBCA6B
_FMIX_2 = 0xC2B2AE35
_GOLDEN = 0x9E3779B9
_SALT_A = 0x243F6A88
_SALT_B = 0x85A308D3


def fmix32(x):
    """MurmurHash3's 32-bit finalizer, a bijection on 32-bit words.

    `x` holds uint32 words (int32 read as uint32 on PyTorch): the
    multiplications wrap and the right shifts are logical, so every
    backend gives the bits of the uint32 hash.
    """
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = ops.multiply(x, hash_words(_FMIX_1))
    x = ops.bitwise_xor(x, _shift_right(x, 13))
    x = ops.multiply(x, hash_words(_FMIX_2))
    return ops.bitwise_xor(x, _shift_right(x, 16))


def hash_words(x):
    """`x` as 32-bit hash words (its low 32 bits) in the dtype `fmix32`
    works on.

    Args:
        x: an int or a list of ints (constants: typed tensors with the same
            bits, so that no backend promotes the words to int64), or an
            integer tensor (cast).
    """
    dtype = _word_dtype()

    def word(value):
        # Python ints of any size: the low 32 bits, read as int32 on
        # PyTorch. Plain Python arithmetic, not NumPy: under
        # `jit_compile=True` on PyTorch, torch.compile broke its graph at
        # every NumPy constant (about 20 breaks per noise tensor, each
        # piece compiled on its own).
        value = int(value) % 2**32
        return value - 2**32 if dtype == "int32" and value >= 2**31 else value

    if isinstance(x, numbers.Integral):
        return ops.convert_to_tensor(word(x), dtype=dtype)
    if isinstance(x, (list, tuple)):
        return ops.convert_to_tensor([word(v) for v in x], dtype=dtype)
    return ops.cast(x, dtype)


def _coordinates(size, axis):
    """`fmix32(i * golden + axis + 1)` for the indices `i` of one axis."""
    index = ops.cast(ops.arange(size, dtype="int32"), _word_dtype())
    return fmix32(
        ops.add(ops.multiply(index, hash_words(_GOLDEN)), hash_words(axis + 1))
    )


def _check_key(key):
    """`ValueError` unless `key` is an int or an integer scalar tensor (a
    float key was truncated, None and strings failed in the backend)."""
    if is_python_value(key):
        ok = is_int(key)
    else:
        dtype = getattr(key, "dtype", None)
        ok = (
            dtype is not None
            and "int" in keras.backend.standardize_dtype(dtype)
            and static_shape(key) in ((), None)
        )
    if not ok:
        raise ValueError(
            "`key` must be an int or an integer scalar tensor. "
            f"Received: key={key!r}"
        )


def positional_uniform(key, shape):
    """Float32 uniforms in `(0, 1)` where each entry is a hash of `key` and
    of its own index.

    The entry at index `(i_0, ..., i_k)` does not depend on `shape`
    beyond that index: a tensor of shape `(B, N, T, S)` and one of shape
    `(B, N, T', S')` agree on their common `(t, s)` entries. Gumbel noise
    drawn this way gives the same sample on real tokens whatever the
    amount of padding that follows them; noise from `keras.random` changes
    everywhere when the shape does.

    Counter-based, like ThreeFry, with MurmurHash3's finalizer `fmix32`:
    two 32-bit words per row, `a` and `b`, are hashed from `key` and
    chained over the leading axes (`a = fmix32(a ^ c_axis(i))`, `b` with
    another salt); each entry of the last axis is then
    `fmix32(a ^ c(j) * (b | 1))`. Only that last round runs on the full
    tensor. With one word per row, two of the `B N T` rows would repeat
    each other's noise with probability `2**-32` per pair (hundreds of
    pairs at `(64, 16, 2048)` rows); with two, `2**-63`. The values are
    the 24 top bits, centred (`(bits + 0.5) / 2**24`), and identical on
    every backend, in and out of XLA.

    Cost: under XLA (TensorFlow `jit_compile=True`, JAX `jit`) the
    integer ops fuse into one pass: on a 2-core CPU, about 1.7x faster
    than TensorFlow's ThreeFry and 8x faster than JAX's
    `keras.random.uniform` (`(8, 4, 128, 128)` and `(8, 4, 512, 512)`).
    Run op by op (TensorFlow without XLA, PyTorch eager) each integer op
    is its own pass over the tensor, which is slower than the backends'
    own generators: 1.5-1.9x TensorFlow's Philox, 2-3x PyTorch's.

    Args:
        key: int (Python or NumPy, not a bool) or integer scalar tensor;
            its low 32 bits are used.
        shape: tuple of ints >= 0 (or scalar tensors), the output shape.

    Returns:
        A float32 tensor of shape `shape`.
    """
    _check_key(key)
    shape = check_shape("shape", shape)
    # rows: (2, ...), the words `a` and `b` of every row of the leading axes
    rows = fmix32(
        ops.bitwise_xor(hash_words(key), hash_words([_SALT_A, _SALT_B]))
    )
    if len(shape) == 0:
        h = rows[0]
    else:
        for axis, size in enumerate(shape[:-1]):
            coordinate = _coordinates(size, axis)
            rows = fmix32(
                ops.bitwise_xor(ops.expand_dims(rows, -1), coordinate)
            )
        last = _coordinates(shape[-1], len(shape) - 1)
        odd = ops.bitwise_or(ops.expand_dims(rows[1], -1), hash_words(1))
        h = fmix32(
            ops.bitwise_xor(
                ops.expand_dims(rows[0], -1), ops.multiply(last, odd)
            )
        )
    bits = _shift_right(h, 8)
    return (ops.cast(bits, "float32") + 0.5) * (2.0**-24)


# Bound of the clamped logits: far beyond any softmax-relevant gap, far
# below float32 overflow.
LOGIT_BOUND = 1e9


@ops.custom_gradient
def _clamp_logits(x):
    """`x` with NaN at 0 and values clamped to `+-LOGIT_BOUND`.

    The gradient passes where `|x| <= LOGIT_BOUND` (0 at NaN, +-inf and
    clamped entries), as the autodiff of `clip(nan_to_num(x))` does, but it
    is recomputed from `x` in the backward pass. Left to autodiff, XLA on
    CPU kept the clamped copy and both comparison masks as full-size
    buffers for the backward pass: two float32 and two boolean `(B, N, T,
    S)` writes per training step.
    """
    clamped = ops.clip(ops.nan_to_num(x, nan=0.0), -LOGIT_BOUND, LOGIT_BOUND)

    def grad(*args, upstream=None):
        upstream = args[0] if upstream is None else upstream
        return ops.where(ops.abs(x) <= LOGIT_BOUND, upstream, 0.0)

    return clamped, grad


def _finish(weights, mask):
    if mask is None:
        return weights
    mask = ops.broadcast_to(ops.cast(mask, "bool"), ops.shape(weights))
    return ops.where(mask, weights, 0.0)


def relaxed_sample(scores, noise, temperature=1.0, mask=None):
    """Relaxed Gumbel-softmax sample over the valid keys.

    `softmax((log_softmax(s) + g) / temperature)` over keys, float32.

    Args:
        scores: tensor `(..., T, S)` of attention logits.
        noise: float32 Gumbel noise broadcastable to `scores`, e.g. from
            `gumbel_noise`. Zero noise gives the tempered softmax.
        temperature: float > 0 (Python or NumPy), or a scalar tensor;
            either is floored at `MIN_TEMPERATURE` (a tensor's value is
            unknown when tracing; a 0 gave NaN weights, a float of 1e-38
            too).
        mask: optional boolean tensor broadcastable to `scores`, `True` =
            may attend.

    `ValueError` for a `noise` or `mask` whose static shape does not
    broadcast to `scores`.

    Returns:
        float32 weights shaped like `scores`: each row with a valid key is a
        distribution over its valid keys; masked entries and rows with no
        valid key are 0.
    """
    return sample_of_logits(
        relaxed_logits(scores, noise, temperature, mask), mask
    )


def sample_of_logits(logits, mask=None):
    """`relaxed_sample` from its `relaxed_logits`: their softmax, 0 on
    masked entries."""
    return _finish(ops.softmax(logits, axis=-1), mask)


def relaxed_logits(scores, noise, temperature=1.0, mask=None):
    """The logits whose softmax is `relaxed_sample`: `(s + g) / temperature`.

    `log_softmax(s) = s - logsumexp_j(s)` shifts each row by a constant,
    which the softmax removes: the clamped scores give the same sample,
    gradient included, without a logsumexp pass. Masked entries are
    `-2e9 / temperature` (at most `MASK_FILL`): below every valid entry,
    whose scores are clamped to `+-1e9` before the division, so a low
    temperature cannot push valid keys under the masked ones (a fixed
    `MASK_FILL` did at `|s| / temperature > 1e9`). Temperatures are
    floored at `MIN_TEMPERATURE`.
    """
    scores_shape = static_shape(scores)
    if noise is None:
        raise ValueError(
            "`noise` must be Gumbel noise broadcastable to `scores` (0.0 "
            "for none). Received: noise=None"
        )
    check_broadcastable("noise", static_shape(noise), scores_shape, "`scores`")
    _check_mask(mask, scores_shape)
    temperature = _temperature(temperature, scores_shape)
    logits = _clamp_logits(ops.cast(scores, "float32"))
    y = (logits + ops.cast(noise, "float32")) / temperature
    if mask is not None:
        fill = ops.minimum(MASK_FILL, -2.0 * LOGIT_BOUND / temperature)
        mask_b = ops.broadcast_to(ops.cast(mask, "bool"), ops.shape(y))
        y = ops.where(mask_b, y, fill)
    return y


def selection_logits(scores, mask=None):
    """float32 scores for argmax / Gumbel-max selection.

    Valid entries are clamped below at the smallest finite float32 and
    masked ones set to `-inf`, so a masked key never wins a row that has a
    valid key, whatever the valid scores. One elementwise pass: unlike
    `relaxed_logits` there is no NaN replacement or upper clamp, which
    selection does not need (the output is a value row, not a score).
    """
    x = ops.maximum(ops.cast(scores, "float32"), FLOAT32_MIN)
    if mask is None:
        return x
    _check_mask(mask, static_shape(x))
    mask = ops.broadcast_to(ops.cast(mask, "bool"), ops.shape(x))
    return ops.where(mask, x, float("-inf"))


def argmax_indices(logits):
    """`(..., T)` int32 indices of the largest logit of each row.

    Ties pick the first maximal key (`-0.0` and `0.0` tie on TensorFlow).
    A row holding NaN gives an index in range, never one past the end; an
    empty key axis gives index 0 on every backend. On
    TensorFlow this is the row maximum, then the smallest index that
    reaches it: two vectorized reductions, where XLA:CPU runs `argmax` (a
    reduction over value-index pairs) as a scalar loop; 2x faster at
    (8, 4, S, S) for S from 128 to 1024 on a 2-core AMD EPYC, and
    `keras.ops.argmax` adds a pass that orders `-0.0` below `0.0`. Under
    JAX's jit the two passes measured faster at S=128 but slower at 512,
    so JAX and PyTorch keep `keras.ops.argmax`.
    """
    if logits.shape[-1] == 0:
        # No key: JAX and PyTorch raise, TensorFlow's path gave -1; index 0
        # on every backend (`one_hot_at` of size 0 is empty anyway).
        return ops.zeros(ops.shape(logits)[:-1], "int32")
    if keras.backend.backend() != "tensorflow":
        return ops.cast(ops.argmax(logits, axis=-1), "int32")
    size = ops.shape(logits)[-1]
    top = row_max(logits)
    index = ops.arange(size, dtype="int32")
    # `initial`: no eager error on an empty batch or sequence.
    first = ops.min(
        ops.where(logits >= top, index, size), axis=-1, initial=size
    )
    # `logits >= NaN` is False everywhere: clamp into range.
    return ops.minimum(first, size - 1)


def one_hot_at(indices, size, mask=None):
    """Exactly one-hot float32 rows `(..., T, size)` at `indices` `(..., T)`.

    Entries outside `mask` (broadcastable to the result) are 0, so a row
    with no valid key is all zeros.
    """
    if isinstance(size, int) and size == 0:
        # No key (an empty sequence): PyTorch's one_hot raises.
        return ops.zeros((*ops.shape(indices), 0), "float32")
    return _finish(ops.one_hot(indices, size, dtype="float32"), mask)


def rows_with_valid_key(mask, indices):
    """`(B, N, T)` booleans: query rows of `mask` with a valid key, or None.

    Args:
        mask: boolean `(B, 1, T, S)` or `None`.
        indices: `(B, N, T)` selected key indices (gives the shape).
    """
    if mask is None:
        return None
    return ops.broadcast_to(ops.any(mask, axis=-1), ops.shape(indices))


def one_hot_argmax(scores, mask=None):
    """Exactly one-hot float32 weights at the noise-free argmax.

    Ties pick the first maximal key. Masked keys are never selected; a row
    with no valid key is all zeros. `ValueError` for scores with fewer
    than 2 axes `(..., T, S)`.
    """
    scores = as_scores(scores)
    indices = argmax_indices(selection_logits(scores, mask))
    return one_hot_at(indices, ops.shape(scores)[-1], mask)


def straight_through(soft, mask=None, logits=None):
    """Straight-through estimator: one-hot forward, `soft`'s gradient.

    Args:
        soft: float32 weights `(..., T, S)`, e.g. from `relaxed_sample`.
        mask: optional boolean mask broadcastable to `soft` (`ValueError`
            if its static shape is not).
        logits: optional logits whose softmax `soft` is (`relaxed_logits`),
            shaped like `soft`. The one-hot is then at their argmax, the
            Gumbel-max sample at any temperature: at very high ones (1e6
            and up) their softmax rounds to ties in float32, whose argmax
            is the first valid key.

    Returns:
        `one_hot(argmax(soft)) + (soft - stop_gradient(soft))`: exactly
        one-hot in the forward pass (0 on masked entries and rows without
        a valid key), with the gradient of `soft`.
    """
    soft = ops.cast(soft, "float32")
    _check_mask(mask, static_shape(soft), "`soft`")
    if logits is None:
        pick = soft
    else:
        if static_shape(logits) != static_shape(soft):
            raise ValueError(
                "`logits` must have the shape of `soft` "
                f"{static_shape(soft)}. Received: logits with shape "
                f"{static_shape(logits)}"
            )
        pick = selection_logits(logits, mask)
    hard = one_hot_at(argmax_indices(pick), ops.shape(soft)[-1], mask)
    # The bracket is exactly 0 forward, so the forward value is exactly hard.
    return hard + (soft - ops.stop_gradient(soft))


def _value_rows(indices, num_keys, num_heads):
    """`(B, T, N)` rows of the picked keys in values flattened to rows.

    Row `(b * S + s) * N + n` of `(B, S, N, H)` values reshaped to
    `(B * S * N, H)` is key `s` of head `n` in example `b`, so one gather
    (or segment sum) over these rows needs no transpose of the values or of
    the result.

    Args:
        indices: `(B, N, T)` int key index per head and query.
        num_keys: `S`.
        num_heads: `N`.
    """
    # picks: (B, T, N), heads on the last axis like the values
    picks = ops.transpose(ops.cast(indices, "int32"), (0, 2, 1))
    batch = ops.shape(picks)[0]
    examples = ops.arange(batch, dtype="int32")[:, None, None] * num_keys
    heads = ops.arange(num_heads, dtype="int32")
    return (examples + picks) * num_heads + heads


def _keep_valid_rows(picked, row_valid):
    """`(B, T, N, H)` rows of `picked` zeroed where `row_valid` `(B, N, T)`
    is False (queries without a valid key); `picked` if it is None."""
    if row_valid is None:
        return picked
    keep = ops.transpose(row_valid, (0, 2, 1))[..., None]
    return picked * ops.cast(keep, picked.dtype)


def _check_indices(indices, batch, num_heads, source):
    """`ValueError` unless `indices` are integer `(B, N, T)` with the batch
    `B` and heads `N` of `source` (words for the message). Static shape
    and dtype only: the index values are not read."""
    shape = static_shape(indices)
    check_rank("indices", shape, (3,), "(B, N, T)")
    check_integer_dtype("indices", indices, "key indices `(B, N, T)`")
    if shape is not None and not (
        same_size(shape[0], batch) and same_size(shape[1], num_heads)
    ):
        raise ValueError(
            f"`indices` must be `(B, N, T)` with the `B` and `N` of {source}, "
            f"({batch}, {num_heads}, T). Received: indices with shape {shape}"
        )
    return shape


def _check_row_valid(row_valid, indices_shape):
    if row_valid is None or indices_shape is None:
        return
    shape = static_shape(row_valid)
    if shape is not None and not (
        len(shape) == 3 and all(map(same_size, shape, indices_shape))
    ):
        raise ValueError(
            "`row_valid` must be booleans of the shape of `indices`, "
            f"{indices_shape}. Received: row_valid with shape {shape}"
        )


def gather_values(value, indices, row_valid=None):
    """One value row per query: the output of one-hot attention.

    Args:
        value: `(B, S, N, H)` projected values (Keras MHA layout).
        indices: `(B, N, T)` integer key index per head and query, each in
            `[0, S)`. The values are not checked (that would read the
            tensor): out-of-range indices give a backend error, zeros or
            another key's row, depending on the backend.
        row_valid: optional `(B, N, T)` booleans; rows without a valid key
            give zeros.

    `ValueError` for static shapes or dtypes off this form (indices of
    batch or heads 1 were broadcast, float indices truncated).

    Returns:
        `(B, T, N, H)`, equal to `einsum("bnts,bsnh->btnh", one_hot, value)`
        without the `S`-long weighted sum: one gather of rows of the
        flattened values (no transposes).
    """
    value_shape = static_shape(value)
    check_rank("value", value_shape, (4,), "(B, S, N, H)")
    if value_shape is None:
        value_shape = (None,) * 4
    indices_shape = _check_indices(
        indices, value_shape[0], value_shape[2], "`value`"
    )
    _check_row_valid(row_valid, indices_shape)
    shape = ops.shape(value)
    if statically_empty(value, indices):
        # JAX's `take` loses the index shape.
        return ops.zeros(
            (shape[0], ops.shape(indices)[2], shape[2], shape[3]), value.dtype
        )
    rows = _value_rows(indices, shape[1], shape[2])
    flat = ops.reshape(value, (-1, shape[3]))
    picked = ops.take(flat, rows, axis=0)
    return _keep_valid_rows(picked, row_valid)


def _check_scatter_shapes(d_picked, indices, value_shape, row_valid):
    """The static checks of `scatter_values`' arguments."""
    sizes = check_shape("value_shape", value_shape)
    if len(sizes) != 4:
        raise ValueError(
            "`value_shape` must be the shape `(B, S, N, H)` of the values. "
            f"Received: value_shape={value_shape!r}"
        )
    sizes = tuple(s if isinstance(s, numbers.Integral) else None for s in sizes)
    picked = static_shape(d_picked)
    check_rank("d_picked", picked, (4,), "(B, T, N, H)")
    if picked is None:
        picked = (None,) * 4
    # d_picked gives B and N; then T, and H against value_shape.
    shape = _check_indices(indices, picked[0], picked[2], "`d_picked`")
    if shape is not None and not same_size(shape[2], picked[1]):
        raise ValueError(
            "`indices` must be `(B, N, T)` with the `T` of `d_picked`, "
            f"{picked[1]}. Received: indices with shape {shape}"
        )
    _check_row_valid(row_valid, shape)
    expected = (picked[0], None, picked[2], picked[3])
    if not all(map(same_size, sizes, expected)):
        raise ValueError(
            "`value_shape` must be `(B, S, N, H)` with the `B`, `N` and `H` "
            f"of `d_picked`, shape {picked}. "
            f"Received: value_shape={tuple(value_shape)!r}"
        )


def scatter_values(d_picked, indices, value_shape, row_valid=None):
    """The transpose of `gather_values`: the gradient of its `value`.

    Args:
        d_picked: `(B, T, N, H)`, the gradient of `gather_values`' result.
        indices: `(B, N, T)` integer key index per head and query, each in
            `[0, S)` (not checked, as in `gather_values`).
        value_shape: the shape `(B, S, N, H)` of the gathered values.
        row_valid: optional `(B, N, T)` booleans; rows without a valid key
            contribute nothing.

    `ValueError` for static shapes or dtypes off this form.

    Returns:
        `(B, S, N, H)` in `d_picked`'s dtype: each key's row is the sum of
        the rows of the queries that picked it, equal to
        `einsum("btnh,bnts->bsnh", d_picked, one_hot)` without the
        `S`-long sum over one-hot weights (a segment sum over `B T N` rows,
        accumulated in float32).
    """
    _check_scatter_shapes(d_picked, indices, value_shape, row_valid)
    dtype = d_picked.dtype
    d_picked = _keep_valid_rows(ops.cast(d_picked, "float32"), row_valid)
    batch, num_keys, num_heads, dim = value_shape
    rows = ops.reshape(_value_rows(indices, num_keys, num_heads), (-1,))
    # rows index B * S * N segments; batch may be a dynamic size on TF
    summed = ops.segment_sum(
        ops.reshape(d_picked, (-1, dim)),
        rows,
        num_segments=batch * num_keys * num_heads,
    )
    return ops.cast(ops.reshape(summed, value_shape), dtype)
