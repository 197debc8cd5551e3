import numpy as np
import pytest

from keras_attnvariants.datasets.arithmetic import tokenize


@pytest.mark.parametrize("expressions", ["1 + 2", np.str_("(+ 1 2)")])
def test_tokenize_rejects_a_single_string(expressions):
    # A bare string was iterated character by character: "1 + 2" gave five
    # one-token "expressions" (two of them empty) instead of an error.
    with pytest.raises(
        ValueError, match=r"`expressions` must be .*Received: expressions="
    ):
        tokenize(expressions)


def test_tokenize_still_takes_a_numpy_array_of_strings():
    ids = tokenize(np.array(["1 + 2", "(* 3 4)"]))
    assert ids.tolist() == [[2, 6, 3, 0, 0], [8, 7, 4, 5, 9]]
