import numpy as np
import pytest

from keras_attnvariants.datasets.stack_language import stack_language

SYMBOLS = "01234()"


def check_sequence(tokens):
    """Independent grammar check with an explicit stack."""
    stack = []
    for token in (SYMBOLS[t] for t in tokens):
        if token == "(":
            stack.append(token)
            assert len(stack) <= 4
        elif token == ")":
            stack.pop()
        else:
            assert int(token) == len(stack)
    assert not stack


def true_span(tokens, i):
    """Brute force: the shortest suffix ending at i that fixes the depth."""
    for j in range(i, -1, -1):
        if SYMBOLS[tokens[j]].isdigit():
            return j
    return 0


def test_grammar_and_dependencies():
    data = stack_language(200, length=30, seed=0)
    assert data["tokens"].shape == (200, 30)
    for tokens, deps, depth in zip(
        data["tokens"], data["dependencies"], data["depth"]
    ):
        check_sequence(tokens)
        assert depth.max() <= 4 and depth[-1] == 0
        for i in range(30):
            want = np.zeros(30, bool)
            want[true_span(tokens, i) : i + 1] = True
            assert (deps[i] == want).all()
    # Every depth 0..4 is reached somewhere.
    assert set(np.unique(data["depth"])) == set(range(5))


def test_seeded():
    a = stack_language(5, seed=3)["tokens"]
    b = stack_language(5, seed=3)["tokens"]
    assert (a == b).all()
    # The seed is used: another one gives other sentences.
    assert (stack_language(5, seed=4)["tokens"] != a).any()


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="length"):
        stack_language(3, length=1)
    with pytest.raises(ValueError, match="num_examples"):
        stack_language(0)


def test_numpy_integer_arguments_accepted():
    data = stack_language(np.int64(2), length=np.int32(6), seed=0)
    assert data["tokens"].shape == (2, 6)
