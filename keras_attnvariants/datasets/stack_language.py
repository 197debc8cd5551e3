"""The stack language of Kinley (2020, appendix), after Strobel et al.

Vocabulary `{0, 1, 2, 3, 4, (, )}`; parentheses match; nesting is at most
4; each number equals the current nesting depth (the number of open left
parentheses). The task is language modeling: the prediction made at
position `i` (of token `i + 1`) truly depends on the span from the last
number at or before `i` to `i` itself (from position 0 if no number has
appeared): that span determines the current depth, hence which tokens may
come next.
"""

import numpy as np

from keras_attnvariants.validation import check_int

# Token ids: digits are themselves; "(" = 5, ")" = 6. The digit 0 is id 0,
# which `TwoStreamEncoder` reads as padding: shift the tokens by 1 first.
OPEN = 5
CLOSE = 6
VOCAB_SIZE = 7
MAX_NESTING = 4


def _sequence(rng, length):
    tokens, depth = [], 0
    for position in range(length):
        remaining = length - position
        choices = [depth]  # the number matching the current depth
        if depth < MAX_NESTING and depth + 1 < remaining:
            choices.append(OPEN)
        if depth > 0:
            choices.append(CLOSE)
        if depth >= remaining:
            choices = [CLOSE]  # must close to end balanced
        token = choices[int(rng.integers(len(choices)))]
        depth += (token == OPEN) - (token == CLOSE)
        tokens.append(token)
    return tokens


def dependencies(tokens):
    """`(L, L)` booleans: `[i, j]` is True when prediction `i` needs `j`."""
    length = len(tokens)
    deps = np.zeros((length, length), bool)
    last_number = 0
    for i, token in enumerate(tokens):
        if token < OPEN:
            last_number = i
        deps[i, last_number : i + 1] = True
    return deps


def stack_language(num_examples, length=30, seed=None):
    """Balanced stack-language sequences with their true dependencies.

    Args:
        num_examples: int >= 1.
        length: int >= 2. Tokens per sequence (thesis: 30). Defaults to
            `30`.
        seed: int >= 0 or `None`. NumPy seed. Defaults to `None`.

    Returns:
        dict: `tokens` int32 `(num_examples, length)` (digits are their
        own ids, so the digit 0 is id 0: add 1 before a model that reads
        id 0 as padding, such as `TwoStreamEncoder`); `dependencies` bool
        `(num_examples, length, length)`, row `i` the true receptive field
        of the prediction at `i` (of token `i + 1`); `depth` int32
        `(num_examples, length)`, the nesting depth after each token.
    """
    num_examples = check_int("num_examples", num_examples)
    length = check_int("length", length, low=2)
    if seed is not None:
        seed = check_int("seed", seed, low=0)
    rng = np.random.default_rng(seed)
    tokens = np.array(
        [_sequence(rng, length) for _ in range(num_examples)], "int32"
    )
    opens = np.cumsum(tokens == OPEN, axis=1)
    closes = np.cumsum(tokens == CLOSE, axis=1)
    return {
        "tokens": tokens,
        "dependencies": np.stack([dependencies(row) for row in tokens]),
        "depth": (opens - closes).astype("int32"),
    }
