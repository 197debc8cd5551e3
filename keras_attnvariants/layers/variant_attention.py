"""`VariantAttention`: the shared base of this package's attention layers."""

import contextlib
import numbers
import warnings
import weakref

import keras
import numpy as np
from keras import ops
from keras.src.backend import compute_output_spec
from keras.src.backend.common import global_state
from keras.src.backend.common.masking import get_keras_mask
from keras.src.backend.common.masking import set_keras_mask
from keras.src.backend.common.stateless_scope import get_stateless_scope
from keras.src.backend.common.symbolic_scope import in_symbolic_scope

from keras_attnvariants.losses.attention_loss import build_context
from keras_attnvariants.losses.attention_loss import check_attention_loss_terms
from keras_attnvariants.losses.attention_loss import term_flags
from keras_attnvariants.ops.masking import merge_masks
from keras_attnvariants.ops.masking import self_attention_padding_mask
from keras_attnvariants.ops.noise import dropout_multipliers
from keras_attnvariants.ops.noise import positional_dropout
from keras_attnvariants.ops.normalization import math_dtype
from keras_attnvariants.validation import SEED_LIMIT
from keras_attnvariants.validation import check_bool
from keras_attnvariants.validation import check_int
from keras_attnvariants.validation import check_seed
from keras_attnvariants.validation import is_int
from keras_attnvariants.validation import python_scalars
from keras_attnvariants.validation import static_shape

ATTENTION_PATHS = ("auto", "explicit", "fused")
# Query (B, T, N, H), key and value (B, S, N, H), scores (B, N, T, S).
LOGITS_EQUATION = "btnh,bsnh->bnts"
COMBINE_EQUATION = "bnts,bsnh->btnh"


# term -> the attention layers it is attached to (weakly held).
_ATTACHED = weakref.WeakKeyDictionary()


def prefer_fused_path():
    """What `attention_path="auto"` picks, by measurement (docs/benchmarks.md).

    - PyTorch: fused. Its `scaled_dot_product_attention` kernel, bias
      included, beats the eager per-op explicit path on CPU and on an
      H100 (every length, float32 and bfloat16, train and infer).
    - JAX: explicit, on CPU and on an H100 (every length, float32 and
      bfloat16, train and infer). The DNAS bias itself needs `Q K^T` and a
      logsumexp over the queries, so the fused path computes the scores
      twice and still writes an `(S, S)` tensor; no flash kernel here takes
      a bias (keras's TPU kernel drops it, see `fused_biased_attention`).
    - TensorFlow: explicit, measured on CPU; keras's TensorFlow
      `dot_product_attention` has no fused kernel on any device, so there
      the fused path is the explicit computation plus a second `Q K^T`.
    """
    return keras.config.backend() == "torch"


def check_attention_inputs(query, value, key=None):
    """`ValueError` unless the batch sizes agree and `key` (if given) is as
    long as `value`; unknown sizes pass. Without this, a mismatch surfaced
    as a backend error, a silent broadcast, or (in argmax inference, which
    gathers value rows) wrong rows or NaN."""
    tensors = {"query": query, "value": value}
    if key is not None:
        tensors["key"] = key
    for name, tensor in tensors.items():
        if len(tensor.shape) != 3:
            raise ValueError(
                f"`{name}` must have shape (batch, length, dim). Received: "
                f"{name} with shape {tuple(tensor.shape)}"
            )
    batches = {name: t.shape[0] for name, t in tensors.items()}
    known = {b for b in batches.values() if b is not None}
    if len(known) > 1:
        raise ValueError(
            "`query`, `value` and `key` must have the same batch size. "
            "Received: "
            + ", ".join(
                f"{name} with shape {tuple(t.shape)}"
                for name, t in tensors.items()
            )
        )
    if key is not None and None not in (key.shape[1], value.shape[1]):
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                "`key` and `value` must have the same length. Received: "
                f"key with shape {tuple(key.shape)}, value with shape "
                f"{tuple(value.shape)}"
            )


def apply_frozen_flag(layer):
    """Freezes what `layer.build` made if the layer was frozen before it
    was built (`trainable=False` in the constructor, the setter, or a
    `.keras` reload): Keras set only the flag, the sublayers and variables
    made later started trainable, and `fit` trained them. Uses the layer's
    own setter (`VariantAttention`'s keeps shared terms)."""
    if not layer.trainable:
        type(layer).trainable.fset(layer, False)


def build_unbuilt_terms(terms, run):
    """Calls `run()`, a symbolic call that runs the unbuilt `terms` and so
    builds their sublayers, when one of `terms` is unbuilt; then freezes
    what it built in a frozen term (`apply_frozen_flag`: Keras made those
    weights trainable)."""
    unbuilt = [term for term in terms or () if not term.built]
    if unbuilt:
        run()
        for term in unbuilt:
            apply_frozen_flag(term)


