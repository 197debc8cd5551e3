"""Argument checks of `keras_attnvariants.ops` (review of input validation).

Each case used to be accepted silently (a broadcast, a truncation, a NaN)
or to fail with a backend error; it now raises a `ValueError` naming the
argument, or (empty inputs, tensor temperatures, NumPy seeds) works.
"""

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops

from keras_attnvariants import ops as kops
from keras_attnvariants.ops import gumbel
from keras_attnvariants.ops import noise
from keras_attnvariants.testing.test_case import TestCase

RNG = np.random.default_rng(0)
SCORES = RNG.normal(size=(2, 2, 3, 4)).astype("float32")
COST = RNG.random((2, 3, 4)).astype("float32")
PADDING = np.array([[1, 1, 0], [1, 1, 1]], bool)


def _numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


class ReceptiveFieldsTest(TestCase):
    z = np.full((2, 2, 3, 3), 1.0 / 3.0, "float32")

    @parameterized.named_parameters(
        # A tensor was iterated over its batch.
        ("tensor", lambda z: z),
        ("none", lambda z: None),
        # Layers of batch 2 and 1 were broadcast together.
        ("batches", lambda z: [z, z[:1]]),
        ("lengths", lambda z: [z, np.full((2, 2, 4, 4), 0.25, "float32")]),
    )
    def test_rejects(self, make):
        with self.assertRaisesRegex(ValueError, "`attentions`.*Received"):
            kops.receptive_fields(make(self.z))


class HybridMixTest(TestCase):
    @parameterized.named_parameters(
        ("above_one", 1.5),
        ("negative", -0.5),
        ("nan", float("nan")),
        ("bool", True),
        ("numpy_scalar", np.float32(2.0)),
        ("numpy_array", np.array([0.5, 1.5], "float32").reshape(2, 1, 1)),
        ("string", "0.5"),
        ("none", None),
    )
    def test_rejects_values(self, mix):
        with self.assertRaisesRegex(ValueError, "`mix`.*Received: mix="):
            kops.hybrid_normalize(SCORES, mix)

    def test_rejects_tensor_shape(self):
        mix = ops.full((3, 1, 1), 0.5)
        with self.assertRaisesRegex(ValueError, "`mix`.*shape \\(3, 1, 1\\)"):
            kops.hybrid_normalize(SCORES, mix)
        # Valid mixes still work.
        for mix in (0.0, 1, np.float32(0.5), np.full((2, 1, 1), 0.5)):
            self.assertEqual(
                tuple(kops.hybrid_normalize(SCORES, mix).shape), SCORES.shape
            )


class CausalMaskTest(TestCase):
    @parameterized.named_parameters(
        ("float", (2.5, 3), "query_length"),
        ("bool", (True, 3), "query_length"),
        ("negative", (-1, 3), "query_length"),
        ("string", (3, "3"), "key_length"),
        ("none", (3, None), "key_length"),
    )
    def test_rejects(self, lengths, name):
        with self.assertRaisesRegex(ValueError, f"`{name}`.*Received: {name}"):
            kops.causal_mask(*lengths)
        # Empty and NumPy lengths still work.
        self.assertEqual(tuple(kops.causal_mask(0, 3).shape), (0, 3))
        self.assertAllEqual(
            kops.causal_mask(np.int64(2), 2), [[True, False], [True, True]]
        )


