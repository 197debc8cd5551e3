"""`KQAlignment`: match each head's key and query distributions."""

import warnings

import keras
from keras import ops

from keras_attnvariants.losses.attention_loss import AttentionLoss
from keras_attnvariants.ops.gradient_reversal import gradient_reversal
from keras_attnvariants.ops.transport import MIN_EPSILON
from keras_attnvariants.ops.transport import _centered
from keras_attnvariants.ops.transport import _expanded_distances
from keras_attnvariants.ops.transport import check_epsilon
from keras_attnvariants.ops.transport import conditional_transport_cost
from keras_attnvariants.ops.transport import cosine_cost
from keras_attnvariants.ops.transport import gaussian_mmd
from keras_attnvariants.ops.transport import sinkhorn_cost
from keras_attnvariants.ops.transport import uniform_marginal
from keras_attnvariants.validation import check_bool
from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_int

METHODS = ("gan", "ot", "ct", "mmd")
# The methods with trained adversaries (`adversary_per_head` applies).
ADVERSARIAL_METHODS = ("gan", "ct")
GAN_LOSSES = ("minimax", "non_saturating")
MATCH_OVER = ("tokens", "heads")
HEAD_REDUCTIONS = ("mean", "sum")


def _same(a, b):
    """Two static sizes agree (an unknown size agrees with anything)."""
    return a is None or b is None or a == b


def _check_rank_3(name, tensor):
    """`ValueError` unless `tensor` has a static rank-3 `shape`."""
    shape = getattr(tensor, "shape", None)
    if shape is None:
        # A list failed with an AttributeError on `.shape`.
        raise ValueError(
            f"`{name}` must be a tensor or NumPy array (batch, length, "
            f"dim). Received: {name} of type {type(tensor).__name__}"
        )
    if len(shape) != 3:
        # MHA would attend over other axes, or not project to (B, T, N, H).
        raise ValueError(
            f"`{name}` must be (batch, length, dim). "
            f"Received: {name}.shape={tuple(shape)}"
        )


def kq_projections(mha, query, key=None, value=None):
    """Projected queries and keys of a `keras.layers.MultiHeadAttention`.

    For plain Keras MHA layers, which have no `attention_losses`: returns
    `(mha._query_dense(query), mha._key_dense(key))`, the tensors MHA
    itself attends with, so `KQAlignment()(*kq_projections(mha, x))` can be
    added in a subclassed model's `call`. Call the term in every call, not
    under `if training:`: `fit` first runs `call` symbolically with
    `training=False`, which builds the term's adversary (and adds no
    loss); a term first called inside the train step creates its weights
    after the optimizer was built, and `fit` then raises on JAX and
    PyTorch. The two private members are listed in
    `tests/layers/mha_contract_test.py`. For a functional model, prefer
    `HybridAttention(hybrid_init=0.0)` with `attention_losses` (exactly
    MHA, see the README, "Key/query alignment").

    Args:
        mha: a built or unbuilt `keras.layers.MultiHeadAttention`.
        query: `(B, T, dim)` query input of the attention call.
        key: `(B, S, dim)` key input; defaults to `query` (self-attention).
        value: `(B, S, dim_v)` value input; only read (for its shape) to
            build an unbuilt `mha`. Defaults to `key`.

    Returns:
        `(query (B, T, N, H), key (B, S, N, H))`.

    Raises:
        ValueError: if `mha` is not a `keras.layers.MultiHeadAttention` or
            an input is not a rank-3 tensor or NumPy array.
    """
    if not isinstance(mha, keras.layers.MultiHeadAttention):
        raise ValueError(
            "`mha` must be a `keras.layers.MultiHeadAttention` (or a "
            f"subclass). Received: mha={mha!r}"
        )
    key = query if key is None else key
    value = key if value is None else value
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        _check_rank_3(name, tensor)
    if not mha.built:
        # MHA's build takes (query, value, key) shapes: with the key's
        # shape as the value's, a value of another width was then
        # rejected by the value projection.
        mha.build(query.shape, value.shape, key.shape)
    return mha._query_dense(query), mha._key_dense(key)