def warn_misadded_biases(denses):
    """Warns where Keras 3.15's TensorFlow `ops.add` adds a projection's
    bias along the wrong axis: a bias that squeezes to one axis that is not
    its last, `(N, 1)` for a head size of 1, is taken for a channels-first
    `bias_add` and added along the sequence axis whenever a batch's length
    is `N` (Keras MHA too; JAX and PyTorch are right). Silent wrong
    numbers, so said at build time, one warning naming every such shape.
    `tests/layers/mha_contract_test.py` pins the Keras behaviour."""
    if keras.backend.backend() != "tensorflow":
        return
    shapes = []
    for dense in denses:
        bias = getattr(dense, "bias", None)
        shape = () if bias is None else tuple(bias.shape)
        wide = [size for size in shape if size != 1]
        if len(wide) == 1 and shape[-1] != wide[0] and shape not in shapes:
            shapes.append(shape)
    if shapes:
        lengths = sorted({size for shape in shapes for size in shape} - {1})
        warnings.warn(
            f"Projection biases of shape {', '.join(map(str, shapes))} "
            "are added along the sequence axis instead of the head axis, "
            "on TensorFlow, to any batch of sequence length "
            f"{' or '.join(map(str, lengths))}: a Keras 3.15 bug in "
            "`ops.add` (Keras MultiHeadAttention too). Use a head size "
            "above 1, `use_bias=False`, or the JAX or PyTorch backend.",
            stacklevel=3,
        )


class _SavedTermFlags:
    """The attached terms' flags as a config saved them, in a plain object:
    a list attribute would be tracked by Keras, which then listed the terms'
    sublayers as the attention layer's own."""

    def __init__(self, flags):
        self.flags = flags


def _runtime_shape_checked(query, value, key):
    """`query`, `value` and `key`, on TensorFlow behind an assertion that
    the batch sizes agree and `key` is as long as `value` where a size is
    unknown when tracing (a graph of any batch: an exported model serving
    traffic); else unchanged. Keras masks are carried over.

    `check_attention_inputs` compares the known sizes only. In such a graph
    a value batch of 1 was broadcast over a query batch of 2, silently,
    and a shorter `key` failed in the Gumbel gather, which reads wrong
    rows on a GPU. JAX and PyTorch trace with known sizes; XLA drops the
    assertion.
    """
    unchanged = query, value, key
    if keras.backend.backend() != "tensorflow":
        return unchanged
    # Self-attention passes one tensor twice (or three times): its sizes
    # always agree, and its graph keeps no assertion.
    others = {
        name: tensor
        for name, tensor in (("value", value), ("key", key))
        if tensor is not None and tensor is not query
    }
    check_length = key is not None and key is not value
    batches_known = all(
        isinstance(t.shape[0], int) for t in (query, *others.values())
    )
    lengths_known = not check_length or (
        isinstance(key.shape[1], int) and isinstance(value.shape[1], int)
    )
    if batches_known and lengths_known:
        return unchanged
    import tensorflow as tf

    if tf.executing_eagerly():
        return unchanged
    checks = [
        tf.debugging.assert_equal(
            tf.shape(query)[0],
            tf.shape(tensor)[0],
            message=f"`query` and `{name}` must have the same batch size",
        )
        for name, tensor in others.items()
    ]
    if check_length:
        checks.append(
            tf.debugging.assert_equal(
                tf.shape(key)[1],
                tf.shape(value)[1],
                message="`key` and `value` must have the same length",
            )
        )
    if not checks:
        return unchanged
    outputs = {}

    def checked(tensor):
        """`tensor` behind the checks, once per distinct tensor (the same
        tensor passed twice stays one)."""
        if tensor is None:
            return None
        if id(tensor) not in outputs:
            with tf.control_dependencies(checks):
                out = tf.identity(tensor)
            mask = get_keras_mask(tensor)
            if mask is not None:
                set_keras_mask(out, mask)
            outputs[id(tensor)] = out
        return outputs[id(tensor)]

    return checked(query), checked(value), checked(key)


def _check_sizes(num_heads, key_dim, kwargs):
    """`num_heads`, `key_dim` and, in `kwargs`, `value_dim`, `use_bias`,
    `use_gate`, `sliding_window` and `output_shape` checked and made Python
    values (in place for `kwargs`).

    Keras MHA took `num_heads=True` (and stored it in its config),
    `use_bias="no"` or `use_gate="no"` (a gate built) and `output_shape=0`
    (ignored), and rejected NumPy ints (`sliding_window` too) with a
    message that showed a valid-looking value.
    """
    num_heads = check_int("num_heads", num_heads)
    key_dim = check_int("key_dim", key_dim)
    if kwargs.get("value_dim") is not None:
        kwargs["value_dim"] = check_int("value_dim", kwargs["value_dim"])
    for flag in ("use_bias", "use_gate"):
        if flag in kwargs:
            kwargs[flag] = check_bool(flag, kwargs[flag])
    if kwargs.get("sliding_window") is not None:
        kwargs["sliding_window"] = check_int(
            "sliding_window", kwargs["sliding_window"]
        )
    output_shape = kwargs.get("output_shape")
    if output_shape is not None:
        is_sequence = isinstance(output_shape, (list, tuple))
        sizes = list(output_shape) if is_sequence else [output_shape]
        try:
            if not sizes:
                raise ValueError("empty")
            sizes = [check_int("output_shape", size) for size in sizes]
        except ValueError:
            raise ValueError(
                "`output_shape` must be None, an int >= 1 or a tuple of "
                f"ints >= 1. Received: output_shape={output_shape!r}"
            ) from None
        kwargs["output_shape"] = tuple(sizes) if is_sequence else sizes[0]
    return num_heads, key_dim