class GumbelTest(TestCase):
    def test_tensor_temperature_is_floored(self):
        # A zero temperature tensor gave NaN weights.
        u = RNG.random(SCORES.shape).astype("float32")
        g = kops.gumbel_from_uniform(u)
        mask = np.array([True, True, True, False])
        got = _numpy(
            kops.relaxed_sample(SCORES, g, ops.convert_to_tensor(0.0), mask)
        )
        self.assertTrue(np.all(np.isfinite(got)))
        want = kops.relaxed_sample(SCORES, g, gumbel.MIN_TEMPERATURE, mask)
        self.assertAllClose(got, want)
        # The floor of GumbelDiscreteAttention's temperature variable.
        from keras_attnvariants.layers import gumbel_discrete_attention as gda

        self.assertEqual(gumbel.MIN_TEMPERATURE, gda.MIN_TEMPERATURE)

    def test_tiny_python_temperature_is_floored(self):
        # 1e-38 overflowed `(s + g) / temperature` to inf (NaN weights);
        # below 1e-20 the mask fill rose above the valid keys (all zeros).
        scores = np.array([[1.0, 2.0, 3.0], [-1e8, -1e8, 0.0]], "float32")
        mask = np.array([[True, True, True], [True, True, False]])
        want = _numpy(
            kops.relaxed_sample(scores, 0.0, gumbel.MIN_TEMPERATURE, mask)
        )
        self.assertAllClose(want, [[0, 0, 1], [0.5, 0.5, 0]])
        for tiny in (1e-38, 1e-25, np.float32(1e-30)):
            got = _numpy(kops.relaxed_sample(scores, 0.0, tiny, mask))
            self.assertAllClose(got, want)

    def test_numpy_seed(self):
        # keras.random rejected NumPy ints.
        self.assertAllClose(
            kops.gumbel_noise((2, 3), seed=np.int64(1)),
            kops.gumbel_noise((2, 3), seed=1),
        )
        with self.assertRaisesRegex(ValueError, "Received: seed=-1"):
            kops.gumbel_noise((2, 3), seed=-1)

    @parameterized.named_parameters(
        ("key_float", 1.5, (2, 3), "key"),
        ("key_bool", True, (2, 3), "key"),
        ("key_none", None, (2, 3), "key"),
        ("key_float_tensor", np.array(1.5, "float32"), (2, 3), "key"),
        ("shape_int", 1, 3, "shape"),
        ("shape_negative", 1, (-1, 3), "shape"),
        ("shape_float", 1, (2.5, 3), "shape"),
    )
    def test_positional_uniform_rejects(self, key, shape, name):
        with self.assertRaisesRegex(ValueError, f"`{name}`.*Received: {name}"):
            kops.positional_uniform(key, shape)
        if name == "shape":
            with self.assertRaisesRegex(ValueError, "`shape`"):
                kops.gumbel_noise(shape)


class GuidancePatternTest(TestCase):
    @parameterized.named_parameters(
        # (T,) ids were broadcast over the batch, float ids truncated.
        ("rank_one", np.array([1, 2, 1])),
        ("batch", np.ones((3, 3), "int32")),
        ("length", np.ones((2, 4), "int32")),
        ("float", np.array([[1.7, 2.0, 1.0], [1.0, 1.0, 1.0]])),
    )
    def test_rejects_token_ids(self, token_ids):
        with self.assertRaisesRegex(ValueError, "`token_ids`.*Received"):
            kops.guidance_pattern(
                "delimiter", PADDING, token_ids=token_ids, token_id=1
            )
        # A batch of one still broadcasts (the guidance losses' contract).
        pattern = kops.guidance_pattern(
            "delimiter", PADDING, token_ids=np.array([[1, 2, 1]]), token_id=1
        )
        self.assertEqual(tuple(pattern.shape), (2, 3, 3))

    def test_token_id_message_names_loss_arguments(self):
        ids = np.ones((2, 3), "int32")
        for name, loss_name in (
            ("delimiter", "delimiter_ids"),
            ("period", "period_id"),
        ):
            with self.assertRaisesRegex(
                ValueError, f"`token_id`.*`{loss_name}`.*Received: token_id"
            ):
                kops.guidance_pattern(name, PADDING, ids, token_id=1.5)


