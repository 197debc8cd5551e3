"""The loss mechanism shared by the attention layers and their regularizers.

An `AttentionLoss` is a Keras layer that turns what an attention layer
computes (its attention weights before dropout, its projected queries and
keys, the masks, optionally the token ids) into a scalar loss term. It can be
used in two ways:

1. Attached: pass it to an attention layer of this package with
   `attention_losses=[term]` (or to a converted keras-hub backbone). The
   attention layer builds an `AttentionContext` on every call and hands it to
   `term.from_attention(context)`.
2. Standalone: call it on tensors in a functional model, e.g. on the scores a
   plain `keras.layers.MultiHeadAttention` returns with
   `return_attention_scores=True` (those are taken before dropout).

Either way the term adds itself with `add_loss` (so `fit` minimizes it) and
updates a `keras.metrics.Mean` named after the layer, so it shows as its own
metric in `fit` logs and progress bars, on the TensorFlow and PyTorch
backends. The JAX trainer runs layers statelessly and keeps only their
non-trainable variables, so a metric updated inside a layer would stay at its
reset value (`fit` logged 0.0 for the term): under JAX the term has no
tracker and its value does not appear in the logs. The loss itself is
applied on every backend.
"""

import threading
import weakref
from contextlib import contextmanager

import keras
from keras import ops
from keras.src.backend.common.stateless_scope import get_stateless_scope
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.common.symbolic_scope import in_symbolic_scope

from keras_attnvariants.validation import check_attention_losses
from keras_attnvariants.validation import check_bool

_TOKEN_IDS = threading.local()


def batch_mean(values):
    """Mean of `values` over their leading (batch) axis; 0 for an empty
    batch.

    Under `tf.distribute` a final batch smaller than the number of
    replicas leaves some replicas with no example: `ops.mean` is 0 / 0
    there, and the NaN reaches the logged loss (Keras's own losses give 0).

    `values` is a tensor or an array-like (NumPy array, list) of rank >= 1
    (`ValueError` for a scalar); a non-float one is averaged in float32.
    """
    if not (ops.is_tensor(values) or keras.backend.is_keras_tensor(values)):
        # A list has no `dtype`.
        values = ops.convert_to_tensor(values)
    if not keras.backend.is_float_dtype(values.dtype):
        # An int sum divided by a float count raised TypeError.
        values = ops.cast(values, "float32")
    if len(values.shape) == 0:
        raise ValueError(
            "`values` must have a leading batch axis (rank >= 1). "
            f"Received: values.shape={tuple(values.shape)}"
        )
    count = ops.cast(ops.shape(values)[0], values.dtype)
    return ops.sum(values, axis=0) / ops.maximum(count, 1.0)


def _batch_size(args):
    """The leading size of a term's first input, as a float32 sample
    weight for its metric, or `None` (no tensor input with a batch axis)."""
    first = args[0] if args else None
    if first is None or len(getattr(first, "shape", ())) == 0:
        return None
    return ops.cast(ops.shape(first)[0], "float32")


@contextmanager
def token_ids_scope(token_ids):
    """Makes `token_ids` `(B, T)` visible to attached attention losses.

    Attention layers inside a keras-hub backbone only see hidden states. A
    layer that knows the token ids (for instance the wrapped token embedding
    of a converted backbone) opens this scope around the forward pass; each
    attention layer called inside it puts the ids in its `AttentionContext`.
    The storage is thread-local, so replicas of `tf.distribute` (one thread
    each) never see each other's ids.
    """
    previous = getattr(_TOKEN_IDS, "value", None)
    _TOKEN_IDS.value = token_ids
    try:
        yield
    finally:
        _TOKEN_IDS.value = previous


def set_current_token_ids(token_ids):
    """Sets the token ids seen by attention losses until the next set."""
    _TOKEN_IDS.value = token_ids


def current_token_ids():
    """The token ids of the innermost `token_ids_scope`, or `None`."""
    return getattr(_TOKEN_IDS, "value", None)