def check_padding_mask(name, mask, tensor):
    """`ValueError` unless `mask` is `(batch, length)` for `tensor`
    `(batch, length, dim)` (a batch of 1 broadcasts); `None` and unknown
    sizes pass. Keras MHA expands such a mask to `(B, T, 1)` or `(B, 1, S)`
    and merges it with the others, so a wrong one was broadcast silently
    or failed later in a backend op. A nested list (Keras MHA casts its
    masks) is checked by its NumPy shape."""
    if mask is None:
        return
    expected = (tensor.shape[0], tensor.shape[1])
    shape = static_shape(mask)
    if shape is None:  # an unknown rank
        return
    valid = len(shape) == 2 and (
        None in (shape[0], expected[0]) or shape[0] in (1, expected[0])
    )
    if valid and None not in (shape[1], expected[1]):
        valid = shape[1] == expected[1]
    if not valid:
        raise ValueError(
            f"`{name}` must be a boolean tensor of shape (batch, length) = "
            f"{expected}. Received: {name} with shape {shape}"
        )


@contextlib.contextmanager
def keras_masks_restored(tensors, detach=False):
    """Puts the Keras masks of `tensors` back when the block ends.

    With `detach`, they are also cleared for the block: sublayers that do
    not support masking warn that they "destroy" a mask they are handed.

    Args:
        tensors: iterable of tensors (`None` entries are skipped).
        detach: bool. Clear the masks inside the block.
    """
    masks = []
    for tensor in tensors:
        mask = None if tensor is None else get_keras_mask(tensor)
        if mask is not None:
            masks.append((tensor, mask))
    if detach:
        for tensor, _ in masks:
            set_keras_mask(tensor, None)
    try:
        yield
    finally:
        for tensor, mask in masks:
            set_keras_mask(tensor, mask)


def _graph_name_scope(name):
    """TensorFlow's `tf.name_scope(name)`; a no-op on other backends."""
    if keras.backend.backend() != "tensorflow":
        return contextlib.nullcontext()
    import tensorflow as tf

    return tf.name_scope(name)


