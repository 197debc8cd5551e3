import os

import keras
import numpy as np
from absl.testing import parameterized
from keras import ops
from scipy.special import logsumexp

from keras_attnvariants.layers.hybrid_attention import HybridAttention
from keras_attnvariants.losses.kq_alignment import KQAlignment
from keras_attnvariants.losses.kq_alignment import kq_projections
from keras_attnvariants.ops.transport import gaussian_mmd
from keras_attnvariants.testing.gradients import torch_leaf
from keras_attnvariants.testing.test_case import TestCase

METHODS = ("gan", "ot", "ct", "mmd")


def projected(seed=0, shift=0.0):
    """Queries (2, 6, 3, 4), keys (2, 7, 3, 4) and padding masks."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(2, 6, 3, 4)).astype("float32")
    k = (rng.normal(size=(2, 7, 3, 4)) + shift).astype("float32")
    q_mask = np.arange(6)[None] < np.array([6, 4])[:, None]
    k_mask = np.arange(7)[None] < np.array([7, 3])[:, None]
    return q, k, q_mask, k_mask


def numpy_mmd(x, y):
    def k(a, b):
        return np.exp(-((a[:, None] - b[None]) ** 2).sum(-1) / 2).mean()

    return k(x, x) + k(y, y) - 2 * k(x, y)


def numpy_weights(term, prefix, head=None):
    """`{layer: (kernel, bias)}` of the term's `prefix_*` layers (the head's
    slice when one per head)."""
    out = {}
    for w in term.weights:
        layer, kind = w.path.split("/")[-2:]
        if not layer.startswith(prefix):
            continue
        value = ops.convert_to_numpy(w).astype("float64")
        if head is not None:
            value = value[head]
        out.setdefault(layer[len(prefix) + 1 :], {})[kind] = value
    return {name: (d["kernel"], d["bias"]) for name, d in out.items()}


def numpy_highway_mlp(weights, x):
    def dense(name, v):
        kernel, bias = weights[name]
        return v @ kernel + bias

    def leaky(v):
        return np.where(v > 0, v, 0.2 * v)

    tau = 1.0 / (1.0 + np.exp(-dense("gate", x)))
    x = tau * np.maximum(dense("transform", x), 0.0) + (1.0 - tau) * x
    return dense("dense_2", leaky(dense("dense_1", x)))


def numpy_log_sigmoid(v):
    return -np.logaddexp(0.0, -v)


def numpy_kq(term, q, k, q_mask, k_mask):
    """The term's value from its weights, per example and head (or token
    position with `match_over='heads'`), in float64 NumPy."""
    values = []
    over_heads = term.match_over == "heads"
    groups = q.shape[1] if over_heads else q.shape[2]
    for b in range(q.shape[0]):
        for g in range(groups):
            if over_heads:
                if not (q_mask[b, g] and k_mask[b, g]):
                    continue
                x, y = q[b, g], k[b, g]
            else:
                if not (q_mask[b].any() and k_mask[b].any()):
                    continue
                x, y = q[b, q_mask[b], g], k[b, k_mask[b], g]
            x, y = x.astype("float64"), y.astype("float64")
            head = g if term.adversary_per_head else None
            if term.method == "gan":
                w = numpy_weights(term, "discriminator", head)
                l_x = numpy_highway_mlp(w, x)[:, 0]
                l_y = numpy_highway_mlp(w, y)[:, 0]
                real = numpy_log_sigmoid(l_x).mean()
                fake = numpy_log_sigmoid(-l_y).mean()
                value = real + fake
                if term.gan_loss == "non_saturating":
                    swapped = (
                        numpy_log_sigmoid(-l_x).mean()
                        + numpy_log_sigmoid(l_y).mean()
                    )
                    value = -value - swapped
            else:  # ct
                critic = numpy_weights(term, "critic", head)
                nav = numpy_weights(term, "navigator", head)

                def navigate(v):
                    hidden = v @ nav["dense_1"][0] + nav["dense_1"][1]
                    hidden = np.where(hidden > 0, hidden, 0.2 * hidden)
                    return hidden @ nav["dense_2"][0] + nav["dense_2"][1]

                logits = navigate(x) @ navigate(y).T
                c_x, c_y = (
                    numpy_highway_mlp(critic, x),
                    numpy_highway_mlp(critic, y),
                )
                c_x /= np.linalg.norm(c_x, axis=-1, keepdims=True)
                c_y /= np.linalg.norm(c_y, axis=-1, keepdims=True)
                cost = 1.0 - c_x @ c_y.T
                forward = np.exp(logits - logits.max(1, keepdims=True))
                forward /= forward.sum(1, keepdims=True)
                backward = np.exp(logits - logits.max(0, keepdims=True))
                backward /= backward.sum(0, keepdims=True)
                value = (
                    term.rho * (forward * cost).sum(1).mean()
                    + (1.0 - term.rho) * (backward * cost).sum(0).mean()
                )
            values.append((b, value))
    if term.head_reduction == "sum":
        # The paper: the sum over heads, per example.
        examples = {b for b, _ in values}
        return term.weight * sum(v for _, v in values) / len(examples)
    return term.weight * np.mean([v for _, v in values])


def randomize_weights(term, seed):
    """Random kernels and biases (biases start at zero: a wrong bias layout
    would go unnoticed)."""
    rng = np.random.default_rng(seed)
    for w in term.weights:
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.5)


def value_and_grads(fn, tensors, variables):
    """`fn(*tensors)` and its gradients (NumPy) with respect to `tensors`
    then `variables`, on the current backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(t) for t in tensors]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            value = fn(*tensors)
        grads = tape.gradient(value, tensors + list(variables))
    elif backend == "jax":
        import jax

        def stateless(tensors, values):
            mapping = list(zip(variables, values))
            with keras.StatelessScope(state_mapping=mapping):
                return fn(*tensors)

        value, (g_t, g_v) = jax.value_and_grad(stateless, (0, 1))(
            list(tensors), [v.value for v in variables]
        )
        grads = list(g_t) + list(g_v)
    else:
        tensors = [torch_leaf(t) for t in tensors]
        for v in variables:
            v.value.grad = None
        value = fn(*tensors)
        value.backward()
        grads = [t.grad for t in tensors] + [v.value.grad for v in variables]
    return float(ops.convert_to_numpy(value)), [
        ops.convert_to_numpy(g) for g in grads
    ]


