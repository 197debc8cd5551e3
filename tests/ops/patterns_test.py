import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.ops.patterns import guidance_pattern
from keras_attnvariants.ops.patterns import normalize_token_id
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

    def test_numpy_int_token_ids_are_accepted(self):
        got = pattern("delimiter", token_ids=IDS, token_id=np.int64(102))
        want = pattern("delimiter", token_ids=IDS, token_id=102)
        self.assertAllClose(got, want)
        got = pattern("delimiter", token_ids=IDS, token_id=[np.int32(101), 102])
        want = pattern("delimiter", token_ids=IDS, token_id=[101, 102])
        self.assertAllClose(got, want)
        self.assertEqual(normalize_token_id(np.int64(3)), (3,))
        with self.assertRaisesRegex(ValueError, "period_id=4.0"):
            normalize_token_id(4.0, name="period_id")

    def test_padding_mask_must_be_batch_by_length(self):
        with self.assertRaisesRegex(ValueError, "padding_mask.*shape"):
            guidance_pattern("next", MASK[0])
        # None (nothing padded, as the losses take it) is named too, not
        # left to the backend's cast.
        with self.assertRaisesRegex(ValueError, "padding_mask=None"):
            guidance_pattern("next", None)

    @parameterized.parameters("first", "next", "prev", "delimiter")
    def test_matches_numpy_reference_on_random_masks(self, name):
        # Left, right and scattered padding; ids drawn from a small range.
        rng = np.random.default_rng(0)
        pos = np.arange(5)[None]
        lengths = np.array([[0], [1], [3], [5]])
        masks = [
            pos < lengths,
            pos >= 5 - lengths,
            rng.random((4, 5)) < 0.6,
        ]
        ids = rng.integers(0, 4, size=(4, 5))
        for mask in masks:
            for edge_rows in ("uniform", "zero"):
                got = guidance_pattern(
                    name, mask, ids, token_id=[1, 2], edge_rows=edge_rows
                )
                want = numpy_pattern(name, mask, ids, {1, 2}, edge_rows)
                self.assertAllClose(ops.convert_to_numpy(got), want)


def numpy_pattern(name, mask, ids, wanted, edge_rows):
    """Independent per-row construction of `guidance_pattern`."""
    batch, length = mask.shape
    out = np.zeros((batch, length, length), "float32")
    for b in range(batch):
        valid = mask[b]
        for p in np.flatnonzero(valid):
            row = np.zeros(length)
            if name == "first":
                row[np.argmax(valid)] = 1.0
            elif name in ("next", "prev"):
                q = p + (1 if name == "next" else -1)
                if 0 <= q < length and valid[q]:
                    row[q] = 1.0
            else:
                hit = valid & np.isin(ids[b], list(wanted))
                if hit.any():
                    row = hit / hit.sum()
            if not row.any() and edge_rows == "uniform":
                row = valid / valid.sum()
            out[b, p] = row
    return out


class TokenIdsBatchTest(TestCase):
    # A mutation sweep: a `(1, T)` padding mask with `(B, T)` ids was
    # refused when the batch-of-one rule read the ids' batch only.
    def test_a_padding_mask_of_one_row_broadcasts_over_batched_ids(self):
        ids = np.array([[7, 0, 0, 0], [0, 0, 7, 0]], "int32")
        got = ops.convert_to_numpy(
            guidance_pattern("delimiter", np.ones((1, 4), bool), ids, 7)
        )
        self.assertEqual(got.shape, (2, 4, 4))
        self.assertAllClose(got[0, 1], [1.0, 0.0, 0.0, 0.0])
        self.assertAllClose(got[1, 1], [0.0, 0.0, 1.0, 0.0])