def serialize_attention_loss(term):
    """`term`'s config, tagged so that one term shared by layers stays one.

    While saving, Keras tags an object it meets a second time with a
    `shared_object_id`, and loading then rebuilds one instance for all
    configs with that id. It tags the first occurrence by mutating the
    config it recorded, but a config nested in a layer's `get_config` has
    been copied by then (`serialization_lib.serialize_dict`): the first
    layer's copy stayed untagged, so a term attached to several layers came
    back as two terms (and an adversarial term failed to load its weights).
    Tagging every occurrence here keeps it one term. Outside a Keras
    sharing scope (plain `from_config`) the tag is ignored.

    Without its `build_config`: the attention layer builds its terms
    (`build_for_attention`, then a symbolic call for terms with sublayers,
    `VariantAttention._build_terms`). Keras's default `build` cannot trace
    a term's call, so a user term rebuilt from its `build_config` was
    marked built with its sublayers unbuilt, and their saved weights
    failed to load.
    """
    config = keras.saving.serialize_keras_object(term)
    config.pop("build_config", None)
    config["shared_object_id"] = id(term)
    return config


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class VariantAttention(keras.layers.MultiHeadAttention):
    """Base class: `MultiHeadAttention` with a replaceable normalization.

    Subclasses override `normalize(scores, mask)` (float32 weights from
    float32 scores) and, optionally, `normalize_and_attend(...)` and
    `fused_attention(...)`. This class keeps
    MHA's constructor, call signature, weight layout and Keras-mask merging,
    and adds:

    - Mask validation: `attention_mask` must be rank 3, each axis 1 or
      the size of `(B, T, S)` (a rank-2 mask raises: Keras MHA reads it as
      `(T, S)`, and a `(B, S)` padding mask passed there looks the same
      when `B == T`; pass `mask[None]` for one mask shared by the batch),
      `query_mask` be `(B, T)` and `value_mask` and `key_mask` `(B, S)`;
      anything else raises `ValueError`, checked before the masks are
      merged. The Keras masks of the inputs are left in place
      (Keras MHA clears them).
    - `self_attention_padding`: in self-attention, a key that no query may
      attend is treated as a padded query too. keras-hub encoders mask only
      keys; with this set, padded queries stay out of every normalization
      over queries.
    - `attention_losses`: `AttentionLoss` terms computed, in training, from
      the weights before dropout and the projected queries and keys.
    - `attention_path`: `"explicit"` computes the normalization with
      `keras.ops` (materializing the weights when they are needed,
      otherwise folding them into the value product through
      `normalize_and_attend`); `"fused"` calls
      `keras.ops.dot_product_attention` with a bias; `"auto"` picks
      whichever measured faster (CPU and H100 GPU): explicit under
      TensorFlow and JAX, fused under PyTorch (`prefer_fused_path`). The
      explicit path with materialized weights is always used when the
      weights are needed (returned scores, attention losses that read
      them, or dropout in a subclass that does not fold it: see
      `_folds_dropout`).
    - Attention `dropout` (training only) keeps MHA's rate and seed
      generator but draws its mask with `ops.noise.positional_dropout`:
      the mask of weight `(b, n, t, s)` hashes the generator state with
      that index, so outputs on real tokens do not change with the amount
      of padding after them, and replicas under `tf.distribute` (ranks
      under `torch.distributed`) drop different weights. Keras MHA's
      `Dropout` draws one mask over the whole shape (a new one when the
      padding changes) and the same on every replica.

    Args:
        num_heads: int. Number of attention heads.
        key_dim: int. Size of each head for query and key.
        attention_losses: list of `AttentionLoss`. Defaults to `None`.
        self_attention_padding: bool. Defaults to `False`.
        attention_path: one of `"auto"`, `"explicit"`, `"fused"`. Defaults
            to `"auto"`.
        **kwargs: every other `keras.layers.MultiHeadAttention` argument.
            `flash_attention` must be `None` or `False` and has no effect
            (`True` raises `ValueError`): the kernel is chosen with
            `attention_path`. `seed` must be an int in `[0, 2**31)` or
            `None`; a saved config with a seed outside that range (DNAS
            and HNAS took any int before 2026-11-25) loads with the seed
            wrapped into it, with a warning.
    """

    supports_causal = True
    # Set on the self-attention layers `convert_backbone` creates: attached
    # terms then leave out padded queries (see `build_context`) even where
    # `self_attention_padding` is off (decoders, whose KV-cache calls have
    # `T != S`).
    _is_self_attention = False

    def __init__(
        self,
        num_heads,
        key_dim,
        attention_losses=None,
        self_attention_padding=False,
        attention_path="auto",
        **kwargs,
    ):
        attention_axes = kwargs.get("attention_axes")
        axes = (
            list(attention_axes)
            if isinstance(attention_axes, (list, tuple))
            else [attention_axes]
        )
        if len(axes) == 1 and is_int(axes[0]) and axes[0] in (1, -2):
            # The sequence axis of the `(B, T, dim)` inputs, also counted
            # from the end (Keras MHA takes -2), as a tuple of Python ints:
            # Keras MHA refused a NumPy 1 with a message that printed `1`.
            kwargs["attention_axes"] = (1,)
        elif attention_axes is not None:
            raise ValueError(
                f"{type(self).__name__} supports attention over one sequence "
                "axis only: `attention_axes` must be None, (1,) or (-2,). "
                f"Received: attention_axes={attention_axes!r}"
            )
        if kwargs.get("flash_attention"):
            # Keras MHA's flag: ignored here (returned scores and dropout
            # then worked, where MHA raises), and with `dropout > 0` MHA's
            # constructor rejected a layer whose dropout works.
            raise ValueError(
                f"{type(self).__name__}: `flash_attention` must be None or "
                "False (its kernel is chosen with `attention_path`: "
                '"auto", "explicit" or "fused"). Received: '
                f"flash_attention={kwargs['flash_attention']!r}"
            )
        if attention_path not in ATTENTION_PATHS:
            raise ValueError(
                f"`attention_path` must be one of {ATTENTION_PATHS}. "
                f"Received: attention_path={attention_path!r}"
            )
        dropout = kwargs.get("dropout", 0.0)
        # Numbers only: a string or None failed with a `TypeError` here.
        if (
            isinstance(dropout, (bool, np.bool_))
            or not isinstance(dropout, numbers.Real)
            or not 0.0 <= dropout < 1.0
        ):
            raise ValueError(
                "`dropout` must be a float in [0, 1). "
                f"Received: dropout={dropout!r}"
            )
        # A Python float, so that the config stays JSON.
        kwargs["dropout"] = float(dropout)
        # It seeds the dropout masks: a seed outside [0, 2**31) failed at the
        # first training call (JAX, PyTorch) or drew another seed's masks
        # (TensorFlow), a NumPy int failed in Keras's `SeedGenerator`.
        kwargs["seed"] = check_seed(kwargs.get("seed"))
        self_attention_padding = check_bool(
            "self_attention_padding", self_attention_padding
        )
        # A term listed twice added its value twice per call (a guidance
        # term failed with a misleading per-layer-map error).
        losses = check_attention_loss_terms(attention_losses)
        num_heads, key_dim = _check_sizes(num_heads, key_dim, kwargs)
        super().__init__(num_heads=num_heads, key_dim=key_dim, **kwargs)
        self.attention_losses = losses
        for term in losses:
            _ATTACHED.setdefault(term, weakref.WeakSet()).add(self)
        self.self_attention_padding = self_attention_padding
        self.attention_path = attention_path
        # The terms' flags of a saved config (`from_config`), put back by
        # `build`.
        self._saved_term_flags = _SavedTermFlags([])

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        warn_misadded_biases(
            (
                self._query_dense,
                self._key_dense,
                self._value_dense,
                self._output_dense,
            )
        )
        key_length = (value_shape if key_shape is None else key_shape)[1]
        for term in self.attention_losses:
            if (
                term.needs_self_attention
                and isinstance(query_shape[1], int)
                and isinstance(key_length, int)
                and query_shape[1] != key_length
            ):
                raise ValueError(
                    f"`attention_losses` holds `{term.name}` "
                    f"({type(term).__name__}), which reads self-attention "
                    "weights (query length == key length). Received: "
                    f"query_shape={tuple(query_shape)}, key length "
                    f"{key_length}"
                )
            term.build_for_attention(self._num_heads, self._key_dim)
        apply_frozen_flag(self)
        for layer, trainable in self._saved_term_flags.flags:
            layer.trainable = trainable
        self._saved_term_flags.flags = []

    def __call__(self, *args, **kwargs):
        # NumPy booleans as Python ones, for the flags' checks (and MHA).
        kwargs = python_scalars(
            kwargs, ("return_attention_scores", "use_causal_mask")
        )
        return super().__call__(*args, **kwargs)

    @property
    def trainable(self):
        return keras.layers.Layer.trainable.fget(self)

    @trainable.setter
    def trainable(self, value):
        """Sets the flag of the layer and its sublayers, as Keras does,
        except that freezing the layer leaves an attached loss term
        trainable while another layer it is attached to still trains: a
        term is usually shared by every attention layer of a model, and
        Keras's recursive setter let freezing one layer (the lower blocks
        of a backbone) freeze a shared adversary for all of them. Freezing
        every layer it is attached to (a whole backbone) freezes it too;
        `term.trainable = False` freezes it alone."""
        terms = getattr(self, "attention_losses", None) or []
        kept = [
            [(layer, layer.trainable) for layer in term._flatten_layers()]
            for term in terms
            if not value
            and any(
                other.trainable
                for other in _ATTACHED.get(term, ())
                if other is not self
            )
        ]
        keras.layers.Layer.trainable.fset(self, value)
        for flags in kept:
            for layer, flag in flags:
                layer.trainable = flag

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
    ):
        # The full MHA signature: Keras fills `*_mask` from input masks only
        # for arguments that `call` names.
        check_attention_inputs(query, value, key)
        self._check_call_masks(
            query, value, key, query_mask, value_mask, key_mask, attention_mask
        )
        check_bool("return_attention_scores", return_attention_scores)
        self._check_causal(use_causal_mask)
        query, value, key = _runtime_shape_checked(query, value, key)
        if query_mask is not None:
            # Keras MHA replaces `query_mask` by the Keras mask of `query`,
            # so one passed by keyword was dropped (padded queries then
            # entered DNAS's column normalization). Merged here instead; a
            # Keras mask, which MHA also applies, is merged twice, harmlessly.
            query_mask = ops.expand_dims(ops.cast(query_mask, "bool"), -1)
            attention_mask = merge_masks(attention_mask, query_mask)
        # Keras MHA (3.15) clears the Keras masks of its input tensors in
        # place, so another layer fed the same tensor (a second attention
        # layer on one embedding, or this one called again) ran unmasked and
        # its real tokens attended padding. They are put back afterwards.
        with keras_masks_restored((query, value, key)):
            return super().call(
                query,
                value,
                key=key,
                query_mask=query_mask,
                value_mask=value_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                use_causal_mask=use_causal_mask,
            )

    def _check_causal(self, use_causal_mask):
        """`ValueError` for `use_causal_mask=True` on a non-causal layer,
        or for a `use_causal_mask` that is not a bool (a string such as
        `"no"` was truthy)."""
        check_bool("use_causal_mask", use_causal_mask)
        if use_causal_mask and not self.supports_causal:
            raise ValueError(
                f"{type(self).__name__} is not causal: "
                f"{self.causal_error_reason} Received: use_causal_mask=True"
            )

    def _check_call_masks(
        self,
        query,
        value,
        key,
        query_mask,
        value_mask,
        key_mask,
        attention_mask,
    ):
        """`ValueError` for a mask argument of the wrong shape.

        Checked before any merge: Keras MHA ANDs the masks together, which
        broadcast a wrong-rank `attention_mask` (e.g. `(B, S)` when
        `B == T`) into a valid-looking `(B, T, S)` one.
        """
        key_or_value = value if key is None else key
        if attention_mask is not None:
            self._check_attention_mask(attention_mask, query, key_or_value)
        check_padding_mask("query_mask", query_mask, query)
        check_padding_mask("value_mask", value_mask, value)
        check_padding_mask("key_mask", key_mask, key_or_value)

    def compute_output_spec(
        self, query, value, key=None, return_attention_scores=False, **kwargs
    ):
        # kwargs: the masks, `training` and `use_causal_mask` of `call`.
        check_attention_inputs(query, value, key)
        self._check_call_masks(
            query,
            value,
            key,
            *(
                kwargs.get(name)
                for name in (
                    "query_mask",
                    "value_mask",
                    "key_mask",
                    "attention_mask",
                )
            ),
        )
        # A functional model was built, and failed only when it ran.
        self._check_causal(kwargs.get("use_causal_mask", False))
        self._build_terms(query, value, key, kwargs)
        output = super().compute_output_spec(
            query, value, key, return_attention_scores=False
        )
        if not return_attention_scores:
            return output
        # Keras MHA reports `(B, N, T, T)`; the scores are `(B, N, T, S)`.
        shape = (query.shape[0], self._num_heads, query.shape[1])
        scores = keras.KerasTensor(
            shape + (value.shape[1],), dtype=self.compute_dtype
        )
        return output, scores

    def _build_terms(self, query, value, key, kwargs):
        """Runs `call` once symbolically when an attached term is unbuilt.

        A term holding a sublayer of its own (a user's `Dense`) builds it
        in its first call; `build_for_attention` cannot, not knowing its
        input shapes. Keras MHA's `compute_output_spec` infers shapes
        without running `call`, so in a functional model such a term stayed
        unbuilt until the first training step: `.keras` files saved before
        it held no weights for it, and a reload refused the file ("could not
        be loaded: Dense name=projection, built=False"). The symbolic call
        runs the unbuilt terms (`_losses_active`) and adds no loss. A frozen
        term freezes the weights built here, which Keras made trainable.
        """

        def call_in_scope(*args, **call_kwargs):
            # This layer's name scope, as in a call (the terms' weights get
            # the paths a first training call gives them), and on
            # TensorFlow its graph scope again inside the scratch graph,
            # whose root scope would otherwise be the term's (`_probe_loss`,
            # a root name TensorFlow refuses; Keras dedups its own scope).
            with self._open_name_scope(), _graph_name_scope(self.name):
                return self.call(*args, **call_kwargs)

        build_unbuilt_terms(
            self.attention_losses,
            lambda: compute_output_spec(
                call_in_scope, query, value, key, **kwargs
            ),
        )

    @property
    def metrics(self):
        """Metrics of this layer and its sublayers, without the attached
        terms' trackers.

        `keras.Model.metrics` visits every nested layer itself and adds each
        one's (recursive) `metrics`, so a term's tracker listed here too
        would be counted once for the term and once more for every attention
        layer it is attached to: a term shared by 6 layers showed 7 times in
        `model.metrics`, and `train_on_batch` reset and synced all 7 (on an
        H100 under JAX, +5 ms on a 17 ms step). The model lists each tracker
        once; read a term's own with `term.metrics`.
        """
        trackers = {
            id(metric)
            for term in self.attention_losses
            for metric in term.metrics
        }
        return [m for m in super().metrics if id(m) not in trackers]

    def normalize(self, scores, mask):
        """Float32 weights `(B, N, T, S)` from float32 scores and a mask."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement `normalize`: "
            "`VariantAttention` is a base class; use one of its subclasses "
            "(e.g. `DoublyNormalizedAttention`) or implement `normalize` "
            "in your own"
        )

    def fused_attention(self, query, key, value, mask):
        """Attention output without materialized weights, or `None`."""
        return None

    def normalize_and_attend(self, scores, value, mask, training):
        """`normalize(scores, mask) @ value` `(B, T, N, H)`, or `None`.

        The explicit path calls this when the weights themselves are not
        needed (no returned scores or attention losses reading them; with
        dropout only where `_folds_dropout()`, taking the multipliers from
        `_dropout_keep(scores, training)`). Subclasses
        return the output of a `keras_attnvariants.ops.combine` function,
        which never writes the normalized weights out and has a cheaper
        backward; `None` falls back to `normalize` and a weighted sum.
        An implementation returns `None` when `_normalize_overridden()`, so
        that a further subclass that changes only `normalize` still gets
        its own weights.
        """
        return None

    def _normalize_overridden(self):
        """Whether a subclass changed `normalize` below the class that
        implements `normalize_and_attend` (e.g. a user subclass of
        `DoublyNormalizedAttention`): the folded path would bypass it."""
        return self._overridden_below("normalize_and_attend", ("normalize",))

    def _overridden_below(self, implementer, methods):
        """Whether a subclass changed one of `methods` below the class
        that defines the method `implementer`."""
        owner = next(
            cls for cls in type(self).__mro__ if implementer in vars(cls)
        )
        return any(
            getattr(type(self), name) is not getattr(owner, name)
            for name in methods
        )

    def attention_logits(self, query, key):
        """float32 scores `(B, N, T, S)` (float64 under a float64 policy),
        scaled like Keras MHA.

        float16 would overflow at logits above 65504, so under float16 the
        product runs in float32; bfloat16 and float32 run natively. The
        einsum is written query-first in the `(B, N, T, S)` layout of
        `keras.ops.dot_product_attention`: with MHA's own equation
        (`"aecd,abcd->acbe"`, key first) the TensorFlow backend lowers it
        through extra transposes, and a train step measured 1.08-1.23x of
        keras MHA with plain softmax instead of 1.01x (docs/benchmarks.md).
        """
        if keras.backend.standardize_dtype(query.dtype) == "float16":
            query = ops.cast(query, "float32")
            key = ops.cast(key, "float32")
        scaled_query = ops.multiply(
            query, ops.cast(self._inverse_sqrt_key_dim, query.dtype)
        )
        scores = ops.einsum(LOGITS_EQUATION, scaled_query, key)
        return ops.cast(scores, math_dtype(scores.dtype))

    def _check_attention_mask(self, mask, query, key):
        shape = static_shape(mask)
        if shape is None:  # an unknown rank
            return
        expected = (query.shape[0], query.shape[1], key.shape[1])
        # Only sizes known as ints are compared: JAX's shape-polymorphic
        # export (`model.export`) traces with symbolic sizes, and `b == a`
        # is False for two symbols that the caller's data will make equal.
        if len(shape) != 3 or any(
            isinstance(got, int)
            and isinstance(want, int)
            and got not in (1, want)
            for got, want in zip(shape, expected)
        ):
            raise ValueError(
                "`attention_mask` must be a rank-3 boolean tensor "
                "broadcastable to (batch, query_length, key_length) = "
                f"{expected}: for one mask shared by the batch pass "
                "`mask[None]`, for a `(batch, key_length)` padding mask "
                "`mask[:, None, :]` or `value_mask` (a rank-2 mask is "
                "refused: Keras MHA reads it as (query_length, key_length), "
                "which a padding mask also is when batch == query_length). "
                f"Received: attention_mask with shape {shape}"
            )

    def _prepare_mask(self, attention_mask, query, key):
        """Validated `(B, 1, T, S)` boolean mask, or `None`."""
        if attention_mask is None:
            return None
        self._check_attention_mask(attention_mask, query, key)
        mask = ops.cast(attention_mask, "bool")
        if self.self_attention_padding:
            if query.shape[1] != key.shape[1]:
                raise ValueError(
                    "`self_attention_padding=True` needs self-attention "
                    "(query_length == key_length). Received: query_length="
                    f"{query.shape[1]}, key_length={key.shape[1]}"
                )
            mask = self_attention_padding_mask(mask)
        return ops.expand_dims(mask, axis=1)

    def _use_fused(self, need_weights):
        if need_weights or self.attention_path == "explicit":
            return False
        # A fused kernel computes its class's own logits and weights: a
        # subclass that changes `normalize` or `attention_logits` (and not
        # `fused_attention`) got them only where the weights were
        # materialized, plain inference on PyTorch ran the parent's.
        if self._overridden_below(
            "fused_attention", ("normalize", "attention_logits")
        ):
            return False
        if self.attention_path == "fused":
            return True
        return prefer_fused_path()

    def _merge_causal_mask(self, attention_mask, query, value, causal):
        if not causal:
            return attention_mask
        causal_mask = self._compute_causal_mask(query, value)
        if attention_mask is None:
            return causal_mask
        return ops.logical_and(ops.cast(attention_mask, "bool"), causal_mask)

    def _losses_active(self, training):
        """Whether the attached terms run in this call.

        They run in training, and once symbolically so that their own
        weights exist before the optimizer is built (variables created
        inside a distributed train step are rejected).
        """
        if not self.attention_losses:
            return False
        building = in_symbolic_scope() and not all(
            term.built for term in self.attention_losses
        )
        return bool(training) or building

    def _need_weights(self, return_attention_scores, with_losses, training):
        """Whether this call must materialize the attention weights."""
        return bool(
            return_attention_scores
            or (
                with_losses
                and any(
                    term.needs_attention_weights
                    for term in self.attention_losses
                )
            )
            or (self._dropping(training) and not self._folds_dropout())
        )

    def _dropping(self, training):
        """Whether attention dropout applies to this call."""
        return self._dropout > 0.0 and bool(training)

    def _folds_dropout(self):
        """Whether `normalize_and_attend` takes dropout itself (through
        `_dropout_keep`), so that dropout needs no materialized weights.
        Where it then returns `None`, the materialized path drops."""
        return False

    def _dropout_keep(self, scores, training):
        """float32 dropout multipliers shaped like `scores`, or `None`.

        The mask `_attend` would draw for weights of this shape (same
        generator, same positional hash).
        """
        if not self._dropping(training):
            return None
        return dropout_multipliers(
            ops.shape(scores),
            self._dropout,
            self._dropout_layer.seed_generator,
        )

    def _apply_attention_losses(self, weights, query, key, mask):
        self._check_shared_terms_in_one_call()
        context = build_context(
            self,
            weights,
            query,
            key,
            None if mask is None else mask[:, 0],
            self_attention=self._is_self_attention,
        )
        for term in self.attention_losses:
            term.from_attention(context)

    def _check_shared_terms_in_one_call(self):
        """Warns when this layer starts its own call context in training
        while a term is shared with other attention layers.

        Keras clears a layer's losses, the shared term's included, each
        time a top-level call starts: attention layers called one by one
        (in a `torch.nn.Module`, or under JAX's `stateless_call` without
        `return_losses=True`) kept only the last layer's term loss, and a
        guidance term counted every such call as a new step and gave each
        layer the map of layer 0. The JAX trainer's scope, which collects
        the losses, is fine. A warning, not an error: separate top-level
        calls that are separate steps are right.
        """
        if in_symbolic_scope():
            return
        context = global_state.get_global_attribute("current_call_ctx")
        if context is None or context.entry_layer is not self:
            return
        scope = get_stateless_scope()
        if scope is not None and scope.collect_losses:
            return
        for term in self.attention_losses:
            others = [
                layer for layer in _ATTACHED.get(term, ()) if layer is not self
            ]
            if others:
                warnings.warn(
                    f"`{self.name}` was called at the top level (not inside "
                    f"a Keras model or layer) in training, and its term "
                    f"`{term.name}` is shared with "
                    f"{[layer.name for layer in others]}: Keras clears a "
                    "shared term's losses at every top-level call, so if "
                    "these calls make one training step, only the last "
                    "layer's loss counts (and guidance advances its step "
                    "once per call). Call the attention layers inside one "
                    "`keras.Model` or `keras.layers.Layer` (under JAX's "
                    "`stateless_call`, pass `return_losses=True`). A layer "
                    "dropped but not yet garbage-collected counts as "
                    "sharing it until `gc.collect()`.",
                    stacklevel=2,
                )
                return

    def _attend(self, weights, value, training):
        """Output `(B, T, N, H)` and the weights in the compute dtype."""
        weights = ops.cast(weights, self.compute_dtype)
        final_weights = weights
        if self._dropping(training):
            # MHA's own dropout layer draws from `keras.random`: a new mask
            # everywhere when the padding changes. Same rate and generator
            # (no new variables), with a mask hashed from each entry's index.
            final_weights = positional_dropout(
                weights, self._dropout, self._dropout_layer.seed_generator
            )
        output = ops.einsum(COMBINE_EQUATION, final_weights, value)
        return output, weights

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        attention_mask = self._merge_causal_mask(
            attention_mask, query, value, use_causal_mask
        )
        # mask: (B, 1, T, S) or None
        mask = self._prepare_mask(attention_mask, query, key)
        with_losses = self._losses_active(training)
        need_weights = self._need_weights(
            return_attention_scores, with_losses, training
        )
        output = None
        # The fused kernels take no dropout.
        if self._use_fused(need_weights or self._dropping(training)):
            output = self.fused_attention(query, key, value, mask)
        if output is None:
            # scores, weights: (B, N, T, S) float32
            scores = self.attention_logits(query, key)
            if not need_weights:
                output = self.normalize_and_attend(
                    scores, value, mask, training
                )
        if output is not None:
            if with_losses:
                # Terms that read only the queries and keys.
                self._apply_attention_losses(None, query, key, mask)
            return output, None
        weights = self.normalize(scores, mask)
        if with_losses:
            self._apply_attention_losses(weights, query, key, mask)
        return self._attend(weights, value, training)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "attention_losses": [
                    serialize_attention_loss(term)
                    for term in self.attention_losses
                ],
                "self_attention_padding": self.self_attention_padding,
                "attention_path": self.attention_path,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        seed = config.get("seed")
        if is_int(seed) and not 0 <= seed < SEED_LIMIT:
            # Saved before seeds were checked (DNAS and HNAS took any int on
            # TensorFlow): loaded with the seed wrapped into range, as
            # `convert_backbone` wraps per-layer seeds.
            warnings.warn(
                f"{cls.__name__}: seed={seed} in a saved config is outside "
                f"[0, 2**31); loading it with seed={seed % SEED_LIMIT}. Its "
                "dropout masks differ from those it was trained with.",
                stacklevel=2,
            )
            config["seed"] = seed % SEED_LIMIT
        config["attention_losses"] = [
            keras.saving.deserialize_keras_object(term)
            for term in config.get("attention_losses") or []
        ]
        layer = super().from_config(config)
        # The terms' flags as saved: a frozen layer's `build` freezes a
        # term attached only to it, and a term the user kept trainable
        # (`term.trainable = True` after freezing the layer) came back
        # frozen.
        layer._saved_term_flags.flags = term_flags(config["attention_losses"])
        return layer