class _AdversaryDense(keras.layers.Layer):
    """Dense on points `(M, d)`, or `(G, M, d)` with one kernel per group.

    With `groups`, group `g` has its own kernel (one per head). With
    `reversal_beta`, the kernel and bias pass through `gradient_reversal`,
    so a minimized loss trains these weights to maximize it while the
    inputs still minimize it. Runs in float32 (variables are not
    autocast). The points are flat (a 2D or 3D matmul): XLA on CPU runs a
    dense on a 4D `(B, G, P, d)` tensor about 1.6x slower than on the
    same points flattened.
    """

    def __init__(self, units, groups=None, reversal_beta=None, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.groups = groups
        self.reversal_beta = reversal_beta

    def build(self, input_shape):
        prefix = () if self.groups is None else (self.groups,)
        self.kernel = self.add_weight(
            name="kernel",
            shape=prefix + (input_shape[-1], self.units),
            initializer="glorot_uniform",
            autocast=False,
        )
        self.bias = self.add_weight(
            name="bias",
            shape=prefix + (self.units,),
            initializer="zeros",
            autocast=False,
        )

    def kernel_and_bias(self, frozen=False):
        """`(kernel, bias)` in float32, the bias shaped to add to the
        output; `frozen`: no gradient to them (the inputs' player), else
        reversed when `reversal_beta` is set."""
        kernel = ops.cast(self.kernel, "float32")
        bias = ops.cast(self.bias, "float32")
        if frozen:
            kernel = ops.stop_gradient(kernel)
            bias = ops.stop_gradient(bias)
        elif self.reversal_beta is not None:
            kernel = gradient_reversal(kernel, self.reversal_beta)
            bias = gradient_reversal(bias, self.reversal_beta)
        if self.groups is not None:
            bias = bias[:, None, :]  # (G, 1, units)
        return kernel, bias

    def call(self, x, frozen=False):
        kernel, bias = self.kernel_and_bias(frozen)
        return ops.matmul(ops.cast(x, "float32"), kernel) + bias


def _dense_concatenated(layers, x, frozen=False):
    """The outputs of several `_AdversaryDense` on the same points, from
    one matmul with their kernels side by side (split on return)."""
    kernels, biases = zip(*(layer.kernel_and_bias(frozen) for layer in layers))
    out = ops.matmul(
        ops.cast(x, "float32"), ops.concatenate(kernels, axis=-1)
    ) + ops.concatenate(biases, axis=-1)
    splits = []
    start = 0
    for layer in layers[:-1]:
        start += layer.units
        splits.append(start)
    return ops.split(out, splits, axis=-1)


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class KQAlignment(AttentionLoss):
    """Alignment attention: match key and query distributions per head.

    A loss term on projected queries `(B, T, N, H)` and keys `(B, S, N, H)`.
    For each example `b` and head `n`, the valid queries
    `{q_{b,t,n}}_t` and the valid keys `{k_{b,s,n}}_s` are two point
    clouds with uniform weights; a discrepancy `D` between them is
    averaged over examples and heads and multiplied by `weight`:

    `loss = weight * mean_{b, n} D({q_{b,.,n}}, {k_{b,.,n}})`.

    The paper (Eq. 1 and Sec. 2.3) sums over the `N` heads:
    `head_reduction="sum"` gives `weight * mean_b sum_n D`, where `weight`
    is the paper's `lambda`. The default mean keeps one `weight` meaning
    the same at any head count (it is the paper's `lambda / N`; the paper
    found results insensitive over `lambda` in 0.01..1).

    Padded tokens (`False` in `query_mask` / `key_mask`) are excluded from
    both clouds; an example with no valid query or key contributes nothing.

    Methods (`D`):
    - `"gan"` (Eq. 2): `E_q log D(q) + E_k log(1 - D(k))` with a
      discriminator `D` = highway layer (`tau = sigmoid(W_t x)`,
      `I = tau * relu(W_h x) + (1 - tau) * x`) then a 2-layer MLP with
      leaky ReLU to a logit, shared across heads. The discriminator's
      weights pass through `gradient_reversal`, so minimizing the added
      loss trains it to maximize `D` while the Q/K projections minimize it,
      in the same optimizer step. At equilibrium the value is `-2 log 2`.
      `gan_loss="non_saturating"` replaces this minimax game: the
      discriminator minimizes `-E_q log D(q) - E_k log(1 - D(k))` on
      inputs held constant, and the projections minimize
      `-E_q log(1 - D(q)) - E_k log D(k)` with the discriminator held
      constant (Goodfellow et al. 2014's non-saturating generator loss,
      applied to both clouds). The projections' side is then bounded below
      by 0, where the minimax one is not; the value is the sum of the two
      losses, `4 log 2` at equilibrium.
    - `"ot"` (Eq. 3): entropic OT cost `sum_ij C_ij pi_ij`,
      `C_ij = ||q_i - k_j||^2`, `pi` from `sinkhorn_plan` (`epsilon`,
      normalized cost, `iterations` fixed), held constant for the gradient.
    - `"ct"` (Eq. 4): bidirectional conditional transport,
      `rho * E_q E_{k ~ pi(.|q)} c + (1 - rho) * E_k E_{q ~ pi(.|k)} c`,
      `pi(k_j | q_i) ∝ exp(t_phi(k_j) . t_phi(q_i))` with a navigator
      `t_phi` (2-layer MLP, leaky ReLU) that minimizes the cost, and
      `c(q, k) = 1 - cos(t_eta(q), t_eta(k))` with a critic `t_eta`
      (highway + 2-layer MLP) trained adversarially through reversed
      weights. `rho = 0.5` (paper).
    - `"mmd"`: squared Gaussian-kernel MMD (the paper's diagnostic),
      non-adversarial, no weights.

    Reference-code parity options: the authors' code differed from the
    paper in two ways. `adversary_per_head=True` gives every head its own
    discriminator / critic / navigator (paper: shared). `match_over="heads"`
    matches, at each token position, the cloud of the `N` head queries to
    the cloud of the `N` head keys (their CT; needs self-attention,
    `T == S`). Its other deviations are bugs and are not reproduced: the
    navigator maximized the cost, the GAN detached the queries, no masks.

    A shared adversary sees the clouds pooled over heads, which can match
    while each head's own clouds move apart (heads trading places): in
    MiniLM fine-tuning the shared GAN discriminator raised the per-head
    MMD, one per head lowered it (README, "Key/query alignment").

    Computations run in float32 under mixed precision; the adversary
    variables are float32 and not autocast.

    Args:
        method: one of `"gan"`, `"ot"`, `"ct"`, `"mmd"`. Defaults to
            `"ct"`.
        weight: float >= 0. The alignment weight `lambda` (paper: 0.01,
            insensitive over 0.01..1). Defaults to `0.01`.
        hidden_dim: int or `None`. Width of the adversary / navigator
            layers; `None` uses the head size `H`. Defaults to `None`.
        epsilon: float > 0, >= 1e-6 with `"ot"`. Sinkhorn regularization
            (`"ot"`; in units of the normalized cost). Defaults to
            `0.01`.
        iterations: int >= 1. Sinkhorn iterations (`"ot"`). Defaults to
            `100`.
        bandwidth: float > 0. Gaussian kernel width (`"mmd"`). Defaults to
            `1.0`.
        rho: float in `[0, 1]`. Forward/backward CT balance (`"ct"`).
            Defaults to `0.5`.
        adversary_per_head: bool. One adversary (and navigator) per head
            instead of one shared. Defaults to `False`.
        match_over: `"tokens"` (paper) or `"heads"` (reference code).
            Defaults to `"tokens"`.
        reversal_beta: float > 0. Scale of the adversary's reversed
            gradient. Defaults to `1.0`.
        gan_loss: `"minimax"` (paper) or `"non_saturating"` (`"gan"`
            only). Defaults to `"minimax"`.
        head_reduction: `"mean"` over examples and heads, or `"sum"` over
            heads and mean over examples (paper; not with
            `match_over="heads"`). Defaults to `"mean"`.
        track_metric: bool. Report the term as a metric (TensorFlow and
            PyTorch backends, see `AttentionLoss`). Defaults to `True`.
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        query: projected queries `(B, T, N, H)`.
        key: projected keys `(B, S, N, H)`.
        query_mask: optional boolean `(B, T)`, `True` = real token.
        key_mask: optional boolean `(B, S)`. Both masks have one row per
            example: a `(1, T)` / `(1, S)` mask raises `ValueError` (it is
            not broadcast over the batch).

    Returns:
        float32 scalar, `weight` times the mean per-example, per-head
        discrepancy (with `head_reduction="sum"`, the per-example sum over
        heads); also added with `add_loss` and tracked as a metric.

    Example:

    >>> import numpy as np
    >>> import keras_attnvariants as kav
    >>> term = kav.KQAlignment(method="mmd", weight=1.0)
    >>> q = np.zeros((2, 5, 3, 4), "float32")
    >>> float(term(q, q))
    0.0
    >>> layer = kav.HybridAttention(
    ...     num_heads=3, key_dim=4, hybrid_init=0.0,
    ...     attention_losses=[kav.KQAlignment(method="ct")])

    Reference:
        Zhang, Fan, Zheng, Tanwisuth, Zhou, "Alignment Attention by
        Matching Key and Query Distributions", NeurIPS 2021.
    """

    # Reads only queries and keys: the attention layer need not materialize
    # its weights for this term.
    needs_attention_weights = False

    def __init__(
        self,
        method="ct",
        weight=0.01,
        hidden_dim=None,
        epsilon=0.01,
        iterations=100,
        bandwidth=1.0,
        rho=0.5,
        adversary_per_head=False,
        match_over="tokens",
        reversal_beta=1.0,
        gan_loss="minimax",
        head_reduction="mean",
        track_metric=True,
        **kwargs,
    ):
        if method not in METHODS:
            raise ValueError(
                f"`method` must be one of {METHODS}. "
                f"Received: method={method!r}"
            )
        weight = check_float("weight", weight, 0.0, True)
        if hidden_dim is not None:
            hidden_dim = check_int("hidden_dim", hidden_dim)
        # The floor only where it is read: `"ot"` (a small unused
        # `epsilon` of another method loaded as before).
        epsilon = check_epsilon(epsilon, floored=method == "ot")
        iterations = check_int("iterations", iterations)
        bandwidth = check_float("bandwidth", bandwidth)
        rho = check_float("rho", rho, 0.0, True)
        if rho > 1.0:
            raise ValueError(f"`rho` must be in [0, 1]. Received: rho={rho}")
        reversal_beta = check_float("reversal_beta", reversal_beta)
        adversary_per_head = check_bool(
            "adversary_per_head", adversary_per_head
        )
        if match_over not in MATCH_OVER:
            raise ValueError(
                f"`match_over` must be one of {MATCH_OVER}. "
                f"Received: match_over={match_over!r}"
            )
        if gan_loss not in GAN_LOSSES:
            raise ValueError(
                f"`gan_loss` must be one of {GAN_LOSSES}. "
                f"Received: gan_loss={gan_loss!r}"
            )
        if gan_loss != "minimax" and method != "gan":
            raise ValueError(
                "`gan_loss` applies to `method='gan'` only. Received: "
                f"gan_loss={gan_loss!r} with method={method!r}"
            )
        if head_reduction not in HEAD_REDUCTIONS:
            raise ValueError(
                f"`head_reduction` must be one of {HEAD_REDUCTIONS}. "
                f"Received: head_reduction={head_reduction!r}"
            )
        if head_reduction == "sum" and match_over == "heads":
            raise ValueError(
                "`head_reduction='sum'` sums over heads, which "
                "`match_over='heads'` makes the points of each cloud "
                "(its groups are token positions); use 'mean'. Received: "
                "head_reduction='sum' with match_over='heads'"
            )
        if adversary_per_head and match_over == "heads":
            raise ValueError(
                "`adversary_per_head=True` needs `match_over='tokens'` (with "
                "`'heads'` the points of a cloud are the heads). Received: "
                "match_over='heads'"
            )
        super().__init__(track_metric=track_metric, **kwargs)
        self.method = method
        self.weight = float(weight)
        self.hidden_dim = hidden_dim
        self.epsilon = float(epsilon)
        self.iterations = iterations
        self.bandwidth = float(bandwidth)
        self.rho = float(rho)
        self.adversary_per_head = adversary_per_head
        self.match_over = match_over
        self.reversal_beta = float(reversal_beta)
        self.gan_loss = gan_loss
        self.head_reduction = head_reduction

    def _dense(self, name, units, groups, reverse, shape):
        layer = _AdversaryDense(
            units,
            groups=groups,
            reversal_beta=self.reversal_beta if reverse else None,
            name=name,
            # float32 compute: under a mixed policy `Layer.__call__` would
            # cast the inputs to float16 first (overflow above 65504).
            dtype="float32",
        )
        layer.build(shape)
        return layer

    def _build_highway_mlp(self, prefix, out_units, groups, reverse, dim):
        hidden = self.hidden_dim or dim
        shape = (None, None, None, dim)
        return [
            self._dense(f"{prefix}_gate", dim, groups, reverse, shape),
            self._dense(f"{prefix}_transform", dim, groups, reverse, shape),
            self._dense(f"{prefix}_dense_1", hidden, groups, reverse, shape),
            self._dense(
                f"{prefix}_dense_2",
                out_units or hidden,
                groups,
                reverse,
                (None, None, None, hidden),
            ),
        ]

    def build(self, query_shape):
        if len(query_shape) != 4:
            raise ValueError(
                "`query` must be projected queries (B, T, N, H). Received: "
                f"query with shape {tuple(query_shape)}"
            )
        num_heads, dim = query_shape[2], query_shape[3]
        if self.method in ADVERSARIAL_METHODS:
            # The adversary's weights are sized by the head size, and by the
            # number of heads when there is one adversary per head (a None
            # there built one shared adversary, silently).
            unknown = []
            if self.adversary_per_head and num_heads is None:
                unknown.append("the number of heads N")
            if dim is None:
                unknown.append("the head size H")
            if unknown:
                raise ValueError(
                    f"`method={self.method!r}` (adversary_per_head="
                    f"{self.adversary_per_head}) sizes its adversary's "
                    f"weights by {' and '.join(unknown)} of `query` "
                    "(B, T, N, H): they must be known when the term is "
                    f"built. Received: query with shape {tuple(query_shape)}"
                )
        groups = num_heads if self.adversary_per_head else None
        hidden = self.hidden_dim or dim
        if self.method == "gan":
            self.discriminator = self._build_highway_mlp(
                "discriminator",
                1,
                groups,
                self.gan_loss == "minimax",
                dim,
            )
        elif self.method == "ct":
            self.critic = self._build_highway_mlp(
                "critic", None, groups, True, dim
            )
            self.navigator = [
                self._dense(
                    "navigator_dense_1",
                    hidden,
                    groups,
                    False,
                    (None, None, None, dim),
                ),
                self._dense(
                    "navigator_dense_2",
                    hidden,
                    groups,
                    False,
                    (None, None, None, hidden),
                ),
            ]
        if not self.trainable:
            # A term frozen before it was built (a reloaded frozen term,
            # or one frozen before attaching): the adversary sublayers were
            # made trainable, and Keras lists a frozen layer's nested
            # trainable variables in `trainable_weights`, so `fit` trained
            # them (on TensorFlow, re-setting `trainable = False` on the
            # term is a no-op).
            for layer in self._flatten_layers(include_self=False):
                layer.trainable = False
        self.built = True

    def build_for_attention(self, num_heads, key_dim):
        if not self.built:
            self.build((None, None, num_heads, key_dim))

    def call(self, query, key, query_mask=None, key_mask=None):
        self._check_inputs(query, key, query_mask, key_mask)
        return super().call(query, key, query_mask, key_mask)

    def compute_output_spec(self, query, key, query_mask=None, key_mask=None):
        self._check_inputs(query, key, query_mask, key_mask)
        return super().compute_output_spec(query, key, query_mask, key_mask)

    def _adversary_heads(self):
        """`(heads, head size)` the built adversary takes (`heads` is None
        when it is shared across heads), or None (not built, no weights)."""
        if not self.built or self.method not in ADVERSARIAL_METHODS:
            return None
        first = (self.discriminator if self.method == "gan" else self.critic)[0]
        kernel_shape = first.kernel.shape  # ([heads,] head size, units)
        heads = kernel_shape[0] if self.adversary_per_head else None
        return heads, kernel_shape[-2]

    def _fits_adversary(self, query_shape):
        """Whether queries of this shape fit the built adversary's weights
        (its head size; its number of heads too when there is one per
        head). Methods without weights fit any shape."""
        built = self._adversary_heads()
        if built is None:
            return True
        heads, dim = built
        return _same(query_shape[3], dim) and _same(query_shape[2], heads)

    def _check_inputs(self, query, key, query_mask, key_mask):
        """`ValueError` unless the shapes are `(B, T, N, H)`, `(B, S, N, H)`
        (fitting the built adversary), `(B, T)` and `(B, S)`."""
        q_shape, k_shape = tuple(query.shape), tuple(key.shape)
        problem = None
        if len(q_shape) != 4 or len(k_shape) != 4:
            problem = "both must have rank 4"
        elif not _same(q_shape[0], k_shape[0]) or not all(
            _same(a, b) for a, b in zip(q_shape[2:], k_shape[2:])
        ):
            problem = "batch, heads and head size must match"
        elif not self._fits_adversary(q_shape):
            heads, dim = self._adversary_heads()
            problem = (
                f"its adversary was built for {heads} heads of size {dim}"
                if self.adversary_per_head
                else f"its adversary was built for heads of size {dim}"
            )
        if problem is not None:
            raise ValueError(
                "`query` and `key` must be projected queries (B, T, N, H) "
                f"and keys (B, S, N, H): {problem}. Received: query with "
                f"shape {q_shape}, key with shape {k_shape}"
            )
        for name, mask, points in (
            ("query_mask", query_mask, q_shape[:2]),
            ("key_mask", key_mask, k_shape[:2]),
        ):
            if mask is None:
                continue
            shape = tuple(mask.shape)
            # A static batch of 1 against an unknown one (traced): the
            # mask would broadcast where the eager call refuses it.
            one_row = len(shape) == 2 and shape[0] == 1 and points[0] != 1
            if (
                len(shape) != 2
                or one_row
                or not all(_same(a, b) for a, b in zip(shape, points))
            ):
                # One row per example, as documented: unlike the attention
                # layers' masks, a (1, length) mask is not broadcast.
                hint = (
                    " (one row per example: a (1, length) mask is not "
                    "broadcast over the batch)"
                    if len(shape) == 2 and shape[0] == 1
                    else ""
                )
                raise ValueError(
                    f"`{name}` must be a boolean (batch, length) = {points} "
                    f"tensor{hint}. Received: {name}.shape={shape}"
                )

    def from_attention(self, context):
        return self(
            context["query"],
            context["key"],
            query_mask=context["query_mask"],
            key_mask=context["key_mask"],
        )

    @staticmethod
    def _highway_mlp(layers, x, frozen=False, first=None):
        """Highway then a 2-layer MLP with leaky ReLU on points `x`.

        `first`: the gate and transform outputs, when the caller computed
        them (with other layers' outputs in the same matmul).
        """
        gate, transform, dense_1, dense_2 = layers
        # Highway: tau * relu(W_h x) + (1 - tau) * x; gate and transform
        # in one matmul.
        gated, transformed = first or _dense_concatenated(
            [gate, transform], x, frozen
        )
        tau = ops.sigmoid(gated)
        x = tau * ops.relu(transformed) + (1.0 - tau) * x
        return dense_2(ops.leaky_relu(dense_1(x, frozen=frozen)), frozen=frozen)

    def _pointwise(self, function, x):
        """`function` of flat points applied to a cloud `(B, G, P, d)`.

        `function` maps points `(M, d)` (shared adversary) or `(G, M, d)`
        (one per head) to `(..., u)`, or to a tuple of such; returns
        `(B, G, P, u)` (or the tuple of them).
        """
        batch, groups, points, dim = ops.shape(x)
        per_head = self.adversary_per_head
        if per_head:
            flat = ops.reshape(
                ops.transpose(x, (1, 0, 2, 3)), (groups, -1, dim)
            )
        else:
            flat = ops.reshape(x, (-1, dim))
        outputs = function(flat)

        def cloud(out):
            if per_head:
                out = ops.reshape(out, (groups, batch, points, out.shape[-1]))
                return ops.transpose(out, (1, 0, 2, 3))
            return ops.reshape(out, (batch, groups, points, out.shape[-1]))

        if isinstance(outputs, (tuple, list)):
            return tuple(cloud(out) for out in outputs)
        return cloud(outputs)

    def _clouds(self, query, key, query_mask, key_mask):
        """Point clouds `(B, G, P, H)`, point masks and group weights."""
        q = ops.cast(query, "float32")
        k = ops.cast(key, "float32")
        batch, q_len, num_heads = ops.shape(q)[:3]
        k_len = ops.shape(k)[1]
        q_valid = (
            ops.ones((batch, q_len), "bool")
            if query_mask is None
            else ops.cast(query_mask, "bool")
        )
        k_valid = (
            ops.ones((batch, k_len), "bool")
            if key_mask is None
            else ops.cast(key_mask, "bool")
        )
        # Padded tokens hold anything (inf, nan, values whose square
        # overflows): zeroed, since a zero weight times inf is nan in the
        # value and in the adversary's gradient.
        if query_mask is not None:
            q = ops.where(q_valid[:, :, None, None], q, 0.0)
        if key_mask is not None:
            k = ops.where(k_valid[:, :, None, None], k, 0.0)
        if self.match_over == "tokens":
            # clouds: (B, N, T, H) and (B, N, S, H); groups are heads.
            q = ops.transpose(q, (0, 2, 1, 3))
            k = ops.transpose(k, (0, 2, 1, 3))
            q_points = ops.broadcast_to(
                q_valid[:, None, :], (batch, num_heads, q_len)
            )
            k_points = ops.broadcast_to(
                k_valid[:, None, :], (batch, num_heads, k_len)
            )
            present = ops.logical_and(
                ops.any(q_valid, axis=-1), ops.any(k_valid, axis=-1)
            )
            groups = ops.broadcast_to(present[:, None], (batch, num_heads))
            return q, k, q_points, k_points, groups
        if query.shape[1] != key.shape[1]:
            raise ValueError(
                "`match_over='heads'` pairs query and key positions and needs "
                "self-attention (T == S). Received: query length "
                f"{query.shape[1]}, key length {key.shape[1]}"
            )
        # clouds: (B, T, N, H); groups are token positions, points heads.
        points = ops.ones((batch, q_len, num_heads), "bool")
        return q, k, points, points, ops.logical_and(q_valid, k_valid)

    def _on_both(self, function, q, k):
        """`function` of flat points on the query and the key clouds.

        Two passes: concatenating the clouds first costs more (a copy each
        way) than the second, smaller matmuls.
        """
        return self._pointwise(function, q), self._pointwise(function, k)

    def _discriminate(self, q, k, frozen=False):
        """Discriminator logits `(B, G, P)` of the queries and the keys."""
        logit_q, logit_k = self._on_both(
            lambda x: self._highway_mlp(self.discriminator, x, frozen), q, k
        )
        return logit_q[..., 0], logit_k[..., 0]

    @staticmethod
    def _log_likelihood(logit_q, logit_k, q_points, k_points, q_sign):
        """`E_q log sigmoid(q_sign l_q) + E_k log sigmoid(-q_sign l_k)`."""
        real = ops.sum(
            uniform_marginal(q_points) * ops.log_sigmoid(q_sign * logit_q),
            -1,
        )
        fake = ops.sum(
            uniform_marginal(k_points) * ops.log_sigmoid(-q_sign * logit_k),
            -1,
        )
        return real + fake

    def _gan(self, q, k, q_points, k_points):
        if self.gan_loss == "minimax":
            # log D(q) + log(1 - D(k)); reversed discriminator gradients.
            return self._log_likelihood(
                *self._discriminate(q, k), q_points, k_points, 1.0
            )
        # The discriminator's loss on constant inputs, the projections'
        # (labels swapped) through a constant discriminator.
        held = self._discriminate(ops.stop_gradient(q), ops.stop_gradient(k))
        moved = self._discriminate(q, k, frozen=True)
        return -self._log_likelihood(
            *held, q_points, k_points, 1.0
        ) - self._log_likelihood(*moved, q_points, k_points, -1.0)

    def _ct_features(self, x):
        """Navigator `t_phi(x)` and critic `t_eta(x)` of flat points; the
        navigator's first layer shares one matmul with the critic's gate
        and transform (same inputs)."""
        gate, transform = self.critic[:2]
        nav_hidden, gated, transformed = _dense_concatenated(
            [self.navigator[0], gate, transform], x
        )
        navigator = self.navigator[1](ops.leaky_relu(nav_hidden))
        critic = self._highway_mlp(self.critic, x, first=(gated, transformed))
        return navigator, critic

    def _ct(self, q, k, q_points, k_points):
        (nav_q, critic_q), (nav_k, critic_k) = self._on_both(
            self._ct_features, q, k
        )
        # logits: (B, G, P, P') = t_phi(q_i) . t_phi(k_j)
        logits = ops.einsum("bgid,bgjd->bgij", nav_q, nav_k)
        cost = cosine_cost(critic_q, critic_k)
        return conditional_transport_cost(
            cost, logits, q_points, k_points, rho=self.rho
        )

    def compute_loss_value(self, query, key, query_mask=None, key_mask=None):
        q, k, q_points, k_points, groups = self._clouds(
            query, key, query_mask, key_mask
        )
        # per_group: (B, G)
        if self.method == "gan":
            per_group = self._gan(q, k, q_points, k_points)
        elif self.method == "ct":
            per_group = self._ct(q, k, q_points, k_points)
        elif self.method == "ot":
            # Centered on the valid queries' mean (the cost does not
            # change; see `_centered`): the plain mean would shift with the
            # amount of padding, and so would the rounding.
            q, k = _centered(q, k, uniform_marginal(q_points))
            per_group = sinkhorn_cost(
                _expanded_distances(q, k),
                self.epsilon,
                self.iterations,
                q_points,
                k_points,
            )
        else:
            per_group = gaussian_mmd(q, k, q_points, k_points, self.bandwidth)
        groups = ops.cast(groups, "float32")
        total = ops.sum(per_group * groups)
        if self.head_reduction == "sum":
            # The paper's sum over heads, averaged over the examples that
            # have a valid query and key.
            # `ops.amax`: PyTorch's `ops.max` breaks torch.compile's graph.
            count = ops.sum(ops.amax(groups, axis=-1))
        else:
            count = ops.sum(groups)
        return self.weight * total / ops.maximum(count, 1.0)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        epsilon = config.get("epsilon")
        if (
            config.get("method", "ct") == "ot"
            and isinstance(epsilon, float)
            and 0.0 < epsilon < MIN_EPSILON
        ):
            # Saved before the floor: loaded (for serving, where the term
            # does not run) with the smallest `epsilon` that keeps the
            # plan's marginals, not refused.
            warnings.warn(
                f"KQAlignment: epsilon={epsilon} in a saved config is below "
                f"{MIN_EPSILON}, where a float32 Sinkhorn plan loses its "
                f"marginals; loading it with epsilon={MIN_EPSILON}.",
                stacklevel=2,
            )
            config["epsilon"] = MIN_EPSILON
        return super().from_config(config)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "method": self.method,
                "weight": self.weight,
                "hidden_dim": self.hidden_dim,
                "epsilon": self.epsilon,
                "iterations": self.iterations,
                "bandwidth": self.bandwidth,
                "rho": self.rho,
                "adversary_per_head": self.adversary_per_head,
                "match_over": self.match_over,
                "reversal_beta": self.reversal_beta,
                "gan_loss": self.gan_loss,
                "head_reduction": self.head_reduction,
            }
        )
        return config