class AttentionContext(dict):
    """What an attention layer hands to its attached losses.

    Keys (absent values are `None`):
        attention_weights: `(B, N, T, S)` float32, before dropout; `None`
            when no attached term has `needs_attention_weights`.
        query: projected queries `(B, T, N, H)`, unscaled.
        key: projected keys `(B, S, N, H)`.
        attention_mask: boolean `(B, T, S)` or `None`.
        query_mask: boolean `(B, T)`: queries that may attend some key.
        key_mask: boolean `(B, S)`: keys that some query may attend.
        token_ids: `(B, T)` ids from `token_ids_scope`, or `None`.
        layer: the attention layer.
    """


def padding_masks(mask, self_attention=False):
    """Real queries `(B, T)` and keys `(B, S)` of a boolean `(B, T, S)` mask.

    A query is real if it may attend some key, a key if some query may
    attend it. With `self_attention` (queries and keys are the same
    positions, `T == S`), a position that no query may attend is padding
    for both: in a causal decoder with right padding a padded query still
    attends the real keys before it, so `any(mask, -1)` alone would count
    it as a real query.
    """
    query_mask = ops.any(mask, axis=-1)
    key_mask = ops.any(mask, axis=-2)
    if self_attention and mask.shape[-2] == mask.shape[-1]:
        query_mask = ops.logical_and(query_mask, key_mask)
    return query_mask, key_mask


def build_context(
    layer, weights, query, key, attention_mask, self_attention=False
):
    """Builds the `AttentionContext` of one attention call
    (`self_attention` as in `padding_masks`)."""
    query_mask = key_mask = None
    if attention_mask is not None:
        mask = ops.cast(attention_mask, "bool")
        batch = ops.shape(query)[0]
        shape = (batch, ops.shape(query)[1], ops.shape(key)[1])
        mask = ops.broadcast_to(mask, shape)
        query_mask, key_mask = padding_masks(mask, self_attention)
        attention_mask = mask
    return AttentionContext(
        attention_weights=weights,
        query=query,
        key=key,
        attention_mask=attention_mask,
        query_mask=query_mask,
        key_mask=key_mask,
        token_ids=current_token_ids(),
        layer=layer,
    )


