"""Multiview arithmetic: one expression in infix and prefix order.

Kinley (2020), section 5.2, adapted from Kim et al. (2017): digits 0-4,
operators `+` and `*`, the value taken modulo 5 (5 classes). The same
expression is written in infix, `((4 + 1) * 3) + (2 + 4)`, and in prefix,
`(+ (* (+ 4 1) 3) (+ 2 4))`.

Depth follows the thesis, which calls that example "depth 2 nesting": the
depth is the deepest parenthesis nesting of the infix view, i.e. the
height of the operator tree minus one. Depth 1 is e.g. `(4 + 1) * 3`.
"""

from collections.abc import Iterable

import numpy as np

from keras_attnvariants.validation import check_int

DIGITS = 5
OPERATORS = ("+", "*")


def _tree(rng, height):
    """A random tree whose operator height is exactly `height`."""
    if height == 0:
        return int(rng.integers(DIGITS))
    op = OPERATORS[int(rng.integers(2))]
    tall = _tree(rng, height - 1)
    other = _tree(rng, int(rng.integers(height)))
    return (op, tall, other) if rng.random() < 0.5 else (op, other, tall)


def _infix(node, top=True):
    if isinstance(node, int):
        return str(node)
    op, left, right = node
    text = f"{_infix(left, False)} {op} {_infix(right, False)}"
    return text if top else f"({text})"


def _prefix(node):
    if isinstance(node, int):
        return str(node)
    op, left, right = node
    return f"({op} {_prefix(left)} {_prefix(right)})"


def _value(node):
    if isinstance(node, int):
        return node
    op, left, right = node
    a, b = _value(left), _value(right)
    return (a + b) % DIGITS if op == "+" else (a * b) % DIGITS


def multiview_arithmetic(num_examples, max_depth=3, seed=None):
    """Random expressions in two views with their value modulo 5.

    Args:
        num_examples: int >= 1. Number of expressions.
        max_depth: int >= 1. Depths run over `1..max_depth`, evenly spread
            (counts differ by at most one, shuffled; the depths that get
            one more are drawn at random). Defaults to `3`.
        seed: int >= 0 or `None`. NumPy seed. Defaults to `None`.

    Returns:
        dict of NumPy arrays of length `num_examples`: `infix` and
        `prefix` (str), `label` (int64 in `0..4`), `depth` (int64).

    Example:

    >>> data = multiview_arithmetic(4, seed=0)
    >>> sorted(data)
    ['depth', 'infix', 'label', 'prefix']
    """
    num_examples = check_int("num_examples", num_examples)
    max_depth = check_int("max_depth", max_depth)
    if seed is not None:
        seed = check_int("seed", seed, low=0)
    rng = np.random.default_rng(seed)
    depths = np.arange(num_examples - num_examples % max_depth) % max_depth
    if num_examples % max_depth:
        # The leftover examples go to depths drawn at random: with
        # `arange(n) % max_depth` they always went to the lowest ones, so
        # fewer examples than depths never reached the deepest.
        extra = rng.choice(max_depth, num_examples % max_depth, replace=False)
        depths = np.concatenate([depths, extra])
    depths = depths + 1
    rng.shuffle(depths)
    trees = [_tree(rng, int(depth) + 1) for depth in depths]
    return {
        "infix": np.array([_infix(t) for t in trees]),
        "prefix": np.array([_prefix(t) for t in trees]),
        "label": np.array([_value(t) for t in trees], dtype="int64"),
        "depth": depths.astype("int64"),
    }


def _expression_text(index, text):
    """Element `index` of `tokenize`'s `expressions` as a str."""
    if isinstance(text, bytes):
        # `str(b"1+2")` is "b'1+2'": the quote and `b` were then reported
        # as characters outside the vocabulary.
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            pass
    elif isinstance(text, str):
        return str(text)
    raise ValueError(
        "`expressions` must hold expression strings (or UTF-8 bytes). "
        f"Received: expressions[{index}]={text!r}"
    )


def tokenize(expressions):
    """Character-level token ids (spaces dropped), right-padded with 0.

    Vocabulary: 0 = padding, 1..5 = digits 0..4, 6 `+`, 7 `*`, 8 `(`,
    9 `)`. Returns an int32 array `(num_expressions, max_length)`.

    `expressions` is an iterable (list, tuple, NumPy array, ...) of
    strings; UTF-8 `bytes` (what a `tf.data` pipeline yields) are decoded.

    Raises:
        ValueError: for a single string instead of a list of them, no
            expressions, an empty (or all-space) one, an element that is
            not a string (a number is not turned into one) or a character
            outside the vocabulary.
    """
    if isinstance(expressions, (str, bytes)) or not isinstance(
        expressions, Iterable
    ):
        # A str is iterable: each character would become an expression.
        raise ValueError(
            "`expressions` must be a list of expression strings (e.g. "
            f"`[text]`). Received: expressions={expressions!r}"
        )
    vocab = {str(d): d + 1 for d in range(DIGITS)}
    vocab.update({"+": 6, "*": 7, "(": 8, ")": 9})
    expressions = [
        _expression_text(i, text) for i, text in enumerate(expressions)
    ]
    if not expressions:
        raise ValueError(
            "`expressions` must hold at least one expression. Received: "
            "expressions=[]"
        )
    for index, text in enumerate(expressions):
        if not text.strip(" "):
            # It would be a row of padding only: no token for a model to
            # attend to.
            raise ValueError(
                "`expressions` must not hold empty expressions. Received: "
                f"expressions[{index}]={text!r}"
            )
        unknown = sorted(set(text) - set(vocab) - {" "})
        if unknown:
            raise ValueError(
                f"`expressions` may hold only digits 0-{DIGITS - 1}, `+`, "
                f"`*`, parentheses and spaces. Received {unknown} in "
                f"{text!r}"
            )
    ids = [[vocab[c] for c in text if c != " "] for text in expressions]
    out = np.zeros((len(ids), max(len(row) for row in ids)), "int32")
    for i, row in enumerate(ids):
        out[i, : len(row)] = row
    return out