def term_grads(term, q, k, q_mask, k_mask):
    """Gradients of the term's value w.r.t. `q`, `k` and its weights."""
    term(q, k, q_mask, k_mask)  # builds the weights
    weights = term.trainable_variables
    _, grads = value_and_grads(
        lambda q, k: term(q, k, q_mask, k_mask), [q, k], weights
    )
    return grads[:2], weights, grads[2:]


class KQAlignmentTest(TestCase):
    def test_config_covers_init_args_and_round_trips(self):
        term = KQAlignment(
            method="ot", weight=0.5, epsilon=0.05, iterations=7, name="kq"
        )
        self.assert_config_covers_init_args(term)
        clone = KQAlignment.from_config(term.get_config())
        self.assertEqual(clone.get_config(), term.get_config())

    def test_mmd_matches_numpy_per_example_and_head(self):
        q, k, q_mask, k_mask = projected(1, shift=0.5)
        got = KQAlignment(method="mmd", weight=2.0)(q, k, q_mask, k_mask)
        want = np.mean(
            [
                numpy_mmd(q[b, q_mask[b], n], k[b, k_mask[b], n])
                for b in range(2)
                for n in range(3)
            ]
        )
        self.assertAllClose(got, 2.0 * want, atol=1e-6)

    def test_mmd_bandwidth_matches_numpy(self):
        q, k, q_mask, k_mask = projected(5, shift=0.5)
        term = KQAlignment(method="mmd", weight=1.0, bandwidth=2.5)
        got = term(q, k, q_mask, k_mask)
        want = np.mean(
            [
                ops.convert_to_numpy(
                    gaussian_mmd(
                        q[b, q_mask[b], n], k[b, k_mask[b], n], bandwidth=2.5
                    )
                )
                for b in range(2)
                for n in range(3)
            ]
        )
        self.assertAllClose(got, want, atol=1e-6)
        # Independent of the package: the Gaussian kernel of width 2.5.
        x, y = q[1, q_mask[1], 2], k[1, k_mask[1], 2]

        def kernel(a, b):
            d = ((a[:, None] - b[None]) ** 2).sum(-1)
            return np.exp(-d / (2 * 2.5**2)).mean()

        self.assertAllClose(
            gaussian_mmd(x, y, bandwidth=2.5),
            kernel(x, x) + kernel(y, y) - 2 * kernel(x, y),
            atol=1e-6,
        )

    def test_ot_matches_numpy_sinkhorn_per_example_and_head(self):
        # Eq. 3 with the term's `epsilon` and `iterations`: log-domain
        # Sinkhorn on the normalized squared distances of the real tokens.
        q, k, q_mask, k_mask = projected(6, shift=0.4)
        term = KQAlignment(method="ot", weight=0.5, epsilon=0.2, iterations=3)
        got = term(q, k, q_mask, k_mask)
        values = []
        for b in range(2):
            for n in range(3):
                x = q[b, q_mask[b], n].astype("float64")
                y = k[b, k_mask[b], n].astype("float64")
                cost = ((x[:, None] - y[None]) ** 2).sum(-1)
                kernel = -cost / cost.max() / 0.2
                u, v = np.zeros(len(x)), np.zeros(len(y))
                for _ in range(3):
                    u = -np.log(len(x)) - logsumexp(kernel + v[None], 1)
                    v = -np.log(len(y)) - logsumexp(kernel + u[:, None], 0)
                plan = np.exp(kernel + u[:, None] + v[None])
                values.append((plan * cost).sum())
        self.assertAllClose(got, 0.5 * np.mean(values), rtol=1e-5, atol=0)

    @parameterized.parameters("ot", "mmd")
    def test_value_does_not_move_with_an_offset_shared_by_both_clouds(
        self, method
    ):
        # Squared distances were expanded as |q|^2 + |k|^2 - 2 q.k: at an
        # offset of 100 (spread 0.05) OT and MMD were 0.06-0.23 against
        # 0.26 / 0.20 at the origin.
        q, k, q_mask, k_mask = projected(7, shift=0.3)
        q, k = 0.05 * q, 0.05 * k
        term = KQAlignment(method=method, weight=1.0, bandwidth=0.3)
        near = term(q, k, q_mask, k_mask)
        far = term(q + 100.0, k + 100.0, q_mask, k_mask)
        self.assertGreater(float(near), 1e-3)
        self.assertAllClose(far, near, rtol=1e-3, atol=0)

    @parameterized.named_parameters(
        ("gan", "gan", {}),
        ("gan_per_head", "gan", {"adversary_per_head": True}),
        ("gan_over_heads", "gan", {"match_over": "heads"}),
        ("gan_non_saturating", "gan", {"gan_loss": "non_saturating"}),
        (
            "gan_non_saturating_per_head",
            "gan",
            {"gan_loss": "non_saturating", "adversary_per_head": True},
        ),
        ("ct", "ct", {}),
        ("ct_per_head", "ct", {"adversary_per_head": True, "rho": 0.3}),
        ("ct_over_heads", "ct", {"match_over": "heads"}),
        ("ct_hidden_dim", "ct", {"hidden_dim": 5}),
        ("gan_head_sum", "gan", {"head_reduction": "sum"}),
        (
            "ct_per_head_sum",
            "ct",
            {"head_reduction": "sum", "adversary_per_head": True},
        ),
    )
    def test_adversarial_methods_match_numpy(self, method, kwargs):
        # The value from the term's own (random) weights, recomputed per
        # example and head in NumPy: checks the point layouts, the heads'
        # kernels, the fused gate/transform/navigator matmul and masks.
        q, k, q_mask, k_mask = projected(11, shift=0.3)
        if kwargs.get("match_over") == "heads":
            k = np.random.default_rng(12).normal(size=q.shape)
            k = k.astype("float32")
            k_mask = q_mask
        term = KQAlignment(method=method, weight=0.5, **kwargs)
        term(q, k, q_mask, k_mask)
        randomize_weights(term, 13)
        got = float(term(q, k, q_mask, k_mask))
        want = numpy_kq(term, q, k, q_mask, k_mask)
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)

    @parameterized.parameters("ot", "mmd")
    def test_near_zero_for_identical_and_grows_with_separation(self, method):
        q, _, _, _ = projected(2)
        term = KQAlignment(method=method, weight=1.0, bandwidth=4.0)
        values = [float(term(q, q + shift)) for shift in (0.0, 0.5, 2.0)]
        # Identical clouds: MMD is 0; entropic OT keeps a small bias.
        self.assertLess(values[0], 0.01 * values[1])
        self.assertTrue(np.all(np.diff(values) > 0), values)

    @parameterized.parameters(*METHODS)
    def test_padded_tokens_have_no_influence(self, method):
        q, k, q_mask, k_mask = projected(3)
        term = KQAlignment(method=method, weight=1.0, bandwidth=4.0)
        base = term(q, k, q_mask, k_mask)
        q2 = np.where(q_mask[:, :, None, None], q, 50.0).astype("float32")
        k2 = np.where(k_mask[:, :, None, None], k, -50.0).astype("float32")
        self.assertAllClose(term(q2, k2, q_mask, k_mask), base, atol=1e-6)
        # Same as dropping the padding of the second example.
        one = term(q[1:, :4], k[1:, :3])
        full = term(q[:1], k[:1])
        self.assertAllClose(base, (one + full) / 2, atol=1e-5)

    @parameterized.named_parameters(
        *[(m, m, "tokens") for m in METHODS], ("ct_over_heads", "ct", "heads")
    )
    def test_non_finite_padding_has_no_influence(self, method, match_over):
        # Whatever padded tokens hold (inf, nan, or values whose squares
        # overflow float32), the value and every gradient are those of the
        # real tokens: padding never reaches the clouds or the adversary.
        q, k, q_mask, k_mask = projected(3)
        if match_over == "heads":
            k, k_mask = k[:, :6], q_mask
        term = KQAlignment(
            method=method, weight=1.0, bandwidth=4.0, match_over=match_over
        )
        (g_q, g_k), _, grads = term_grads(term, q, k, q_mask, k_mask)
        base = float(term(q, k, q_mask, k_mask))
        for fill in (np.inf, np.nan, 1e30):
            q2 = np.where(q_mask[:, :, None, None], q, fill)
            k2 = np.where(k_mask[:, :, None, None], k, -fill)
            (g_q2, g_k2), _, grads2 = term_grads(
                term, q2.astype("float32"), k2.astype("float32"), q_mask, k_mask
            )
            value = float(term(q2.astype("float32"), k2, q_mask, k_mask))
            self.assertAllClose(value, base, atol=1e-6, msg=f"{fill}")
            self.assertAllClose(g_q2, g_q, atol=1e-6, msg=f"{fill}")
            self.assertAllClose(g_k2, g_k, atol=1e-6, msg=f"{fill}")
            for got, want in zip(grads2, grads):
                self.assertAllClose(got, want, atol=1e-6, msg=f"{fill}")

    @parameterized.parameters(*METHODS)
    def test_finite_under_mixed_precision_with_padding(self, method):
        q, k, q_mask, k_mask = projected(4)
        q_mask[1] = False  # an example with no valid query
        for policy in ("mixed_float16", "mixed_bfloat16"):
            term = KQAlignment(method=method, weight=1.0, dtype=policy)
            half_q = ops.cast(q * 30, term.compute_dtype)
            half_k = ops.cast(k * 30, term.compute_dtype)
            value = term(half_q, half_k, q_mask, k_mask)
            self.assertEqual(
                keras.backend.standardize_dtype(value.dtype), "float32"
            )
            value = float(ops.convert_to_numpy(value))
            self.assertTrue(np.isfinite(value), policy)
            # The float32 term with the same weights on the same (rounded)
            # inputs gives the same value: the term computes in float32.
            ref = KQAlignment(method=method, weight=1.0)
            args = (
                ops.cast(half_q, "float32"),
                ops.cast(half_k, "float32"),
                q_mask,
                k_mask,
            )
            ref(*args)
            ref.set_weights(term.get_weights())
            want = float(ops.convert_to_numpy(ref(*args)))
            self.assertAllClose(value, want, rtol=1e-4, atol=1e-5, msg=policy)

    @parameterized.named_parameters(
        ("gan", "gan", {}),
        ("ct", "ct", {}),
        ("gan_per_head", "gan", {"adversary_per_head": True}),
        ("ct_over_heads", "ct", {"match_over": "heads"}),
    )
    def test_adversary_and_projections_get_opposing_gradients(
        self, method, kwargs
    ):
        q, k, q_mask, k_mask = projected(5, shift=1.0)
        if kwargs.get("match_over") == "heads":
            k, k_mask = k[:, :6], q_mask
        term = KQAlignment(method=method, weight=1.0, **kwargs)
        (g_q, g_k), weights, grads = term_grads(term, q, k, q_mask, k_mask)
        base = float(term(q, k, q_mask, k_mask))
        lr = 1e-2
        adversary = [
            i for i, w in enumerate(weights) if "navigator" not in w.path
        ]
        # One SGD step on the minimized loss: the adversary's objective
        # (the paper's L, which it maximizes) goes up ...
        old = [np.array(ops.convert_to_numpy(w)) for w in weights]
        for i in adversary:
            weights[i].assign(old[i] - lr * grads[i])
        self.assertGreater(float(term(q, k, q_mask, k_mask)), base)
        for w, value in zip(weights, old):
            w.assign(value)
        # ... while the same step on the projections brings it down.
        q_new = q - lr * g_q
        k_new = k - lr * g_k
        self.assertLess(float(term(q_new, k_new, q_mask, k_mask)), base)
        if method == "ct":
            # The navigator minimizes the transport cost too.
            for i, w in enumerate(weights):
                if "navigator" in w.path:
                    w.assign(old[i] - lr * grads[i])
            self.assertLess(float(term(q, k, q_mask, k_mask)), base)

    @parameterized.parameters("mmd", "ot")
    def test_over_heads_a_key_mask_alone_drops_padded_positions(self, method):
        # What a layer with keys-only masks (keras-hub's, without
        # `self_attention_padding`) gives the term: every test passed the
        # same mask for queries and keys, so ignoring the key mask (padded
        # positions counted as groups) went unseen.
        rng = np.random.default_rng(0)
        q = rng.normal(size=(2, 5, 3, 4)).astype("float32")
        k = rng.normal(size=(2, 5, 3, 4)).astype("float32") + 1.0
        key_mask = np.arange(5)[None] < np.array([5, 3])[:, None]
        term = KQAlignment(method, 1.0, match_over="heads")
        got = float(term.compute_loss_value(q, k, None, key_mask))
        per_position = [
            float(
                term.compute_loss_value(
                    q[b : b + 1, t : t + 1], k[b : b + 1, t : t + 1]
                )
            )
            for b in range(2)
            for t in range(5)
            if key_mask[b, t]
        ]
        self.assertAllClose(got, np.mean(per_position), rtol=1e-4, atol=1e-6)

    @parameterized.parameters("gan", "ct")
    def test_reversal_beta_scales_the_adversarys_gradients(self, method):
        # The value does not depend on `reversal_beta`: a term that ignored
        # it (full-strength reversed gradients) passed every value test.
        q, k, q_mask, k_mask = projected(5, shift=1.0)
        results = {}
        for beta in (1.0, 0.5):
            term = KQAlignment(method=method, weight=1.0, reversal_beta=beta)
            term(q, k, q_mask, k_mask)
            randomize_weights(term, 3)
            results[beta] = term_grads(term, q, k, q_mask, k_mask)
        (g_q, g_k), weights, full = results[1.0]
        (h_q, h_k), _, half = results[0.5]
        self.assertAllClose(h_q, g_q, atol=1e-6)
        self.assertAllClose(h_k, g_k, atol=1e-6)
        for weight, a, b in zip(weights, full, half):
            # The navigator (CT) minimizes; its gradient is not reversed.
            scale = 1.0 if "navigator" in weight.path else 0.5
            self.assertGreater(np.abs(a).max(), 1e-4)
            self.assertAllClose(b, scale * a, atol=1e-6, msg=weight.path)

    def test_non_saturating_gan_splits_the_two_players_losses(self):
        q, k, q_mask, k_mask = projected(5, shift=1.0)
        term = KQAlignment(method="gan", weight=1.0, gan_loss="non_saturating")
        (g_q, g_k), weights, grads = term_grads(term, q, k, q_mask, k_mask)

        def likelihood(q, k, sign):
            # Mean over (example, head) of E_q log s(sign l_q)
            # + E_k log s(-sign l_k); every group is present here.
            qc, kc, qp, kp, _ = term._clouds(q, k, q_mask, k_mask)
            logits = term._discriminate(qc, kc)
            return ops.mean(term._log_likelihood(*logits, qp, kp, sign))

        # The discriminator's gradient is its own loss's, -L(q, k) ...
        _, want = value_and_grads(lambda: -likelihood(q, k, 1.0), [], weights)
        for got, expected in zip(grads, want):
            self.assertAllClose(got, expected, atol=1e-6)
        # ... and the projections' gradient is the swapped-label loss's.
        g_loss, (want_q, want_k) = value_and_grads(
            lambda q, k: -likelihood(q, k, -1.0), [q, k], []
        )
        self.assertAllClose(g_q, want_q, atol=1e-6)
        self.assertAllClose(g_k, want_k, atol=1e-6)
        self.assertGreater(float(np.max(np.abs(g_q))), 0.0)
        # The projections' loss is bounded below by 0; the minimax is not.
        self.assertGreater(g_loss, 0.0)

    def test_adversary_per_head_has_one_kernel_per_head(self):
        q, k, _, _ = projected(6)
        term = KQAlignment(method="gan", adversary_per_head=True)
        term(q, k)
        kernel = [w for w in term.weights if "gate/kernel" in w.path][0]
        self.assertEqual(tuple(kernel.shape), (3, 4, 4))

    @parameterized.parameters(
        ("gan", True, (None, None, None, 4), "number of heads N"),
        ("ct", True, (None, None, None, 4), "number of heads N"),
        ("gan", False, (None, None, 3, None), "head size H"),
    )
    def test_adversary_sizes_must_be_known_at_build(
        self, method, per_head, shape, unknown
    ):
        # A per-head adversary first built on symbolic queries of unknown
        # head count was one shared adversary, silently.
        term = KQAlignment(method=method, adversary_per_head=per_head)
        with self.assertRaisesRegex(
            ValueError, f"adversary_per_head={per_head}.*{unknown}"
        ):
            term(keras.Input(shape[1:]), keras.Input(shape[1:]))
        # Without an adversary any head count and size can be symbolic.
        for free in ("mmd", "ot"):
            KQAlignment(method=free)(
                keras.Input((None, None, None)), keras.Input((None, None, None))
            )
        # A shared adversary takes an unknown head count.
        KQAlignment(method=method)(
            keras.Input((None, None, 4)), keras.Input((None, None, 4))
        )

    def test_match_over_heads_pairs_token_positions(self):
        q, _, q_mask, _ = projected(7)
        k = np.random.default_rng(8).normal(size=q.shape).astype("float32")
        got = KQAlignment(method="mmd", weight=1.0, match_over="heads")(
            q, k, q_mask, q_mask
        )
        want = np.mean(
            [
                numpy_mmd(q[b, t], k[b, t])
                for b in range(2)
                for t in range(6)
                if q_mask[b, t]
            ]
        )
        self.assertAllClose(got, want, atol=1e-6)

    @parameterized.named_parameters(
        ("method", {"method": "wgan"}, "method"),
        ("weight_negative", {"weight": -0.1}, "weight"),
        ("weight_string", {"weight": "0.01"}, "weight"),
        ("rho", {"rho": 1.5}, "rho"),
        ("epsilon", {"epsilon": 0}, "epsilon"),
        (
            "epsilon_tiny",
            {"method": "ot", "epsilon": 1e-10},
            r"`epsilon` must be .*>= 1e-06",
        ),
        ("match_over", {"match_over": "layers"}, "match_over"),
        ("gan_loss", {"method": "gan", "gan_loss": "wgan"}, "gan_loss"),
        (
            "gan_loss_not_gan",
            {"method": "ct", "gan_loss": "non_saturating"},
            "gan_loss",
        ),
        (
            "per_head_over_heads",
            {"adversary_per_head": True, "match_over": "heads"},
            "adversary_per_head",
        ),
        # `bool("false")` made a string flag True without a word.
        (
            "per_head_string",
            {"adversary_per_head": "false"},
            r"`adversary_per_head` must be a bool\. Received: "
            "adversary_per_head='false'",
        ),
        (
            "per_head_string_over_heads",
            {"adversary_per_head": "false", "match_over": "heads"},
            r"`adversary_per_head` must be a bool\.",
        ),
        ("per_head_int", {"adversary_per_head": 1}, "must be a bool"),
        (
            "track_metric_string",
            {"track_metric": "false"},
            r"`track_metric` must be a bool\. Received: track_metric='false'",
        ),
    )
    def test_invalid_arguments(self, kwargs, name):
        with self.assertRaisesRegex(ValueError, name):
            KQAlignment(**kwargs)

    def test_epsilon_floor_only_where_it_is_read(self):
        # Other methods never read `epsilon`: a small one stays accepted,
        # and a model saved with it before the floor still loads.
        self.assertEqual(KQAlignment("mmd", epsilon=1e-8).epsilon, 1e-8)
        config = KQAlignment("ot").get_config()
        config["epsilon"] = 1e-8  # an OT term saved before the floor
        with self.assertWarnsRegex(UserWarning, "epsilon=1e-06"):
            term = KQAlignment.from_config(config)
        self.assertEqual(term.epsilon, 1e-6)
        config["epsilon"] = 5e-7  # just below the floor too
        with self.assertWarnsRegex(UserWarning, "epsilon=1e-06"):
            term = KQAlignment.from_config(config)
        self.assertEqual(term.epsilon, 1e-6)

    @parameterized.parameters("mmd", "ot", "ct")
    def test_head_sum_is_the_heads_times_the_mean(self, method):
        # The paper sums over heads; examples without a valid token stay
        # out of both averages (the second example is all padding here).
        q, k, q_mask, k_mask = projected(4, shift=0.5)
        q_mask[1] = False
        mean = KQAlignment(method=method, weight=0.5)
        total = KQAlignment(method=method, weight=0.5, head_reduction="sum")
        mean(q, k, q_mask, k_mask)
        total(q, k, q_mask, k_mask)
        total.set_weights(mean.get_weights())
        self.assertAllClose(
            total(q, k, q_mask, k_mask),
            q.shape[2] * mean(q, k, q_mask, k_mask),
            rtol=1e-5,
        )

    def test_head_sum_needs_token_clouds(self):
        with self.assertRaisesRegex(ValueError, "head_reduction"):
            KQAlignment(head_reduction="max")
        with self.assertRaisesRegex(ValueError, "match_over='heads'"):
            KQAlignment(head_reduction="sum", match_over="heads")

    @parameterized.parameters("ct", "gan", "ot")
    def test_attached_term_is_its_own_fit_metric(self, method):
        x = np.random.default_rng(9).normal(size=(2, 5, 8)).astype("float32")
        inputs = keras.Input((5, 8))
        term = KQAlignment(method=method, name=f"align_{method}")
        layer = HybridAttention(
            num_heads=2,
            key_dim=4,
            hybrid_init=0.0,
            attention_losses=[term],
        )
        model = keras.Model(inputs, layer(inputs, inputs))
        model.compile("adam", "mse")
        history = model.fit(x, np.zeros_like(x), epochs=2, verbose=0)
        if keras.config.backend() == "jax":
            # No tracker under JAX (AttentionLoss): no stale 0.0 either.
            self.assertNotIn(f"align_{method}", history.history)
        else:
            values = history.history[f"align_{method}"]
            self.assertTrue(np.all(np.isfinite(values)), values)
            self.assertTrue(np.all(np.array(values) != 0.0), values)
        self.assertEqual(len(term.trainable_weights) > 0, method != "ot")
        # It round trips inside the attention layer's config.
        clone = HybridAttention.from_config(layer.get_config())
        self.assertEqual(clone.attention_losses[0].method, method)

    @parameterized.parameters("ct", "gan", "mmd")
    def test_term_shared_by_layers_survives_keras_round_trip(self, method):
        x = np.random.default_rng(14).normal(size=(4, 5, 8)).astype("float32")
        term = KQAlignment(method=method, weight=0.1, name="align")
        inputs = keras.Input((5, 8))
        first = HybridAttention(
            2, 4, hybrid_init=0.0, attention_losses=[term], name="first"
        )
        second = HybridAttention(
            2, 4, hybrid_init=0.0, attention_losses=[term], name="second"
        )
        h = first(inputs, inputs)
        model = keras.Model(inputs, second(h, h))
        model.compile(keras.optimizers.SGD(0.5), "mse")
        model.fit(x, x, epochs=2, batch_size=4, verbose=0)
        path = os.path.join(self.get_temp_dir(), f"shared_{method}.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
        terms = [
            loaded.get_layer(name).attention_losses[0]
            for name in ("first", "second")
        ]
        self.assertIs(terms[0], terms[1])
        self.assertLen(terms[0].weights, len(term.weights))
        for got, want in zip(terms[0].weights, term.weights):
            self.assertAllClose(np.asarray(got), np.asarray(want))
        # One metric for the one term (none under JAX).
        names = [m.name for m in loaded.metrics]
        tracked = keras.config.backend() != "jax"
        self.assertEqual(names.count("align"), int(tracked))
        self.assertEqual(
            [m.name for m in model.metrics], [m.name for m in loaded.metrics]
        )
        self.assertAllClose(
            loaded.predict(x, verbose=0), model.predict(x, verbose=0)
        )
        q, k, q_mask, k_mask = projected(15)
        self.assertAllClose(
            terms[0](q, k, q_mask, k_mask), term(q, k, q_mask, k_mask)
        )

    @parameterized.parameters("ct", "gan", "mmd")
    def test_attached_term_is_built_with_its_attention_layer(self, method):
        term = KQAlignment(method=method)
        layer = HybridAttention(3, 4, hybrid_init=0.0, attention_losses=[term])
        layer.build((None, 5, 8), (None, 5, 8))
        self.assertTrue(term.built)
        self.assertEqual(len(term.weights) > 0, method != "mmd")

    @parameterized.parameters("ct", "gan")
    def test_float32_inputs_beyond_float16_under_mixed_policy(self, method):
        # The terms compute in float32: neither the term nor its adversary
        # casts its inputs to the float16 compute dtype (overflow -> NaN).
        q, k, q_mask, k_mask = projected(16)
        term = KQAlignment(method=method, weight=1.0, dtype="mixed_float16")
        value = term(q * 1e5, k * 1e5, q_mask, k_mask)
        self.assertTrue(np.isfinite(float(value)), value)

    @parameterized.named_parameters(
        ("rank", (2, 6, 12), (2, 7, 3, 4), None, None, "projected queries"),
        ("key_rank", (2, 6, 3, 4), (2, 7, 12), None, None, "rank 4"),
        ("batch", (2, 6, 3, 4), (1, 7, 3, 4), None, None, "must match"),
        ("head_size", (2, 6, 3, 4), (2, 7, 3, 5), None, None, "must match"),
        ("heads", (2, 6, 3, 4), (2, 7, 2, 4), None, None, "must match"),
        ("query_mask", (2, 6, 3, 4), (2, 7, 3, 4), (2, 7), None, "query_mask"),
        ("key_mask", (2, 6, 3, 4), (2, 7, 3, 4), None, (2, 7, 1), "key_mask"),
    )
    def test_bad_shapes_raise(self, q_shape, k_shape, q_mask, k_mask, name):
        term = KQAlignment(method="ot")
        q = np.zeros(q_shape, "float32")
        k = np.zeros(k_shape, "float32")
        q_mask = None if q_mask is None else np.ones(q_mask, bool)
        k_mask = None if k_mask is None else np.ones(k_mask, bool)
        with self.assertRaisesRegex(ValueError, name):
            term(q, k, query_mask=q_mask, key_mask=k_mask)

    def test_adversary_rejects_another_head_size(self):
        q, k, _, _ = projected(17)
        term = KQAlignment(method="gan")
        term(q, k)
        with self.assertRaisesRegex(ValueError, "heads of size 4"):
            term(np.zeros((2, 6, 3, 6), "float32"), np.zeros((2, 7, 3, 6)))

    @parameterized.parameters("mmd", "ct")
    def test_plain_multi_head_attention_through_kq_projections(self, method):
        class Model(keras.Model):
            def __init__(self):
                super().__init__()
                self.mha = keras.layers.MultiHeadAttention(2, 4)
                self.alignment = KQAlignment(method=method, weight=1.0)

            def call(self, x, training=None):
                # Not under `if training:` (see `kq_projections`): the
                # adversary's weights (ct) must exist before `fit` builds
                # the optimizer, or JAX and PyTorch raise.
                self.alignment(*kq_projections(self.mha, x))
                return self.mha(x, x)

        x = np.random.default_rng(10).normal(size=(2, 5, 8)).astype("float32")
        model = Model()
        model.compile("adam", "mse")
        history = model.fit(x, np.zeros_like(x), epochs=2, verbose=0)
        self.assertEqual(
            "kq_alignment" in history.history,
            keras.config.backend() != "jax",
        )
        # The adversary is among the trained variables.
        self.assertLen(
            model.trainable_variables,
            8 + len(model.alignment.trainable_variables),
        )
        if method != "mmd":
            return
        q, k = (ops.convert_to_numpy(t) for t in kq_projections(model.mha, x))
        want = np.mean(
            [
                numpy_mmd(q[b, :, n], k[b, :, n])
                for b in range(2)
                for n in range(2)
            ]
        )
        self.assertAllClose(model.alignment(q, k), want, atol=1e-6)


class KeyQueryMMDDiagnosticTest(TestCase):
    def test_per_layer_head_mmd_matches_direct_computation(self):
        from keras_attnvariants.losses.kq_diagnostics import key_query_mmd

        rng = np.random.default_rng(11)
        x = rng.normal(size=(4, 5, 8)).astype("float32")
        valid = np.arange(5)[None] < np.array([5, 3, 5, 4])[:, None]
        inputs = keras.Input((5, 8))
        mask_in = keras.Input((5,), dtype="bool")
        layer = HybridAttention(2, 4, hybrid_init=0.0, name="att")
        out = layer(inputs, inputs, attention_mask=mask_in[:, None, :])
        model = keras.Model([inputs, mask_in], out)
        data = [((x[:2], valid[:2]), None), ((x[2:], valid[2:]), None)]
        got = key_query_mmd(model, data)
        q, k = (ops.convert_to_numpy(t) for t in kq_projections(layer, x))
        want = np.mean(
            [
                [numpy_mmd(q[b, :, n], k[b, valid[b], n]) for n in range(2)]
                for b in range(4)
            ],
            axis=0,
        )
        self.assertAllClose(got["per_head"]["att"], want, atol=1e-5)
        self.assertAllClose(got["total"], want.sum(), atol=1e-5)
        # The recording wrappers are gone.
        self.assertNotIn("_compute_attention", vars(layer))

    def test_repeated_names_are_counted_among_their_name(self):
        # The README's `name_0, name_1`: another attention layer first
        # made them `a_1, a_2`.
        from keras_attnvariants.losses.kq_diagnostics import layer_labels

        layers = [
            keras.layers.MultiHeadAttention(2, 4, name="b"),
            keras.layers.MultiHeadAttention(2, 4, name="a"),
            keras.layers.MultiHeadAttention(2, 4, name="a"),
        ]
        got = layer_labels(layers)
        self.assertEqual(
            [got[id(layer)] for layer in layers], ["b", "a_0", "a_1"]
        )

    def test_same_named_layers_are_kept_apart(self):
        # keras-hub names every block's attention "self_attention_layer".
        from keras_attnvariants.losses.kq_diagnostics import key_query_mmd

        rng = np.random.default_rng(12)
        x = rng.normal(size=(2, 5, 8)).astype("float32")

        class TwoBlocks(keras.Model):
            def __init__(self):
                super().__init__()
                self.first = HybridAttention(2, 4, hybrid_init=0.0, name="a")
                self.second = HybridAttention(2, 4, hybrid_init=0.0, name="a")

            def call(self, inputs):
                h = self.first(inputs, inputs)
                return self.second(h * 3.0, h * 3.0)

        model = TwoBlocks()
        model(x)
        got = key_query_mmd(model, [x])
        self.assertEqual(sorted(got["per_head"]), ["a_0", "a_1"])
        h = ops.convert_to_numpy(model.first(x, x)) * 3.0
        for label, layer, inputs in (
            ("a_0", model.first, x),
            ("a_1", model.second, h),
        ):
            q, k = (
                ops.convert_to_numpy(t) for t in kq_projections(layer, inputs)
            )
            want = np.mean(
                [
                    [numpy_mmd(q[b, :, n], k[b, :, n]) for n in range(2)]
                    for b in range(2)
                ],
                axis=0,
            )
            self.assertAllClose(got["per_head"][label], want, atol=1e-5)

    def test_self_attention_padding_drops_padded_queries(self):
        from keras_attnvariants.losses.kq_diagnostics import _per_head_mmd

        q, k, _, _ = projected(13)
        k = k[:, :6]
        valid = np.arange(6)[None] < np.array([6, 4])[:, None]
        # A key-padding mask, as keras-hub passes it: (B, T, S).
        mask = np.broadcast_to(valid[:, None, :], (2, 6, 6))
        got, count = _per_head_mmd(q, k, mask, 1.0, True)
        want = np.sum(
            [
                [
                    numpy_mmd(q[b, valid[b], n], k[b, valid[b], n])
                    for n in range(3)
                ]
                for b in range(2)
            ],
            axis=0,
        )
        self.assertEqual(count, 2.0)
        self.assertAllClose(got, want, atol=1e-5)

    def test_a_key_any_head_attends_stays_in_the_clouds(self):
        # A `(B, N, T, S)` mask is reduced over heads with `any`: with
        # `all`, a key masked for one head left every head's cloud.
        from keras_attnvariants.losses.kq_diagnostics import _per_head_mmd

        q, k, _, _ = projected(14)
        mask = np.ones((2, 3, 6, 7), bool)
        mask[:, 0, :, 3] = False
        got, count = _per_head_mmd(q, k, mask, 1.0)
        want, _ = _per_head_mmd(q, k, mask.any(1), 1.0)
        self.assertEqual(count, 2.0)
        self.assertAllClose(got, want, atol=1e-6)
        full = np.sum(
            [
                [numpy_mmd(q[b, :, n], k[b, :, n]) for n in range(3)]
                for b in range(2)
            ],
            axis=0,
        )
        self.assertAllClose(got, full, atol=1e-5)

    def test_a_self_attention_padding_layer_drops_padded_queries(self):
        # Layers built with `self_attention_padding=True` are counted as
        # self-attention: a padded query, which such a layer masks, left
        # the query cloud only through that flag.
        from keras_attnvariants.layers import DoublyNormalizedAttention
        from keras_attnvariants.losses.kq_diagnostics import key_query_mmd

        rng = np.random.default_rng(15)
        x = rng.normal(size=(2, 5, 8)).astype("float32")
        valid = np.arange(5)[None] < np.array([5, 3])[:, None]
        inputs = keras.Input((5, 8))
        mask_in = keras.Input((5,), dtype="bool")
        layer = DoublyNormalizedAttention(
            2, 4, self_attention_padding=True, name="att"
        )
        out = layer(inputs, inputs, attention_mask=mask_in[:, None, :])
        model = keras.Model([inputs, mask_in], out)
        got = key_query_mmd(model, [((x, valid), None)])
        q, k = (ops.convert_to_numpy(t) for t in kq_projections(layer, x))
        want = np.mean(
            [
                [
                    numpy_mmd(q[b, valid[b], n], k[b, valid[b], n])
                    for n in range(2)
                ]
                for b in range(2)
            ],
            axis=0,
        )
        self.assertAllClose(got["per_head"]["att"], want, atol=1e-5)


class _FreeClouds(keras.layers.Layer):
    """Query and key clouds as trainable weights, aligned by `term`."""

    def __init__(self, term, queries, keys, **kwargs):
        super().__init__(**kwargs)
        self.term = term
        self.initial = (queries, keys)

    def build(self, input_shape):
        self.queries, self.keys = (
            self.add_weight(
                shape=value.shape,
                initializer=keras.initializers.Constant(value),
            )
            for value in self.initial
        )

    def call(self, x):
        self.term(self.queries, self.keys)
        return x

    def mmd(self):
        # clouds per head: (B, N, P, H)
        q = ops.transpose(self.queries, (0, 2, 1, 3))
        k = ops.transpose(self.keys, (0, 2, 1, 3))
        return float(ops.mean(gaussian_mmd(q, k, bandwidth=4.0)))


class AlignmentTrainingTest(TestCase):
    @parameterized.parameters(
        ("gan", True), ("gan", False), ("ct", True), ("ct", False)
    )
    def test_shared_term_in_compiled_fit_step(self, method, jit_compile):
        # One term shared by two layers, one optimizer step of the
        # backend's own trainer: the loss is the sum of the two layers'
        # values, the adversary ascends it, the clouds and the navigator
        # descend it.
        if jit_compile and keras.backend.backend() == "torch":
            self.skipTest("torch.compile takes about 30 s here.")
        rng = np.random.default_rng(18)
        keras.utils.set_random_seed(18)
        term = KQAlignment(method=method, weight=1.0)
        layers = [
            _FreeClouds(
                term,
                rng.normal(size=(2, 5, 2, 4)).astype("float32"),
                (rng.normal(size=(2, 5, 2, 4)) + 1.0).astype("float32"),
            )
            for _ in range(2)
        ]
        inputs = keras.Input((1,))
        model = keras.Model(inputs, layers[1](layers[0](inputs)))
        model.compile(keras.optimizers.SGD(1e-2), jit_compile=jit_compile)
        variables = model.trainable_variables
        self.assertLen({id(v) for v in variables}, len(variables))
        self.assertLen(variables, 4 + len(term.trainable_variables))

        def total():
            return sum(float(term(c.queries, c.keys)) for c in layers)

        old = [np.array(ops.convert_to_numpy(v)) for v in variables]
        base = total()
        logs = model.train_on_batch(np.zeros((1, 1)), return_dict=True)
        self.assertAllClose(logs["loss"], base, atol=1e-5)
        new = [np.array(ops.convert_to_numpy(v)) for v in variables]
        players = {
            "adversary": (1.0, lambda p: "critic" in p or "discrim" in p),
            "navigator": (-1.0, lambda p: "navigator" in p),
            "clouds": (-1.0, lambda p: term.name not in p),
        }
        for player, (sign, owns) in players.items():
            mine = [owns(v.path) for v in variables]
            if not any(mine):
                continue
            for v, before, after, moved in zip(variables, old, new, mine):
                v.assign(after if moved else before)
            change = total() - base
            self.assertGreater(sign * change, 0.0, f"{player}: {change}")
        for v, before in zip(variables, old):
            v.assign(before)

    @parameterized.parameters(
        ("gan", "minimax"),
        ("gan", "non_saturating"),
        ("ot", "minimax"),
        ("mmd", "minimax"),
    )
    def test_fit_aligns_free_clouds(self, method, gan_loss):
        # The paper's claim in its simplest setting: when the queries and
        # keys themselves are trained on the alignment loss (the adversary,
        # for "gan", through gradient reversal in the same step), the two
        # clouds of every head move together. Keys start shifted by 2.
        rng = np.random.default_rng(0)
        queries = rng.normal(size=(2, 32, 2, 4)).astype("float32")
        keys = (rng.normal(size=(2, 32, 2, 4)) + 2.0).astype("float32")
        keras.utils.set_random_seed(0)
        term = KQAlignment(
            method=method, weight=1.0, bandwidth=4.0, gan_loss=gan_loss
        )
        clouds = _FreeClouds(term, queries, keys)
        inputs = keras.Input((1,))
        model = keras.Model(inputs, clouds(inputs))
        model.compile(keras.optimizers.Adam(0.01))
        before = clouds.mmd()
        model.fit(np.zeros((300, 1), "float32"), batch_size=1, verbose=0)
        after = clouds.mmd()
        self.assertGreater(before, 0.5)
        self.assertLess(after, before / 5, f"{method}: {before} -> {after}")


class KQAlignmentContractsTest(TestCase):
    # Contracts a mutation sweep found untested.
    def test_cross_attention_projections_build_the_value_from_the_key(self):
        mha = keras.layers.MultiHeadAttention(2, 4)
        rng = np.random.default_rng(0)
        q = rng.normal(size=(2, 5, 8)).astype("float32")
        kv = rng.normal(size=(2, 6, 12)).astype("float32")
        query, key = kq_projections(mha, q, kv)
        self.assertEqual(tuple(query.shape), (2, 5, 2, 4))
        self.assertEqual(tuple(key.shape), (2, 6, 2, 4))
        self.assertEqual(tuple(mha(q, kv).shape), (2, 5, 8))

    def test_projections_refuse_rank_4_inputs(self):
        with self.assertRaisesRegex(
            ValueError, r"`query` must be \(batch, length, dim\)"
        ):
            kq_projections(
                keras.layers.MultiHeadAttention(2, 2), np.ones((2, 3, 4, 5))
            )

    @parameterized.parameters(*METHODS)
    def test_an_example_without_real_queries_or_keys_adds_nothing(self, method):
        q, k, _, _ = projected(21, shift=1.0)
        term = KQAlignment(method, weight=1.0)
        alone = term(q[:1], k[:1])
        for q_mask, k_mask in (
            (np.array([[True] * 6, [False] * 6]), None),
            (None, np.array([[True] * 7, [False] * 7])),
        ):
            got = term(q, k, query_mask=q_mask, key_mask=k_mask)
            self.assertAllClose(got, alone, atol=1e-5)

    @parameterized.parameters(
        *[(m, r) for m in METHODS for r in ("mean", "sum")]
    )
    def test_a_batch_of_padding_only_gives_zero(self, method, reduction):
        q, k, _, _ = projected(22)
        term = KQAlignment(method, weight=1.0, head_reduction=reduction)
        got = term(q, k, query_mask=np.zeros((2, 6), bool))
        self.assertAllClose(got, 0.0)

    def test_heads_matching_refuses_cross_attention(self):
        with self.assertRaisesRegex(ValueError, "needs self-attention"):
            KQAlignment("mmd", match_over="heads")(
                np.ones((2, 6, 3, 4), "float32"),
                np.ones((2, 7, 3, 4), "float32"),
            )

    @parameterized.parameters("gan", "ct")
    def test_a_per_head_adversary_refuses_another_head_count(self, method):
        q, k, _, _ = projected(23)
        term = KQAlignment(method, adversary_per_head=True)
        term(q, k)
        with self.assertRaisesRegex(ValueError, "built for 3 heads"):
            term(q[:, :, :2], k[:, :, :2])

    def test_a_one_row_mask_is_refused_for_an_unknown_batch(self):
        with self.assertRaisesRegex(ValueError, "query_mask"):
            KQAlignment("mmd")(
                keras.Input((6, 3, 4)),
                keras.Input((7, 3, 4)),
                query_mask=keras.Input((6,), batch_size=1, dtype="bool"),
            )

    def test_ot_does_not_move_with_padding_far_from_the_origin(self):
        rng = np.random.default_rng(24)
        q = (100.0 + 0.05 * rng.normal(size=(1, 4, 1, 8))).astype("float32")
        k = (q + 0.02).astype("float32")
        term = KQAlignment("ot", weight=1.0, epsilon=0.05, iterations=50)
        plain = term(q, k)
        padded = np.concatenate([q, np.zeros((1, 60, 1, 8), "float32")], 1)
        mask = np.arange(64)[None] < 4
        got = term(padded, k, query_mask=mask)
        self.assertAllClose(got, plain, rtol=1e-4, atol=0)

    def test_a_weight_of_zero_switches_the_term_off(self):
        q, k, _, _ = projected(25, shift=1.0)
        term = KQAlignment("mmd", weight=0.0)
        self.assertEqual(term.weight, 0.0)
        self.assertAllClose(term(q, k), 0.0)