class KeepsStepLosses:
    """Mixin for a Keras layer that adds losses and may be called several
    times in one forward pass (a term shared by attention layers, an encoder
    called once per view).

    Keras clears a layer's losses whenever a call of it starts a call
    context. The JAX trainer runs the model's `call` directly, with no
    model-level context, so every top-level call of a shared layer started
    one and dropped the losses its earlier calls had added: only the last
    call's value reached the training loss (TensorFlow and PyTorch open a
    context for the whole model, where this does not happen). A layer with
    this mixin calls `_add_step_loss` instead of `add_loss`; losses added in
    the current stateless scope (one per JAX train step) are then kept.
    """

    def _add_step_loss(self, value):
        self.add_loss(value)
        scope = get_stateless_scope()
        if scope is not None and scope.collect_losses:
            # Weak: the scope ends with its train step.
            self._step_loss_scope = weakref.ref(scope)

    def _clear_losses(self):
        scope = get_stateless_scope()
        remembered = getattr(self, "_step_loss_scope", None)
        if scope is not None and remembered is not None:
            if remembered() is scope:
                return
        super()._clear_losses()
        self._on_losses_cleared()

    def _on_losses_cleared(self):
        """Called when a new forward pass clears this layer's losses."""


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class AttentionLoss(KeepsStepLosses, keras.layers.Layer):
    """Base class of loss terms computed from attention internals.

    Subclasses implement `compute_loss_value(...)` (their public call
    signature) and `from_attention(context)`, which picks what they need
    from an `AttentionContext` and calls the layer. Calling the layer adds
    the returned scalar with `add_loss` and records it in a
    `keras.metrics.Mean` named after the layer.

    Args:
        track_metric: bool. Whether to report the term as a metric (not
            under JAX, see the module docstring). Defaults to `True`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`).
    """

    # Whether `from_attention` reads `context["attention_weights"]`. Terms
    # that read only queries and keys set it to `False`, so the attention
    # layer can skip materializing the weights (`attention_weights` is then
    # `None` in their context).
    needs_attention_weights = True
    # Whether the term reads square self-attention weights (T == S): an
    # attention layer building with known, different query and key lengths
    # then raises `ValueError` (functional models failed only in `fit`).
    needs_self_attention = False

    def __init__(self, track_metric=True, **kwargs):
        # Terms compute in float32 under any policy: no casting of their
        # inputs to a float16 compute dtype first (float32 attention
        # weights would lose precision, large activations overflow).
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        # The inputs may carry a Keras mask (keras MHA's scores in a traced
        # `fit` step): a term reads masks from its arguments, and its
        # scalar output has none. Without this Keras warned, on every
        # trace, that the term "will destroy the mask information".
        self.supports_masking = True
        self.track_metric = check_bool("track_metric", track_metric)
        # `loss_tracker` is None where it could not be updated (JAX).
        self.loss_tracker = None
        if self.track_metric and keras.config.backend() != "jax":
            self.loss_tracker = keras.metrics.Mean(name=self.name)

    def compute_mask(self, *args, **kwargs):
        """None: the term's output is a scalar loss."""
        return None

    def compute_loss_value(self, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__} must implement `compute_loss_value`."
        )

    def build_for_attention(self, num_heads, key_dim):
        """Creates the term's weights for an attention layer of this size.

        Attention layers call this from their `build` with their number of
        heads and query/key head size, so a term's weights exist before the
        first call: a converted backbone (built directly, never called
        symbolically) then saves and reloads them. The base class has no
        weights; it marks a term without a `build` of its own built (an
        unbuilt one made `model.quantize()` raise until the model had
        trained). Terms with weights build them here.
        """
        if type(self).build is keras.layers.Layer.build and all(
            # A sublayer of its own is built by the term's first (symbolic)
            # run, which a term marked built here would skip.
            layer.built
            for layer in self._flatten_layers(include_self=False)
        ):
            self.built = True

    def from_attention(self, context):
        raise NotImplementedError(
            f"{type(self).__name__} must implement `from_attention`."
        )

    def call(self, *args, **kwargs):
        value = ops.cast(self.compute_loss_value(*args, **kwargs), "float32")
        if not in_symbolic_scope():
            # Kept over the layers that share the term (`KeepsStepLosses`).
            self._add_step_loss(value)
            # Stateless scopes (the JAX trainer) drop metric updates made
            # inside layers; the loss itself is still collected there.
            if self.loss_tracker is not None and not in_stateless_scope():
                # Weighted by the batch, as Keras weights its `loss`: under
                # `tf.distribute` the replicas of an uneven final batch
                # then log what one device would (an empty one adds
                # nothing).
                self.loss_tracker.update_state(
                    value, sample_weight=_batch_size(args)
                )
        return value

    def compute_output_spec(self, *args, **kwargs):
        return keras.KerasTensor((), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config["track_metric"] = self.track_metric
        return config


def term_flags(attention_losses):
    """`(layer, trainable)` of every attention loss term and its sublayers,
    to be put back after something that sets them wholesale."""
    return [
        (layer, layer.trainable)
        for term in attention_losses or []
        for layer in term._flatten_layers(include_self=True)
    ]


def check_attention_loss_terms(attention_losses):
    """`attention_losses` as a list of distinct `AttentionLoss` instances;
    `ValueError` for anything else (a single term, a string, another
    object, or a term listed twice, which added its value twice per
    call). Checked before any element is read."""
    check_attention_losses(attention_losses)
    terms = list(attention_losses or [])
    for term in terms:
        if not isinstance(term, AttentionLoss):
            raise ValueError(
                "`attention_losses` must be a list of "
                "`keras_attnvariants.losses.AttentionLoss` instances. "
                f"Received: attention_losses={attention_losses!r} (an "
                f"element: {term!r})"
            )
    if len({id(term) for term in terms}) != len(terms):
        raise ValueError(
            "`attention_losses` must list each term once. Received: "
            f"attention_losses={attention_losses!r}"
        )
    return terms
