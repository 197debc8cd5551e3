import numpy as np
from keras import ops

from keras_attnvariants.ops import receptive_field as rf
from keras_attnvariants.testing.test_case import TestCase


def np_fields(attentions, valid):
    """Reference: the appendix recursion with explicit loops, float64."""
    z0 = np.asarray(attentions[0])
    batch, length = z0.shape[0], z0.shape[-1]
    out = np.zeros((batch, length, length))
    for b in range(batch):
        s = np.diag(valid[b].astype(float))
        for z in attentions:
            z = np.asarray(z, np.float64)[b]
            z = z.sum(0) if z.ndim == 3 else z
            new = s.copy()
            for i in range(length):
                for j in range(length):
                    if not (valid[b, i] and valid[b, j]):
                        continue
                    total = sum(z[i, k] * s[k, j] for k in range(length))
                    new[i, j] = min(s[i, j] + total, 1.0)
            s = new
        out[b] = s
    return out


class ReceptiveFieldTest(TestCase):
    def test_soft_fields_match_recursion(self):
        rng = np.random.default_rng(0)
        z = [rng.dirichlet(np.ones(5), size=(2, 3, 5)) * 0.3 for _ in range(3)]
        valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
        got = rf.receptive_fields(z, valid)
        self.assertAllClose(got, np_fields(z, valid), atol=1e-5)

    def test_hard_fields_follow_argmax_chains(self):
        # Position i attends to i - 1 in every layer: after L layers the
        # field of i is {i - L, ..., i}.
        length, layers = 6, 2
        shift = np.eye(length, k=-1)
        shift[0, 0] = 1.0
        z = [shift[None]] * layers
        fields = ops.convert_to_numpy(rf.hard_receptive_fields(z))[0]
        want = np.zeros((length, length), bool)
        for i in range(length):
            want[i, max(0, i - layers) : i + 1] = True
        self.assertAllEqual(fields, want)

    def test_sizes_and_why_the_printed_reduction_is_degenerate(self):
        shift = np.eye(4, k=-1)[None]
        fields = rf.receptive_fields([shift])
        s = ops.convert_to_numpy(fields)[0]
        # The printed sum_i min(sum_j s_ij, 1) is always T: s_ii = 1.
        self.assertEqual(np.minimum(s.sum(-1), 1).sum(), 4)
        # Union of the fields: every token is used once -> 4; with no
        # attention at all it is also 4. The mean size is 1 + 3/4.
        self.assertAllClose(rf.receptive_field_union_size(fields), [4.0])
        self.assertAllClose(rf.receptive_field_mean_size(fields), [1.75])
        # Union size counts only tokens somebody depends on.
        valid = np.array([[1, 1, 0, 0]], bool)
        fields = rf.receptive_fields([shift], valid)
        self.assertAllClose(rf.receptive_field_union_size(fields), [2.0])
        self.assertAllClose(rf.receptive_field_mean_size(fields, valid), [1.5])

    def test_sizes_reject_fields_not_batch_by_square(self):
        # One example's (T, T) fields were read as T examples of T
        # positions; a (L, B, T, T) stack failed in the backend.
        fields = ops.convert_to_numpy(rf.receptive_fields([np.eye(3)[None]]))
        for size in (
            rf.receptive_field_union_size,
            rf.receptive_field_mean_size,
        ):
            for bad in (fields[0], fields[None], fields[:, :2]):
                with self.assertRaisesRegex(ValueError, "`fields` must be"):
                    size(bad)
            self.assertAllClose(
                size(fields),
                [3.0 if size is rf.receptive_field_union_size else 1.0],
            )

    def test_precision_recall(self):
        pred = np.array([[[1, 1, 0], [0, 1, 1], [0, 0, 1]]], bool)
        true = np.array([[[1, 0, 0], [0, 1, 1], [1, 0, 1]]], bool)
        precision, recall = rf.precision_recall(pred, true)
        self.assertAllClose(precision, 4 / 5)
        self.assertAllClose(recall, 4 / 5)
        row = np.array([True, True, False])[None, :, None]
        precision, recall = rf.precision_recall(pred, true, row)
        self.assertAllClose(precision, 3 / 4)
        self.assertAllClose(recall, 3 / 3)

    def test_hard_fields_match_set_reachability(self):
        # Independent reference: r(i, l) = r(i, l-1) | U_heads r(z_i, l-1)
        # with Python sets, two heads, padding and a causal pattern.
        rng = np.random.default_rng(3)
        batch, heads, length, layers = 2, 2, 7, 3
        valid = np.arange(length)[None] < np.array([[7], [4]])
        picks = [
            rng.integers(0, np.arange(length) + 1, (batch, heads, length))
            for _ in range(layers)
        ]
        z = [np.eye(length)[p] for p in picks]  # (B, N, T, T) causal
        for b in range(batch):
            for zl in z:
                zl[b, :, ~valid[b]] = 0
                zl[b, :, :, ~valid[b]] = 0
        fields = ops.convert_to_numpy(rf.hard_receptive_fields(z, valid))
        for b in range(batch):
            n = valid[b].sum()
            r = [{i} for i in range(n)]
            for p in picks:
                r = [
                    r[i].union(*(r[p[b, h, i]] for h in range(heads)))
                    for i in range(n)
                ]
            want = np.zeros((length, length), bool)
            for i in range(n):
                want[i, sorted(r[i])] = True
            self.assertAllEqual(fields[b], want)
        sizes = rf.receptive_field_mean_size(ops.cast(fields, "float32"), valid)
        self.assertAllClose(
            sizes, [fields[b].sum() / valid[b].sum() for b in range(batch)]
        )
        # The union is every valid token, whatever the attention.
        self.assertAllClose(
            rf.receptive_field_union_size(ops.cast(fields, "float32")),
            valid.sum(1),
        )


class FieldContractsTest(TestCase):
    # Contracts a mutation sweep found untested: fields from
    # `receptive_fields` (diagonal 1, zero padded rows) hid them.
    def test_union_size_counts_columns_reached_by_any_row(self):
        fields = np.array([[[1.0, 1.0], [0.0, 0.0]]], "float32")
        self.assertAllClose(rf.receptive_field_union_size(fields), [2.0])

    def test_mean_size_leaves_out_padded_rows(self):
        fields = np.ones((2, 3, 3), "float32")
        mask = np.array([[1, 1, 0], [0, 0, 0]], bool)
        got = ops.convert_to_numpy(rf.receptive_field_mean_size(fields, mask))
        # A fully padded example has size 0, not NaN.
        self.assertAllClose(got, [3.0, 0.0])

    def test_hard_fields_keep_only_entries_above_one_half(self):
        near_one_hot = np.array([[[0.9, 0.1], [0.0, 1.0]]], "float32")
        got = ops.convert_to_numpy(rf.hard_receptive_fields([near_one_hot]))
        self.assertAllEqual(got, [[[True, False], [False, True]]])

    def test_precision_and_recall_are_zero_where_undefined(self):
        predicted = np.eye(2, dtype=bool)[None]
        precision, recall = rf.precision_recall(
            predicted, np.zeros((1, 2, 2), bool)
        )
        self.assertAllClose([precision, recall], [0.0, 0.0])
        precision, recall = rf.precision_recall(
            np.zeros((1, 2, 2), bool), predicted
        )
        self.assertAllClose([precision, recall], [0.0, 0.0])

    def test_a_single_token_takes_a_rank_2_mask(self):
        ones = np.ones((1, 1, 1), bool)
        got = rf.precision_recall(ones, ones, mask=np.ones((1, 1), bool))
        self.assertAllClose(got, [1.0, 1.0])
