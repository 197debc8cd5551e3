import re

import keras
import numpy as np
import pytest
from absl.testing import parameterized
from keras import ops

from keras_attnvariants.layers.hybrid_attention import HybridAttention
from keras_attnvariants.layers.variant_attention import VariantAttention
from keras_attnvariants.losses.attention_guidance import (
    AttentionGuidanceRegularizer,
)
from keras_attnvariants.losses.attention_guidance import default_head_patterns
from keras_attnvariants.losses.attention_guidance import guidance_alpha
from keras_attnvariants.losses.attention_guidance import guidance_attention_bias
from keras_attnvariants.losses.attention_loss import token_ids_scope
from keras_attnvariants.ops.normalization import masked_softmax
from keras_attnvariants.testing.test_case import TestCase

LENGTHS = np.array([5, 3])
MASK = np.arange(5)[None] < LENGTHS[:, None]  # (2, 5)
IDS = np.array([[1, 7, 9, 7, 2], [1, 8, 2, 0, 0]], "int32")


class SoftmaxAttention(VariantAttention):
    """Plain softmax attention through the package's base class."""

    def normalize(self, scores, mask):
        return masked_softmax(scores, mask)


class AddPositions(keras.layers.Layer):
    """Adds a trainable position embedding `(T, dim)`."""

    def build(self, input_shape):
        self.positions = self.add_weight(
            shape=input_shape[1:], initializer="random_normal"
        )

    def call(self, x):
        return x + self.positions


def numpy_pattern(name, n, length, ids=None, token_id=None, edge="uniform"):
    """Target of one sequence, written from the paper's definitions."""
    p = np.zeros((length, length))
    for row in range(n):
        if name == "first":
            p[row, 0] = 1
        elif name == "next" and row + 1 < n:
            p[row, row + 1] = 1
        elif name == "prev" and row > 0:
            p[row, row - 1] = 1
        elif name in ("delimiter", "period"):
            hits = [q for q in range(n) if ids[q] in token_id]
            for q in hits:
                p[row, q] = 1 / len(hits)
        if p[row].sum() == 0 and edge == "uniform":
            p[row, :n] = 1 / n
    return p


def numpy_loss(weights, head_map, reduction, ids=None, token_id=None):
    w = np.asarray(weights, np.float64)
    per_example = np.zeros(len(w))
    mean_total = 0.0
    for name in set(head_map.values()):
        heads = [h for h, v in head_map.items() if v == name]
        squares, count = 0.0, 0
        for b, n in enumerate(LENGTHS):
            p = numpy_pattern(name, n, w.shape[-1], ids[b], token_id)
            for h in heads:
                d = (w[b, h, :n, :n] - p[:n, :n]) ** 2
                per_example[b] += d.sum()
                squares += d.sum()
                count += n * n
        mean_total += squares / count
    return per_example.mean() if reduction == "sum" else mean_total


