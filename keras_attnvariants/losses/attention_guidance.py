"""Attention guidance (AG): steer chosen heads toward fixed patterns."""

import math

import keras
from keras import ops

from keras_attnvariants.losses.attention_loss import AttentionLoss
from keras_attnvariants.losses.attention_loss import batch_mean
from keras_attnvariants.ops.patterns import EDGE_ROWS
from keras_attnvariants.ops.patterns import PATTERN_NAMES
from keras_attnvariants.ops.patterns import guidance_pattern
from keras_attnvariants.ops.patterns import normalize_token_id
from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_int
from keras_attnvariants.validation import is_int
from keras_attnvariants.validation import is_python_value

REDUCTIONS = ("sum", "mean")


def _check_guided_heads(head_map, num_heads, received):
    """`ValueError` when `head_map` guides a head the attention lacks;
    `received` names the argument that sets `num_heads`."""
    # Not `max(head_map, default=-1)`: torch.compile cannot trace the
    # keyword (a graph break in every guided PyTorch step).
    guided = max([-1, *head_map])
    if guided >= num_heads:
        raise ValueError(
            f"`head_patterns` guides head {guided}, but the attention has "
            f"{num_heads} heads. Received: {received}"
        )


def default_head_patterns(num_heads, fraction=0.5):
    """The paper's head map: guide `fraction * num_heads` heads, rounded
    half up (Python's `round` rounded half to even: 5 heads gave 2, 9
    gave 4).

    Heads `0, 1, ..., g - 1` are guided (contiguous, like the reference
    code): head 0 `"next"`, head 1 `"prev"`, the others `"first"`.

    Args:
        num_heads: int >= 1. Heads per attention layer.
        fraction: float in `(0, 1]`. Fraction `lambda` of guided heads
            (paper default 0.5). At least one head is guided.

    Returns:
        dict `{head_index: pattern_name}`.

    Example:

    >>> default_head_patterns(4)
    {0: 'next', 1: 'prev'}
    >>> default_head_patterns(8, fraction=0.5)
    {0: 'next', 1: 'prev', 2: 'first', 3: 'first'}
    """
    num_heads = check_int("num_heads", num_heads)
    fraction = check_float("fraction", fraction)
    if fraction > 1.0:
        raise ValueError(
            "`fraction` must be a float in (0, 1]. "
            f"Received: fraction={fraction!r}"
        )
    guided = max(1, math.floor(fraction * num_heads + 0.5))
    names = ["next", "prev"] + ["first"] * max(0, guided - 2)
    return {head: names[head] for head in range(guided)}


def guidance_alpha(step, alpha, decay_steps=None, warm_steps=0):
    """The guidance weight `alpha_t` at optimizer step `step` (float32).

    `alpha_t = alpha` for `t < warm_steps`, then decays linearly and reaches
    0 at `t = warm_steps + decay_steps`; it stays 0 afterwards. With
    `decay_steps=None` it is constant. `alpha`, `decay_steps` (int >= 1 or
    `None`) and `warm_steps` (int >= 0) are checked as in
    `AttentionGuidanceRegularizer`.
    """
    # `decay_steps=0` gave NaN at `t = warm_steps`, a negative one a
    # constant alpha, a negative `warm_steps` a decay started early.
    alpha = check_float("alpha", alpha, low_inclusive=True)
    if decay_steps is not None:
        decay_steps = check_int("decay_steps", decay_steps)
    warm_steps = check_int("warm_steps", warm_steps, low=0)
    t = ops.cast(step, "float32")
    if decay_steps is None:
        return ops.ones_like(t) * alpha
    progress = ops.clip((t - warm_steps) / float(decay_steps), 0.0, 1.0)
    return alpha * (1.0 - progress)


