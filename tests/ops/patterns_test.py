import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.ops.patterns import guidance_pattern
from keras_attnvariants.testing.test_case import TestCase

# Two sequences: 4 real tokens, then 3 real tokens and one pad.
MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
IDS = np.array([[101, 7, 102, 9], [101, 5, 8, 0]], "int32")
Q = 1 / 4
R = 1 / 3


def pattern(name, **kwargs):
    return ops.convert_to_numpy(guidance_pattern(name, MASK, **kwargs))


class GuidancePatternTest(TestCase):
    def test_first(self):
        want = np.array(
            [
                [[1, 0, 0, 0]] * 4,
                [[1, 0, 0, 0]] * 3 + [[0, 0, 0, 0]],
            ],
            "float32",
        )
        self.assertAllClose(pattern("first"), want)

    def test_first_follows_left_padding(self):
        mask = np.array([[0, 1, 1]], bool)
        got = ops.convert_to_numpy(guidance_pattern("first", mask))
        want = np.array([[[0, 0, 0], [0, 1, 0], [0, 1, 0]]], "float32")
        self.assertAllClose(got, want)

    def test_next_uniform_edge(self):
        want = np.array(
            [
                [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [Q, Q, Q, Q]],
                [[0, 1, 0, 0], [0, 0, 1, 0], [R, R, R, 0], [0, 0, 0, 0]],
            ],
            "float32",
        )
        self.assertAllClose(pattern("next"), want)

    def test_next_zero_edge(self):
        want = np.array(
            [
                [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]],
                [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
            ],
            "float32",
        )
        self.assertAllClose(pattern("next", edge_rows="zero"), want)

    def test_prev_uniform_edge(self):
        want = np.array(
            [
                [[Q, Q, Q, Q], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]],
                [[R, R, R, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]],
            ],
            "float32",
        )
        self.assertAllClose(pattern("prev"), want)

    def test_prev_zero_edge(self):
        want = np.array(
            [
                [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]],
                [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]],
            ],
            "float32",
        )
        self.assertAllClose(pattern("prev", edge_rows="zero"), want)

    @parameterized.parameters([[101, 102]], [(101, 102)])
    def test_delimiter_list_of_ids(self, token_id):
        h = 0.5
        want = np.array(
            [
                [[h, 0, h, 0]] * 4,
                [[1, 0, 0, 0]] * 3 + [[0, 0, 0, 0]],
            ],
            "float32",
        )
        got = pattern("delimiter", token_ids=IDS, token_id=token_id)
        self.assertAllClose(got, want)

    def test_delimiter_int_id_and_no_match(self):
        # Sequence 2 holds no 102: uniform rows, or zero rows.
        uniform = np.array(
            [
                [[0, 0, 1, 0]] * 4,
                [[R, R, R, 0]] * 3 + [[0, 0, 0, 0]],
            ],
            "float32",
        )
        got = pattern("delimiter", token_ids=IDS, token_id=102)
        self.assertAllClose(got, uniform)
        zero = uniform.copy()
        zero[1] = 0.0
        got = pattern(
            "delimiter", token_ids=IDS, token_id=102, edge_rows="zero"
        )
        self.assertAllClose(got, zero)

    def test_period(self):
        ids = np.array([[4, 3, 4, 4], [3, 4, 0, 4]], "int32")
        want = np.array(
            [
                [[R, 0, R, R]] * 4,
                [[0, 1, 0, 0]] * 3 + [[0, 0, 0, 0]],
            ],
            "float32",
        )
        # The pad of sequence 2 holds id 4 but is never a target.
        got = pattern("period", token_ids=ids, token_id=4)
        self.assertAllClose(got, want)

    @parameterized.parameters("first", "next", "prev", "delimiter")
    def test_valid_rows_are_distributions(self, name):
        got = pattern(name, token_ids=IDS, token_id=[101, 102])
        rows = got.sum(-1)
        self.assertAllClose(rows, MASK.astype("float32"), atol=1e-6)
        self.assertAllClose(got * ~MASK[:, None, :], np.zeros_like(got))

    def test_invalid_arguments(self):
        with self.assertRaisesRegex(ValueError, "name"):
            guidance_pattern("last", MASK)
        with self.assertRaisesRegex(ValueError, "edge_rows"):
            guidance_pattern("next", MASK, edge_rows="same")
        with self.assertRaisesRegex(ValueError, "token_ids"):
            guidance_pattern("period", MASK, token_id=4)
        with self.assertRaisesRegex(ValueError, "token_id"):
            guidance_pattern("delimiter", MASK, token_ids=IDS)
        with self.assertRaisesRegex(ValueError, "token_id"):
            guidance_pattern("delimiter", MASK, token_ids=IDS, token_id=[])