class EmptyTransportTest(TestCase):
    @parameterized.named_parameters(
        ("batch", (0, 3, 4)),
        ("rows", (2, 0, 4)),
        ("columns", (2, 3, 0)),
    )
    def test_empty_cost(self, shape):
        cost = np.zeros(shape, "float32")
        plan = kops.sinkhorn_plan(cost)
        self.assertEqual(tuple(plan.shape), shape)
        for value in (
            kops.sinkhorn_cost(cost),
            kops.conditional_transport_cost(cost, cost),
        ):
            self.assertEqual(tuple(value.shape), shape[:1])
            self.assertAllClose(value, np.zeros(shape[:1]))
        forward, backward = kops.conditional_transport_plans(cost)
        self.assertEqual(tuple(forward.shape), shape)
        self.assertEqual(tuple(backward.shape), shape)

    @parameterized.named_parameters(("ot", "ot"), ("ct", "ct"))
    def test_kq_alignment_empty_batch(self, method):
        from keras_attnvariants.losses import KQAlignment

        x = np.zeros((0, 3, 2, 4), "float32")
        value = _numpy(KQAlignment(method=method)(x, x))
        self.assertEqual(float(value), 0.0)


class GatherScatterTest(TestCase):
    value = RNG.random((2, 4, 2, 3)).astype("float32")
    indices = np.zeros((2, 2, 3), "int32")

    @parameterized.named_parameters(
        ("batch_one", np.zeros((1, 2, 3), "int32")),
        ("heads_one", np.zeros((2, 1, 3), "int32")),
        ("float", np.full((2, 2, 3), 1.7, "float32")),
        ("rank_two", np.zeros((2, 3), "int32")),
    )
    def test_rejects_indices(self, indices):
        with self.assertRaisesRegex(ValueError, "`indices`.*Received"):
            kops.gather_values(self.value, indices)
        picked = np.ones((2, 3, 2, 3), "float32")
        with self.assertRaisesRegex(ValueError, "`indices`.*Received"):
            kops.scatter_values(picked, indices, (2, 4, 2, 3))

    def test_rejects_row_valid_and_value_shape(self):
        with self.assertRaisesRegex(ValueError, "`row_valid`.*Received"):
            kops.gather_values(
                self.value, self.indices, np.ones((2, 2, 4), bool)
            )
        picked = np.ones((2, 3, 2, 3), "float32")
        with self.assertRaisesRegex(ValueError, "`value_shape`.*Received"):
            kops.scatter_values(picked, self.indices, (2, 4, 2, 5))
        with self.assertRaisesRegex(ValueError, "`value_shape`.*Received"):
            kops.scatter_values(picked, self.indices, (2, 4, 6))