def _normalize_head_map(head_map, allow_empty, per_layer_allowed=True):
    if not isinstance(head_map, dict) or (not head_map and not allow_empty):
        lists = (
            " or a list of such dicts (one per layer)"
            if per_layer_allowed
            else ""
        )
        raise ValueError(
            "`head_patterns` must be a non-empty dict {head_index: "
            f"pattern_name}}{lists}. Received: head_patterns={head_map!r}"
        )
    normalized = {}
    for head, name in head_map.items():
        if isinstance(head, str) and head.isdigit():
            head = int(head)
        if not is_int(head) or head < 0:
            raise ValueError(
                "`head_patterns` keys must be head indices (ints >= 0). "
                f"Received: head_patterns={head_map!r}"
            )
        if name not in PATTERN_NAMES:
            raise ValueError(
                f"`head_patterns` values must be one of {PATTERN_NAMES}. "
                f"Received: head_patterns={head_map!r}"
            )
        if int(head) in normalized:
            # 0 and "0" (a key read back from a config): one of the two
            # patterns was dropped.
            raise ValueError(
                "`head_patterns` must name each head once. Received: "
                f"head_patterns={head_map!r}, which names head {int(head)} "
                "twice"
            )
        normalized[int(head)] = name
    return dict(sorted(normalized.items()))


def _check_batch_and_length(name, tensor, weights_shape):
    """`ValueError` unless `tensor` is `(B or 1, T)` for weights
    `(B, N, T, T)`; unknown sizes pass."""
    if tensor is None or not hasattr(tensor, "shape"):
        return
    got = tuple(tensor.shape)
    batch, length = weights_shape[0], weights_shape[2]
    if (
        len(got) != 2
        or (None not in (got[0], batch) and got[0] not in (1, batch))
        or (None not in (got[1], length) and got[1] != length)
    ):
        raise ValueError(
            f"`{name}` must have shape (batch, length) = {(batch, length)} "
            "to match `attention_weights` (batch, num_heads, length, "
            f"length). Received: {name} with shape {got}"
        )


def _break_torch_compile_graph():
    """Under torch.compile, ends the traced graph after the step counter's
    increment. Without the break AOTAutograd recomputed `alpha_t` from
    the mutated counter in the backward pass, so a compiled step's
    gradient used the next step's weight (the loss logged the right one;
    a PyTorch bug, not fixed in 2.13). Elsewhere a no-op."""
    if keras.backend.backend() != "torch":
        return
    import torch

    if torch.compiler.is_compiling():
        torch._dynamo.graph_break()