def random_weights(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.random((2, 3, 5, 5)).astype("float32")
    return w / w.sum(-1, keepdims=True)


def guided_model(reg, layers=1, num_heads=2, length=5):
    """ids -> embeddings -> attention layers sharing `reg` -> (B, T, 8)."""
    ids = keras.Input((length,), dtype="int32")
    x = keras.layers.Embedding(12, 8)(ids)
    x = AddPositions()(x)
    for _ in range(layers):
        x = SoftmaxAttention(num_heads, 4, attention_losses=[reg])(x, x)
    return keras.Model(ids, x)


class AttentionGuidanceRegularizerTest(TestCase):
    @parameterized.product(
        reduction=("sum", "mean"),
        # In the second map two heads share a pattern: "mean" averages over
        # them (the paper's default map puts several heads on one pattern).
        head_map=(
            {0: "next", 1: "delimiter", 2: "first"},
            {0: "first", 1: "delimiter", 2: "first"},
        ),
    )
    def test_matches_numpy(self, reduction, head_map):
        reg = AttentionGuidanceRegularizer(
            head_map, alpha=3.0, reduction=reduction, delimiter_ids=[1, 2]
        )
        w = random_weights()
        got = reg(w, padding_mask=MASK, token_ids=IDS)
        want = 3.0 * numpy_loss(w, head_map, reduction, IDS, (1, 2))
        self.assertAllClose(got, want, rtol=1e-5)

    def test_exact_pattern_gives_zero_and_padding_is_ignored(self):
        reg = AttentionGuidanceRegularizer({0: "prev", 1: "first"}, alpha=1.0)
        w = np.zeros((2, 2, 5, 5), "float32")
        for b, n in enumerate(LENGTHS):
            w[b, 0, :, :] = numpy_pattern("prev", n, 5)
            w[b, 1, :, :] = numpy_pattern("first", n, 5)
        w[1, :, 3:, :] = 7.0  # padded queries
        w[1, :, :, 3:] = 7.0  # padded keys
        self.assertAllClose(reg(w, padding_mask=MASK), 0.0)
        self.assertGreater(float(reg(w)), 1.0)

    def test_alpha_schedule(self):
        steps = np.array([0, 9, 10, 20, 30, 45], "float32")
        got = ops.convert_to_numpy(
            guidance_alpha(steps, 8.0, decay_steps=20, warm_steps=10)
        )
        # start, end of warm period, decay start, midway, end, after.
        self.assertAllClose(got, [8.0, 8.0, 8.0, 4.0, 0.0, 0.0])
        self.assertAllClose(guidance_alpha(100, 2.0), 2.0)
        reg = AttentionGuidanceRegularizer(
            {0: "next"}, alpha=8.0, decay_steps=20, warm_steps=10
        )
        self.assertAllClose(reg.current_alpha(), 8.0)
        reg.step.assign(21)  # the 21st step has t = 20
        self.assertAllClose(reg.current_alpha(), 4.0)

    def test_direct_call_counts_training_calls_of_layer_zero(self):
        reg = AttentionGuidanceRegularizer({0: "next"}, alpha=1.0)
        w = random_weights()
        reg(w, training=True)
        reg(w, training=True, layer_index=1)
        reg(w)
        self.assertEqual(int(reg.step), 1)

    def test_schedule_in_jit_compiled_fit_of_mha(self):
        # Weights frozen (lr 0): the tracked term is alpha_t times a constant.
        reg = AttentionGuidanceRegularizer(
            {0: "next", 1: "prev"}, alpha=1.0, decay_steps=4, name="ag"
        )
        x = keras.Input((5, 8))
        mha = keras.layers.MultiHeadAttention(2, 4)
        out, weights = mha(x, x, return_attention_scores=True)
        term = reg(weights)
        model = keras.Model(x, {"out": out, "ag": term})
        model.compile(
            optimizer=keras.optimizers.SGD(0.0),
            loss={"out": "mse"},
            jit_compile=True,
        )
        data = np.random.default_rng(0).random((2, 5, 8)).astype("float32")
        history = model.fit(
            data, {"out": np.zeros_like(data)}, epochs=6, verbose=0
        )
        if keras.backend.backend() != "jax":
            values = np.array(history.history["ag"])
            self.assertAllClose(
                values / values[0], [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
            )
        losses = np.array(history.history["loss"])
        self.assertAllClose(
            (losses - losses[-1]) / (losses[0] - losses[-1]),
            [1.0, 0.75, 0.5, 0.25, 0.0, 0.0],
            atol=1e-5,
        )
        self.assertEqual(int(reg.step), 6)

    def test_shared_term_advances_once_per_step(self):
        reg = AttentionGuidanceRegularizer(
            {0: "next"}, alpha=1.0, decay_steps=2, name="ag"
        )
        model = guided_model(reg, layers=3)
        model.compile(optimizer=keras.optimizers.SGD(0.0), jit_compile=True)
        ids = np.tile(np.arange(5, dtype="int32"), (2, 1))
        history = model.fit(ids, epochs=3, batch_size=2, verbose=0)
        self.assertEqual(int(reg.step), 3)
        # Three layers, one instance: alpha 1, 0.5, 0 at steps 0, 1, 2.
        losses = np.array(history.history["loss"])
        self.assertAllClose(losses / losses[0], [1.0, 0.5, 0.0], atol=1e-5)

    def test_reused_attention_layer_advances_once_per_step(self):
        # ALBERT calls one attention layer per layer group several times:
        # the step counter advanced once per call (2 per step here), and
        # every call got the first per-layer map.
        reg = AttentionGuidanceRegularizer(
            [{0: "next"}, {}], alpha=1.0, decay_steps=2, name="ag"
        )
        ids = keras.Input((5,), dtype="int32")
        x = AddPositions()(keras.layers.Embedding(12, 8)(ids))
        attention = SoftmaxAttention(2, 4, attention_losses=[reg])
        x = attention(x, x)
        model = keras.Model(ids, attention(x, x))
        # Each application gets its own map: only the first is guided.
        model(IDS, training=True)
        first, second = [float(v) for v in model.losses]
        self.assertGreater(first, 0.0)
        self.assertEqual(second, 0.0)
        reg.step.assign(0.0)
        model.compile(optimizer=keras.optimizers.SGD(0.0), jit_compile=True)
        history = model.fit(IDS, epochs=3, batch_size=2, verbose=0)
        self.assertEqual(int(reg.step), 3)
        losses = np.array(history.history["loss"])
        self.assertAllClose(losses / losses[0], [1.0, 0.5, 0.0], atol=1e-5)

    def test_term_reused_in_a_new_model_keeps_its_schedule(self):
        # The layers of a second model got indices 1, 2, ... from the
        # first model's order: no index 0, so the schedule froze.
        reg = AttentionGuidanceRegularizer(
            {0: "next"}, alpha=1.0, decay_steps=4, name="ag"
        )
        for _ in range(2):
            model = guided_model(reg)
            model.compile(optimizer=keras.optimizers.SGD(0.0))
            history = model.fit(IDS, epochs=2, batch_size=2, verbose=0)
        self.assertEqual(int(reg.step), 4)
        losses = np.array(history.history["loss"])
        self.assertAllClose(losses[1] / losses[0], 0.25 / 0.5, atol=1e-5)

    def test_per_layer_head_maps(self):
        reg = AttentionGuidanceRegularizer(
            [{0: "next"}, {}, {1: "first"}], alpha=1.0
        )
        w = random_weights()
        self.assertAllClose(reg(w, layer_index=1), 0.0)
        want = numpy_loss(w, {1: "first"}, "sum", IDS)
        self.assertAllClose(
            reg(w, padding_mask=MASK, layer_index=2), want, rtol=1e-5
        )
        model = guided_model(reg, layers=4)
        with self.assertRaisesRegex(ValueError, "layer_index"):
            model(IDS, training=True)

    def test_gradients_reach_query_and_key_projections(self):
        reg = AttentionGuidanceRegularizer({0: "next", 1: "prev"}, alpha=1.0)
        model = guided_model(reg)
        attention = model.layers[-1]
        names = ("_query_dense", "_key_dense", "_value_dense", "_output_dense")
        before = {
            n: ops.convert_to_numpy(getattr(attention, n).kernel) for n in names
        }
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        model.fit(IDS, epochs=1, batch_size=2, verbose=0)
        moved = {
            n: not np.allclose(
                before[n], ops.convert_to_numpy(getattr(attention, n).kernel)
            )
            for n in names
        }
        # The loss depends on the weights only: values and output get none.
        self.assertEqual(
            moved,
            {
                "_query_dense": True,
                "_key_dense": True,
                "_value_dense": False,
                "_output_dense": False,
            },
        )

    @pytest.mark.slow
    def test_guided_heads_approach_their_patterns(self):
        keras.utils.set_random_seed(0)
        reg = AttentionGuidanceRegularizer({0: "next", 1: "prev"}, alpha=1.0)
        model = guided_model(reg, length=8)
        attention = model.layers[-1]
        data = np.random.default_rng(0).integers(0, 12, (64, 8))
        probe = keras.Model(model.input, attention.input[0])

        def distance():
            x = probe(data[:8])
            _, w = attention(x, x, return_attention_scores=True)
            return float(reg(w, padding_mask=None))

        start = distance()
        model.compile(optimizer=keras.optimizers.Adam(0.02))
        model.fit(data, epochs=25, batch_size=8, verbose=0)  # 200 steps
        end = distance()
        self.assertLess(end, start / 50, f"{start} -> {end}")

    def test_term_is_a_fit_metric_of_attached_layers(self):
        if keras.backend.backend() == "jax":
            self.skipTest("The JAX trainer drops metrics updated in layers.")
        reg = AttentionGuidanceRegularizer({0: "first"}, alpha=1.0, name="ag")
        model = guided_model(reg)
        model.compile(optimizer="adam")
        history = model.fit(IDS, epochs=2, verbose=0)
        self.assertIn("ag", history.history)
        self.assertGreater(history.history["ag"][0], 0.0)

    def test_token_ids_reach_attached_terms(self):
        reg = AttentionGuidanceRegularizer(
            {0: "period"}, alpha=1.0, period_id=7
        )
        layer = SoftmaxAttention(2, 4, attention_losses=[reg])
        x = np.random.default_rng(1).random((2, 5, 8)).astype("float32")
        mask = MASK[:, None, :] & MASK[:, :, None]
        _, w = layer(x, x, attention_mask=mask, return_attention_scores=True)
        with self.assertRaisesRegex(ValueError, "token_ids"):
            layer(x, x, attention_mask=mask, training=True)
        with token_ids_scope(IDS):
            layer(x, x, attention_mask=mask, training=True)
        w = ops.convert_to_numpy(w)
        want = numpy_loss(w, {0: "period"}, "sum", IDS, (7,))
        self.assertAllClose(layer.losses[-1], want, rtol=1e-5)

    def test_save_load_keeps_step_and_config(self):
        reg = AttentionGuidanceRegularizer(
            [{0: "next", 1: "delimiter"}], alpha=2.0, delimiter_ids=1
        )
        self.assert_config_covers_init_args(reg)
        layer = HybridAttention(2, 4, hybrid_init=0.0, attention_losses=[reg])
        x = keras.Input((5, 8))
        model = keras.Model(x, layer(x, x))
        reg.step.assign(7)
        data = np.random.default_rng(2).random((2, 5, 8)).astype("float32")
        reloaded = self.assert_keras_save_load_parity(model, data)
        term = reloaded.layers[-1].attention_losses[0]
        self.assertEqual(int(term.step), 7)
        self.assertEqual(term.head_patterns, [{0: "next", 1: "delimiter"}])
        self.assertEqual(term.delimiter_ids, [1])

    def test_mixed_precision_weights(self):
        reg = AttentionGuidanceRegularizer({0: "next"}, alpha=1.0)
        w = random_weights()
        want = reg(w, padding_mask=MASK)
        got = reg(ops.cast(w, "bfloat16"), padding_mask=MASK)
        self.assertEqual(keras.backend.standardize_dtype(got.dtype), "float32")
        self.assertAllClose(got, want, rtol=2e-2)

    def test_default_head_patterns(self):
        self.assertEqual(default_head_patterns(12), {
            0: "next", 1: "prev", 2: "first", 3: "first", 4: "first",
            5: "first",
        })  # fmt: skip
        self.assertEqual(default_head_patterns(2), {0: "next"})
        # Half up for odd counts (Python's round gave 2 for 5 heads, 4
        # for 7).
        self.assertEqual(len(default_head_patterns(5)), 3)
        self.assertEqual(len(default_head_patterns(7)), 4)
        self.assertEqual(len(default_head_patterns(1)), 1)
        self.assertEqual(
            default_head_patterns(3, fraction=1.0),
            {0: "next", 1: "prev", 2: "first"},
        )
        # At least one head is guided, and a fraction above 1 (more heads
        # than the attention has) is refused.
        self.assertEqual(default_head_patterns(4, fraction=0.1), {0: "next"})
        with self.assertRaisesRegex(ValueError, "`fraction`.*1.5"):
            default_head_patterns(4, fraction=1.5)

    def test_bias_form_checks_heads_and_keeps_edge_rows(self):
        # A mutation sweep: a head beyond `num_heads` gave an all-zero
        # bias without the check, and `edge_rows` was not passed on.
        with self.assertRaisesRegex(ValueError, "guides head 3.*2 heads"):
            guidance_attention_bias({3: "next"}, 2, np.ones((1, 4), bool))
        mask = np.ones((1, 3), bool)
        zero = ops.convert_to_numpy(
            guidance_attention_bias({0: "next"}, 1, mask, edge_rows="zero")
        )
        uniform = ops.convert_to_numpy(
            guidance_attention_bias({0: "next"}, 1, mask)
        )
        self.assertAllClose(zero[0, 0, -1], np.zeros(3))
        self.assertAllClose(uniform[0, 0, -1], np.full(3, 1 / 3))
        self.assertAllClose(zero[0, 0, :2], uniform[0, 0, :2])

    def test_bias_form_pulls_heads_to_patterns(self):
        bias = guidance_attention_bias(
            {1: "next"}, num_heads=2, padding_mask=MASK, strength=4.0
        )
        bias = ops.convert_to_numpy(bias)
        self.assertEqual(bias.shape, (2, 2, 5, 5))
        self.assertAllClose(bias[:, 0], np.zeros((2, 5, 5)))
        self.assertAllClose(bias[0, 1, 0], [0.0, 4.0, 0.0, 0.0, 0.0])
        # Added to equal logits, the target gets e^4 / (e^4 + n - 1).
        weights = ops.convert_to_numpy(
            masked_softmax(bias, MASK[:, None, None, :])
        )
        self.assertAllClose(weights[1, 1, 0, 1], np.e**4 / (np.e**4 + 2))

    @parameterized.named_parameters(
        ("map_type", {"head_patterns": "next"}, "head_patterns"),
        ("empty_map", {"head_patterns": {}}, "head_patterns"),
        ("head", {"head_patterns": {-1: "next"}}, "head_patterns"),
        ("pattern", {"head_patterns": {0: "last"}}, "head_patterns"),
        ("alpha", {"alpha": -1.0}, "alpha"),
        ("decay", {"decay_steps": 0}, "decay_steps"),
        ("warm", {"warm_steps": -5}, "warm_steps"),
        ("reduction", {"reduction": "max"}, "reduction"),
        ("edge", {"edge_rows": "one"}, "edge_rows"),
        ("delim", {"head_patterns": {0: "delimiter"}}, "delimiter_ids"),
        ("period", {"head_patterns": {0: "period"}}, "period_id"),
        # Bad ids name their argument (the error said `token_id`).
        (
            "delim_value",
            {"head_patterns": {0: "delimiter"}, "delimiter_ids": "x"},
            "`delimiter_ids`",
        ),
        (
            "period_value",
            {"head_patterns": {0: "period"}, "period_id": [True]},
            "`period_id`",
        ),
        # A negative id matches no token: the head was guided to nothing.
        (
            "delim_negative",
            {"head_patterns": {0: "delimiter"}, "delimiter_ids": -1},
            r"`delimiter_ids` must be an int >= 0.*Received: delimiter_ids=-1",
        ),
        (
            "period_negative",
            {"head_patterns": {0: "period"}, "period_id": [3, -2]},
            r"`period_id` must be an int >= 0",
        ),
        # NaN passed every `<` check; floats were truncated silently; inf
        # steps raised OverflowError.
        ("alpha_nan", {"alpha": float("nan")}, "`alpha`"),
        ("alpha_inf", {"alpha": float("inf")}, "`alpha`"),
        ("decay_float", {"decay_steps": 2.5}, "`decay_steps`"),
        ("decay_nan", {"decay_steps": float("nan")}, "`decay_steps`"),
        ("warm_inf", {"warm_steps": float("inf")}, "`warm_steps`"),
        # `bool("false")` turned the tracker on without a word.
        ("track_metric", {"track_metric": "false"}, "`track_metric` must be"),
    )
    def test_invalid_arguments(self, kwargs, message):
        args = {"head_patterns": {0: "next"}, "alpha": 1.0, **kwargs}
        with self.assertRaisesRegex(ValueError, message):
            AttentionGuidanceRegularizer(**args)

    def test_numpy_id_arrays_are_accepted(self):
        reg = AttentionGuidanceRegularizer(
            {0: "delimiter"}, alpha=1.0, delimiter_ids=np.array([1, 2])
        )
        self.assertEqual(reg.delimiter_ids, [1, 2])

    def test_numpy_scalars_are_accepted(self):
        reg = AttentionGuidanceRegularizer(
            {np.int64(1): "next"},
            alpha=np.float32(2.0),
            decay_steps=np.int64(3),
            warm_steps=np.int32(1),
        )
        self.assertEqual(reg.head_patterns, {1: "next"})
        self.assertEqual(
            (reg.alpha, reg.decay_steps, reg.warm_steps), (2.0, 3, 1)
        )
        self.assertEqual(type(reg.get_config()["alpha"]), float)
        self.assertEqual(
            default_head_patterns(np.int64(4), np.float32(0.5)),
            {0: "next", 1: "prev"},
        )

    def test_invalid_weights(self):
        reg = AttentionGuidanceRegularizer({3: "next"}, alpha=1.0)
        with self.assertRaisesRegex(ValueError, "4 heads|3 heads"):
            reg(random_weights())
        with self.assertRaisesRegex(ValueError, "attention_weights"):
            reg(np.zeros((2, 4, 5, 6), "float32"))

    @parameterized.named_parameters(
        # A (B, 1) mask broadcast silently to a wrong value; other lengths
        # failed with each backend's own broadcasting error.
        ("mask_length_1", "padding_mask", np.ones((2, 1), bool)),
        ("mask_length", "padding_mask", np.ones((2, 4), bool)),
        ("mask_batch", "padding_mask", np.ones((3, 5), bool)),
        ("ids_length", "token_ids", np.ones((2, 4), "int32")),
    )
    def test_mask_and_ids_must_match_the_weights(self, name, value):
        reg = AttentionGuidanceRegularizer(
            {0: "next", 1: "period"}, alpha=1.0, period_id=7
        )
        kwargs = {"padding_mask": MASK, "token_ids": IDS, name: value}
        message = f"`{name}`.*{re.escape(str(value.shape))}"
        with self.assertRaisesRegex(ValueError, message):
            reg(random_weights(), **kwargs)
        # A batch of one broadcasts.
        kwargs[name] = value[:1, :1].repeat(5, axis=1)
        reg(random_weights(), **kwargs)
        with self.assertRaisesRegex(ValueError, "num_heads"):
            default_head_patterns(0)
        with self.assertRaisesRegex(ValueError, "fraction"):
            default_head_patterns(4, fraction=True)
        with self.assertRaisesRegex(ValueError, "num_heads=2.0"):
            guidance_attention_bias({0: "next"}, 2.0, MASK)