class ShapeChecksTest(TestCase):
    bad_mask = np.ones((2, 1, 3, 5), bool)

    @parameterized.named_parameters(
        ("masked_softmax", kops.masked_softmax),
        ("doubly_normalize", kops.doubly_normalize),
        ("doubly_normalized_bias", kops.doubly_normalized_bias),
        ("one_hot_argmax", kops.one_hot_argmax),
        ("straight_through", kops.straight_through),
        ("relaxed_sample", lambda s, m: kops.relaxed_sample(s, 0.0, 1.0, m)),
    )
    def test_rejects_mask(self, fn):
        with self.assertRaisesRegex(ValueError, "`mask`.*Received: mask"):
            fn(SCORES, self.bad_mask)

    def test_relaxed_sample_rejects_noise(self):
        bad = np.zeros((2, 2, 3, 5), "float32")
        with self.assertRaisesRegex(ValueError, "`noise`.*Received: noise"):
            kops.relaxed_sample(SCORES, bad)

    def test_normalizations_take_lists(self):
        for fn in (kops.masked_softmax, kops.doubly_normalize):
            self.assertAllClose(fn(SCORES.tolist()), fn(SCORES), atol=1e-6)

    @parameterized.named_parameters(
        ("plan_rows", kops.sinkhorn_plan, "row_mask", (2, 4)),
        ("plan_columns", kops.sinkhorn_plan, "col_mask", (2, 3)),
        ("cost_columns", kops.sinkhorn_cost, "col_mask", (2, 3)),
        ("ct_rows", kops.conditional_transport_plans, "row_mask", (2, 4)),
    )
    def test_transport_rejects_masks(self, fn, name, shape):
        with self.assertRaisesRegex(ValueError, f"`{name}`.*Received: {name}"):
            fn(COST, **{name: np.ones(shape, bool)})

    def test_conditional_transport_rejects_logits(self):
        with self.assertRaisesRegex(ValueError, "`logits`.*Received: logits"):
            kops.conditional_transport_cost(COST, COST[:, :, :3])

    def test_costs_reject_feature_sizes(self):
        x = np.ones((2, 3, 5), "float32")
        y = np.ones((2, 4, 4), "float32")
        for fn in (
            kops.squared_euclidean_cost,
            kops.cosine_cost,
            kops.gaussian_mmd,
        ):
            with self.assertRaisesRegex(ValueError, "`y`.*Received: y"):
                fn(x, y)

    def test_gaussian_mmd_rejects_mask_shapes(self):
        x = np.ones((2, 3, 5), "float32")
        with self.assertRaisesRegex(ValueError, "`x_mask`.*Received: x_mask"):
            kops.gaussian_mmd(x, x, x_mask=np.ones((2, 4), bool))

    def test_merge_masks_rejects_shapes(self):
        with self.assertRaisesRegex(ValueError, "`masks`.*Received: masks"):
            kops.merge_masks(np.ones((2, 3), bool), np.ones((2, 4), bool))

    def test_precision_recall_rejects_a_square_padding_mask(self):
        # B == T: a (B, T) mask broadcast over the wrong axes (0.45 / 0.5
        # instead of 0.25 / 0.25 in the review's example).
        p = np.ones((3, 3, 3), bool)
        with self.assertRaisesRegex(ValueError, "`mask` must be rank 3"):
            kops.precision_recall(p, p, np.ones((3, 3), bool))

    def test_precision_recall_rejects_a_padding_mask_of_one_example(self):
        # B == 1: a (1, T) padding mask broadcasts as (1, 1, T), a column
        # mask: 0.857 precision instead of 1.0 in the review's example.
        valid = np.array([[1, 1, 1, 0]], bool)
        pred = np.zeros((1, 4, 4), bool)
        pred[0, :3, :3] = np.tril(np.ones((3, 3), bool))
        target = pred.copy()
        target[0, 3, 3] = True
        pred[0, 3, 0] = True
        with self.assertRaisesRegex(
            ValueError, r"`mask` must be rank 3.*Received: mask.*\(1, 4\)"
        ):
            kops.precision_recall(pred, target, valid)
        rows = kops.precision_recall(pred, target, valid[:, :, None])
        self.assertAllClose([float(v) for v in rows], [1.0, 1.0])
        # A (T, T) mask of pairs is no padding mask: still taken at B == 1.
        tril = np.tril(np.ones((4, 4), bool))
        self.assertAllClose(
            [float(v) for v in kops.precision_recall(pred, target, tril)],
            [float(v) for v in kops.precision_recall(pred, target, tril[None])],
        )

    def test_precision_recall_rejects_mask(self):
        p = np.ones((2, 3, 3), bool)
        with self.assertRaisesRegex(ValueError, "`mask`.*Received: mask"):
            kops.precision_recall(p, p, np.ones((2, 3), bool))

    @parameterized.named_parameters(("int", 3), ("none", None))
    def test_dropout_rejects_seed_generator(self, generator):
        with self.assertRaisesRegex(
            ValueError, "`seed_generator`.*Received: seed_generator"
        ):
            kops.positional_dropout(SCORES, 0.5, generator)
        with self.assertRaisesRegex(ValueError, "`seed_generator`"):
            noise.dropout_multipliers((2, 3), 0.5, generator)
        # Unused at rate 0; a generator still works.
        self.assertAllClose(kops.positional_dropout(SCORES, 0.0, None), SCORES)
        generator = keras.random.SeedGenerator(0)
        out = kops.positional_dropout(SCORES, 0.5, generator)
        self.assertEqual(tuple(out.shape), SCORES.shape)