def _check_layer_index(layer_index):
    """`layer_index` as a Python int >= 0 (`None`: 0)."""
    if layer_index is None:
        return 0
    return check_int("layer_index", layer_index, low=0)


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class AttentionGuidanceRegularizer(AttentionLoss):
    """Attention guidance loss: pulls guided heads toward fixed patterns.

    For one layer's self-attention weights `H` `(B, N, T, T)` (before
    dropout) and a head map `{head j: pattern P_j}` this returns, with the
    default `reduction="sum"` (paper Eq. 2-4),

    `alpha_t * mean_b sum_{j guided} sum_{p, q valid} (H_bj[p, q] -
    P_bj[p, q])^2`,

    i.e. `alpha_t` times the batch mean of the summed squared Frobenius
    distances over valid (non-padded) positions. Attached to every layer,
    the terms add up to the paper's sum over layers. `reduction="mean"` is
    the reference code's MSE: for each pattern, the mean of the squared
    differences over its heads and the valid `(b, p, q)` entries, summed
    over patterns. With `k` heads on every guided pattern and unpadded
    length `n`, `mean = sum / (k * n^2)`: `alpha_sum = alpha_mean /
    (k * n^2)` gives the same gradient (e.g. `alpha = 100` with 6 heads per
    pattern at n = 128 is `alpha_sum ~ 1e-3`); with different head counts
    per pattern, no single `alpha_sum` does.

    `alpha_t` schedule: constant `alpha` for `warm_steps` steps (the
    reference code uses 20,000), then linear to 0 over `decay_steps` steps
    (the paper decays from the first step: `warm_steps=0`,
    `decay_steps=total steps`); `decay_steps=None` keeps it constant.

    Step counter: `alpha_t` reads the non-trainable variable `step`, which
    the term increments inside the (compiled) train step, so it works under
    `jit_compile` on every backend and is saved with the model. One instance
    may serve many attention layers (called several times per step): only
    the first call for layer index 0 in a forward pass increments `step`,
    before computing its value, and every call uses `t = step - 1`, so all
    layers of one step see the same `alpha_t`, with `t = 0` at the first
    step. Attached through `attention_losses`, a call's index is its rank
    among the term's calls in the forward pass (index 0 is the first
    attention layer; a layer applied several times, like ALBERT's shared
    layers, gets one index per application), so the term also works when
    attached to the layers of another model later. Called directly (e.g.
    on the scores of a `keras.layers.MultiHeadAttention`), pass
    `layer_index=i` for the i-th layer when one instance serves several
    layers; it defaults to 0. The counter advances only in training calls
    (`training=True`).

    Args:
        head_patterns: dict `{head_index: pattern}` used in every layer, or
            a list of such dicts, one per attention layer call in forward
            order (an empty dict leaves that layer unguided). Patterns:
            `"first"`, `"next"`, `"prev"`, `"delimiter"`, `"period"` (see
            `keras_attnvariants.ops.patterns.guidance_pattern`).
            `default_head_patterns(num_heads)` builds the paper's map.
        alpha: float >= 0. Initial weight `alpha_0` (paper: 100 for models
            with fewer than 12 layers, 10 for 12-16 layers).
        decay_steps: int >= 1 or `None`. Steps of the linear decay to 0
            after the warm period. Defaults to `None` (constant).
        warm_steps: int >= 0. Steps of constant `alpha` first. Defaults to
            `0`. Steps are training forward passes: with an optimizer's
            `gradient_accumulation_steps=k`, `k` per update, so multiply
            both by `k` to count updates.
        reduction: `"sum"` (paper) or `"mean"` (reference code). Defaults
            to `"sum"`.
        edge_rows: `"uniform"` (paper) or `"zero"` (reference code): the
            rows without a target (last row of "next", first of "prev",
            "delimiter"/"period" rows of a sequence with no such token).
            Defaults to `"uniform"`.
        delimiter_ids: int or list of ints, needed by `"delimiter"` (e.g.
            the ids of `[CLS]` and `[SEP]`). Defaults to `None`.
        period_id: int or list of ints, needed by `"period"`. Defaults to
            `None`.
        track_metric: bool. Report the term as a `fit` metric named after
            the layer (the mean over the layers that call it; TensorFlow and
            PyTorch backends, see `AttentionLoss`). Defaults to `True`.
        **kwargs: base layer arguments (`name`, `dtype`).

    Call arguments:
        attention_weights: `(B, N, T, T)` self-attention weights.
        padding_mask: boolean `(B, T)`, `True` = real token, or `None`.
        token_ids: int `(B, T)`, needed by "delimiter" / "period".
        layer_index: int >= 0 (Python or NumPy) or `None` (0). Which head
            map of a per-layer list, and whether this call advances the
            step counter (the first call with index 0 in a forward pass).
        training: bool. The step counter advances only in training.

    Returns:
        float32 scalar, also added with `add_loss`.

    Example:

    >>> import numpy as np
    >>> import keras
    >>> from keras_attnvariants.losses.attention_guidance import (
    ...     AttentionGuidanceRegularizer)
    >>> reg = AttentionGuidanceRegularizer({0: "next", 1: "prev"}, alpha=1.0)
    >>> mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> _, w = mha(x, x, return_attention_scores=True)
    >>> float(reg(w)) > 0
    True

    Reference:
        Deshpande and Narasimhan, "Guiding Attention for Self-Supervised
        Learning with Transformers", Findings of EMNLP 2020.
    """

    def __init__(
        self,
        head_patterns,
        alpha,
        decay_steps=None,
        warm_steps=0,
        reduction="sum",
        edge_rows="uniform",
        delimiter_ids=None,
        period_id=None,
        track_metric=True,
        **kwargs,
    ):
        if isinstance(head_patterns, (list, tuple)):
            if not head_patterns:
                raise ValueError(
                    "`head_patterns` must be a non-empty dict or list of "
                    f"dicts. Received: head_patterns={head_patterns!r}"
                )
            maps = [_normalize_head_map(m, True) for m in head_patterns]
        else:
            maps = [_normalize_head_map(head_patterns, False)]
        alpha = check_float("alpha", alpha, low_inclusive=True)
        if decay_steps is not None:
            decay_steps = check_int("decay_steps", decay_steps)
        warm_steps = check_int("warm_steps", warm_steps, low=0)
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"`reduction` must be one of {REDUCTIONS}. "
                f"Received: reduction={reduction!r}"
            )
        if edge_rows not in EDGE_ROWS:
            raise ValueError(
                f"`edge_rows` must be one of {EDGE_ROWS}. "
                f"Received: edge_rows={edge_rows!r}"
            )
        used = {name for m in maps for name in m.values()}
        if "delimiter" in used:
            if delimiter_ids is None:
                raise ValueError(
                    "The 'delimiter' pattern needs `delimiter_ids` (an int "
                    "or a list of ints). Received: delimiter_ids=None"
                )
        if delimiter_ids is not None:
            delimiter_ids = list(
                normalize_token_id(delimiter_ids, name="delimiter_ids")
            )
        if "period" in used and period_id is None:
            raise ValueError(
                "The 'period' pattern needs `period_id` (an int or a list "
                "of ints). Received: period_id=None"
            )
        if period_id is not None:
            period_id = list(normalize_token_id(period_id, name="period_id"))
        super().__init__(track_metric=track_metric, **kwargs)
        self.per_layer = isinstance(head_patterns, (list, tuple))
        self.head_maps = maps
        self.alpha = alpha
        self.decay_steps = decay_steps
        self.warm_steps = warm_steps
        self.reduction = reduction
        self.edge_rows = edge_rows
        self.delimiter_ids = delimiter_ids
        self.period_id = period_id
        # `step` is created on first use (`build_for_attention`, the first
        # call, or reading `step`), not here: under tf.distribute a term
        # made before `strategy.scope()` and attached inside it then gets
        # a per-replica counter too.
        self._step = None
        self._advanced_this_pass = False
        self.built = True

    @property
    def step(self):
        """The non-trainable float32 step counter (created on first use,
        under the name scope of the term: its path is `<name>/step`)."""
        if self._step is None:
            # Under tf.distribute each replica advances its own copy (all
            # in step) and reads of the copies average: no cross-replica
            # sync in the forward pass. A synced ("only_first_replica")
            # counter let replicas see each other's losses (Keras keeps
            # layer losses in a list shared by the replica threads): the
            # MirroredStrategy loss was 10.85 vs 7.74 on one device.
            # float32 (exact to 2^24 steps), as "mean" needs a float.
            # `add_weight` has no `synchronization`. The name scope gives
            # each term its own variable path: converted backbones carry
            # weights over by path, and two terms' bare "step" collided.
            # An initializer, not a value: `fit`'s symbolic build on JAX and
            # PyTorch is a stateless scope, which defers an initializer but
            # refuses a concrete value (a subclassed model holding a term
            # failed there).
            with keras.name_scope(self.name, caller=self):
                self._step = keras.Variable(
                    initializer="zeros",
                    shape=(),
                    dtype="float32",
                    trainable=False,
                    synchronization="on_read",
                    aggregation="mean",
                    name="step",
                )
        return self._step

    def _on_losses_cleared(self):
        self._advanced_this_pass = False

    needs_self_attention = True

    def build_for_attention(self, num_heads, key_dim):
        # Checked when the model is built (it failed only in `fit`); a
        # per-layer map is checked when called, where its layer is known
        # (layers may differ in heads).
        if not self.per_layer:
            _check_guided_heads(
                self.head_maps[0],
                num_heads,
                f"head_patterns={self.head_patterns!r}",
            )
        # Attention layers build inside the model's strategy scope.
        self.step  # noqa: B018 (creates the counter)

    def __call__(self, *args, **kwargs):
        # Checked here, while it is still a Python / NumPy value: Keras
        # turns a NumPy `layer_index` into a tensor before `call`. Passed
        # on as a keyword: Keras takes only tensors positionally.
        if len(args) > 3:
            if "layer_index" in kwargs:
                raise TypeError("`layer_index` was given twice.")
            kwargs["layer_index"] = args[3]
            args = (*args[:3], *args[4:])
        if "layer_index" in kwargs:
            kwargs["layer_index"] = _check_layer_index(kwargs["layer_index"])
        # Called directly (not attached), the first call creates the
        # counter: a symbolic call (functional model, or `fit`'s symbolic
        # build, where it is initialized when that scope closes) does so
        # before JAX's stateless train step.
        self.step  # noqa: B018
        return super().__call__(*args, **kwargs)

    def load_own_variables(self, store):
        self.step  # noqa: B018 (a `.keras` file holds the counter)
        super().load_own_variables(store)

    @property
    def head_patterns(self):
        """The head map(s) as given (int keys)."""
        if self.per_layer:
            return [dict(m) for m in self.head_maps]
        return dict(self.head_maps[0])

    def current_alpha(self):
        """`alpha_t` of the latest training step (float32 scalar)."""
        return guidance_alpha(
            ops.maximum(self.step - 1, 0),
            self.alpha,
            self.decay_steps,
            self.warm_steps,
        )

    def _head_map(self, layer_index):
        if not self.per_layer:
            return self.head_maps[0]
        if not 0 <= layer_index < len(self.head_maps):
            raise ValueError(
                f"`head_patterns` holds {len(self.head_maps)} per-layer maps; "
                "the term was called for an attention layer beyond them. "
                f"Received: layer_index={layer_index}"
            )
        return self.head_maps[layer_index]

    def _pattern(self, name, valid, token_ids):
        token_id = {"delimiter": self.delimiter_ids, "period": self.period_id}
        if name in token_id and token_ids is None:
            raise ValueError(
                f"The {name!r} pattern needs token ids: pass `token_ids` "
                "(B, T), or open `keras_attnvariants.losses.token_ids_scope` "
                "around the forward pass of attached layers. "
                "Received: token_ids=None"
            )
        return guidance_pattern(
            name,
            valid,
            token_ids=token_ids,
            token_id=token_id.get(name),
            edge_rows=self.edge_rows,
        )

    def call(
        self,
        attention_weights,
        padding_mask=None,
        token_ids=None,
        layer_index=None,
        training=None,
    ):
        # An explicit signature so Keras forwards `training` from the model.
        return super().call(
            attention_weights,
            padding_mask=padding_mask,
            token_ids=token_ids,
            layer_index=layer_index,
            training=training,
        )

    def compute_loss_value(
        self,
        attention_weights,
        padding_mask=None,
        token_ids=None,
        layer_index=None,
        training=None,
    ):
        index = _check_layer_index(layer_index)
        head_map = self._head_map(index)
        weights = ops.cast(attention_weights, "float32")
        shape = tuple(weights.shape)
        if len(shape) != 4 or (None not in shape[2:] and shape[2] != shape[3]):
            raise ValueError(
                "`attention_weights` must be self-attention weights of shape "
                "(batch, num_heads, length, length). Received: "
                f"attention_weights with shape {shape}"
            )
        if shape[1] is not None:
            _check_guided_heads(
                head_map, shape[1], f"attention_weights with shape {shape}"
            )
        for arg, tensor in (
            ("padding_mask", padding_mask),
            ("token_ids", token_ids),
        ):
            _check_batch_and_length(arg, tensor, shape)
        # Once per forward pass: a layer called again (ALBERT's groups) or
        # a repeated index 0 never advances the counter twice in one step.
        # A flag that clearing the losses resets (Keras clears them when
        # the outermost call starts), not `not self.losses`: under
        # `jit_compile` on PyTorch 2.11 (CUDA), torch.compile read that
        # list as non-empty and the counter never advanced.
        if training and index == 0 and not self._advanced_this_pass:
            self._advanced_this_pass = True
            self.step.assign_add(1.0)
            _break_torch_compile_graph()
        alpha = self.current_alpha()
        if not head_map:
            return ops.zeros((), "float32")
        # valid: (B, T). A (1, T) mask is broadcast to the batch: "mean"
        # divided the batch's squared errors by one example's pairs.
        # From the shape, not `weights[:, 0, 0, :]`: that slice failed on
        # an empty sequence (T = 0).
        weights_shape = ops.shape(weights)
        valid = ops.ones((weights_shape[0], weights_shape[3]), "bool")
        if padding_mask is not None:
            valid = ops.logical_and(valid, ops.cast(padding_mask, "bool"))
        valid_f = ops.cast(valid, "float32")
        # pair: (B, 1, T, T), real (query, key) pairs.
        pair = ops.expand_dims(
            ops.expand_dims(valid_f, -1) * ops.expand_dims(valid_f, -2), 1
        )
        # One target for every head (head n's pattern, 0 on unguided heads)
        # and a per-head weight: 1 on guided heads ("sum"), 1 / (heads on
        # the pattern) for the per-pattern mean ("mean"), 0 elsewhere.
        # Slicing or gathering the guided heads instead made XLA store each
        # pattern's gradient as a full-size (B, N, T, T) pad in the
        # backward pass; this form fuses into the weights' gradient.
        head = ops.cast(ops.arange(ops.shape(weights)[1]), "int32")
        target = 0.0
        head_weight = 0.0
        for name in sorted(set(head_map.values())):
            heads = [h for h, n in head_map.items() if n == name]
            # on: (N,) float, 1 on the heads guided toward `name`.
            on = ops.cast(
                ops.any(
                    ops.equal(
                        head[:, None], ops.convert_to_tensor(heads, "int32")
                    ),
                    axis=-1,
                ),
                "float32",
            )
            pattern = self._pattern(name, valid, token_ids)
            target = target + on[:, None, None] * pattern[:, None]
            share = 1.0 if self.reduction == "sum" else 1.0 / len(heads)
            head_weight = head_weight + share * on
        # squared: (B, N, T, T), zero on unguided heads and padding.
        squared = (head_weight[:, None, None] * pair) * ops.square(
            weights - target
        )
        if self.reduction == "sum":
            # Per example, then over the batch (0 for an empty one).
            return alpha * batch_mean(ops.sum(squared, axis=(1, 2, 3)))
        return alpha * ops.sum(squared) / ops.maximum(ops.sum(pair), 1.0)

    def from_attention(self, context):
        # The layer index is the call's rank in this forward pass: how many
        # values the term has added since the pass started.
        return self(
            context["attention_weights"],
            padding_mask=context["key_mask"],
            token_ids=context["token_ids"],
            layer_index=len(self.losses),
            training=True,
        )

    def get_config(self):
        config = super().get_config()
        maps = [{str(h): n for h, n in m.items()} for m in self.head_maps]
        config.update(
            {
                "head_patterns": maps if self.per_layer else maps[0],
                "alpha": self.alpha,
                "decay_steps": self.decay_steps,
                "warm_steps": self.warm_steps,
                "reduction": self.reduction,
                "edge_rows": self.edge_rows,
                "delimiter_ids": self.delimiter_ids,
                "period_id": self.period_id,
            }
        )
        return config


