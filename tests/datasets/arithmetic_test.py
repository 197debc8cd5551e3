import numpy as np
import pytest

from keras_attnvariants.datasets.arithmetic import multiview_arithmetic
from keras_attnvariants.datasets.arithmetic import tokenize

STRIP = str.maketrans("", "", "() ")


def eval_prefix(tokens):
    """Independent evaluator: recursive descent over the prefix tokens."""
    token = tokens.pop(0)
    if token == "(":
        op = tokens.pop(0)
        a = eval_prefix(tokens)
        b = eval_prefix(tokens)
        assert tokens.pop(0) == ")"
        return a + b if op == "+" else a * b
    return int(token)


def prefix_tokens(text):
    return text.replace("(", "( ").replace(")", " )").split()


def nesting(text):
    depth = best = 0
    for c in text:
        depth += (c == "(") - (c == ")")
        best = max(best, depth)
    return best


def test_thesis_example_format():
    # The thesis's example: depth 2, value 1 (mod 5).
    text = "((4 + 1) * 3) + (2 + 4)"
    assert nesting(text) == 2
    assert eval(text) % 5 == 1  # noqa: S307 - trusted literal
    assert eval_prefix(prefix_tokens("(+ (* (+ 4 1) 3) (+ 2 4))")) % 5 == 1


def test_labels_depths_and_views_agree():
    data = multiview_arithmetic(300, max_depth=3, seed=0)
    assert set(data) == {"infix", "prefix", "label", "depth"}
    for infix, prefix, label, depth in zip(
        data["infix"], data["prefix"], data["label"], data["depth"]
    ):
        assert set(infix) <= set("01234+*() ")
        assert eval(infix) % 5 == label  # noqa: S307 - digits and + * ( )
        assert eval_prefix(prefix_tokens(prefix)) % 5 == label
        assert nesting(infix) == depth
        # The prefix view nests one level deeper (its outer parentheses).
        assert nesting(prefix) == depth + 1
        # Same digits and operators in both views.
        assert sorted(infix.translate(STRIP)) == sorted(prefix.translate(STRIP))


def test_depths_evenly_spread_and_seeded():
    data = multiview_arithmetic(301, max_depth=3, seed=1)
    counts = np.bincount(data["depth"], minlength=4)
    assert counts[0] == 0 and counts[1:].max() - counts[1:].min() <= 1
    again = multiview_arithmetic(301, max_depth=3, seed=1)
    assert (again["infix"] == data["infix"]).all()
    other = multiview_arithmetic(301, max_depth=3, seed=2)
    assert (other["infix"] != data["infix"]).mean() > 0.5
    # All five classes occur.
    assert set(data["label"].tolist()) == set(range(5))


def test_leftover_examples_reach_every_depth():
    # With fewer examples than depths (or any remainder), which depths get
    # one more is drawn at random: one example per call was always depth 1.
    seen = {
        int(multiview_arithmetic(1, max_depth=3, seed=seed)["depth"][0])
        for seed in range(30)
    }
    assert seen == {1, 2, 3}
    for seed in range(5):
        depths = multiview_arithmetic(4, max_depth=3, seed=seed)["depth"]
        counts = np.bincount(depths, minlength=4)[1:]
        assert counts.sum() == 4 and counts.max() - counts.min() <= 1
        # Without a remainder every depth gets the same count.
        depths = multiview_arithmetic(6, max_depth=3, seed=seed)["depth"]
        assert np.bincount(depths, minlength=4)[1:].tolist() == [2, 2, 2]


def test_tokenize_pads_with_zero():
    ids = tokenize(["1 + 2", "(+ 1 2)"])
    assert ids.shape == (2, 5)
    assert ids[0].tolist() == [2, 6, 3, 0, 0]


@pytest.mark.parametrize("kwargs", [{"num_examples": 0}, {"max_depth": 0}])
def test_invalid_arguments_raise(kwargs):
    args = {"num_examples": 3, **kwargs}
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        multiview_arithmetic(**args)


def test_numpy_integer_arguments_accepted():
    data = multiview_arithmetic(np.int64(4), max_depth=np.int32(2), seed=0)
    assert data["depth"].tolist().count(2) == 2


@pytest.mark.parametrize(
    "expressions, message",
    [
        ([], "at least one expression"),
        (["(1 + 7)"], r"\['7'\] in '\(1 \+ 7\)'"),
        # An empty expression was a row of padding only.
        (["1", ""], r"not hold empty.*Received: expressions\[1\]=''"),
        (["  "], r"not hold empty.*Received: expressions\[0\]='  '"),
    ],
)
def test_tokenize_rejects_empty_input_and_unknown_characters(
    expressions, message
):
    # Used to fail with a bare max() error and a KeyError.
    with pytest.raises(ValueError, match=message):
        tokenize(expressions)