def guidance_attention_bias(
    head_patterns,
    num_heads,
    padding_mask,
    strength=1.0,
    token_ids=None,
    delimiter_ids=None,
    period_id=None,
    edge_rows="uniform",
):
    """Guidance as an additive attention bias instead of a loss.

    Returns `strength * P_j` for each guided head `j` and zeros for the
    others, shape `(B, N, T, T)` float32, to add to the attention logits,
    e.g. `keras.ops.dot_product_attention(q, k, v, bias=bias)`. Unlike the
    loss it changes the forward pass (also at inference) and needs no
    schedule; a large `strength` approaches hard-coded patterns.

    Args:
        head_patterns: dict `{head_index: pattern}`.
        num_heads: int. Heads `N` of the attention.
        padding_mask: boolean `(B, T)`.
        strength: finite float (Python or NumPy, not a bool), or a scalar
            tensor / `keras.Variable`. Logit added at the pattern's
            targets. Defaults to `1.0`.
        token_ids, delimiter_ids, period_id, edge_rows: as in
            `AttentionGuidanceRegularizer`.
    """
    # One layer's bias: a list of per-layer dicts is no form of it.
    head_map = _normalize_head_map(head_patterns, False, False)
    num_heads = check_int("num_heads", num_heads)
    if is_python_value(strength):
        # Numbers are checked; a tensor or `keras.Variable` (an annealed or
        # learned strength) passes.
        strength = check_float("strength", strength, low=None)
    _check_guided_heads(head_map, num_heads, f"num_heads={num_heads}")
    token_id = {"delimiter": delimiter_ids, "period": period_id}
    zeros = None
    heads = []
    for head in range(num_heads):
        name = head_map.get(head)
        if name is None:
            if zeros is None:
                zeros = ops.zeros_like(guidance_pattern("first", padding_mask))
            heads.append(zeros)
            continue
        pattern = guidance_pattern(
            name,
            padding_mask,
            token_ids=token_ids,
            token_id=token_id.get(name),
            edge_rows=edge_rows,
        )
        heads.append(strength * pattern)
    return ops.stack(heads, axis=1)
