"""`convert_backbone`: keras-hub backbones with this package's attention.

A converted backbone is rebuilt from the original's configuration, then the
self-attention layer of every `keras_hub.layers.TransformerEncoder` and
`TransformerDecoder` it holds is replaced by the chosen attention class, and
every weight of the original is copied over by variable path.

Why a subclass. keras-hub backbones rebuild themselves from their config
(`cls(**config)`), so a `.keras` file of a plain `BertBackbone` always
reloads standard attention. The converted backbone is therefore an instance
of a generated subclass of the original class (`isinstance` holds, the class
name is the same) that adds one config entry, `attention_config`, and
re-applies the conversion in `__init__`. All generated classes serialize
under the registered name `keras_attnvariants>ConvertedBackbone`, whose
`from_config` finds the keras-hub base class from the config, so a `.keras`
file reloads in a fresh process after `import keras_attnvariants.backbones`.

This module imports keras_hub only inside its functions: importing it costs
nothing and works without keras-hub installed.
"""

import contextlib
import functools
import importlib
import inspect
import sys

import keras
from keras import ops
from keras.src.backend import compute_output_spec
from keras.src.backend.common.name_scope import current_path
from keras.src.saving import serialization_lib

from keras_attnvariants.layers.variant_attention import VariantAttention
from keras_attnvariants.layers.variant_attention import apply_frozen_flag
from keras_attnvariants.layers.variant_attention import build_unbuilt_terms
from keras_attnvariants.losses.attention_loss import check_attention_loss_terms
from keras_attnvariants.losses.attention_loss import term_flags
from keras_attnvariants.losses.attention_loss import token_ids_scope
from keras_attnvariants.validation import check_bool
from keras_attnvariants.validation import check_seed
from keras_attnvariants.validation import is_int
from keras_attnvariants.validation import layer_seed

INSTALL_HINT = "pip install 'keras-attnvariants[keras-hub]'"

# MultiHeadAttention's projections: weights every attention class must take.
_PROJECTIONS = ("_query_dense", "_key_dense", "_value_dense", "_output_dense")


def import_keras_hub():
    """Imports keras_hub, or raises `ImportError` saying how to install it."""
    try:
        import keras_hub
    except ImportError as error:
        raise ImportError(
            "Converting keras-hub backbones needs the optional keras-hub "
            f"extra. Install it with: {INSTALL_HINT}"
        ) from error
    return keras_hub


def transformer_blocks(backbone):
    """The distinct keras-hub transformer blocks of `backbone`, in order.

    A block shared by several depths (ALBERT's layer groups) appears once.
    """
    keras_hub = import_keras_hub()
    if not isinstance(backbone, keras.layers.Layer):
        # None failed with an AttributeError on `_flatten_layers`.
        raise ValueError(
            "`backbone` must be a keras-hub backbone (a "
            "`keras_hub.models.Backbone` such as `BertBackbone`). "
            f"Received: backbone={backbone!r}"
        )
    block_classes = (
        keras_hub.layers.TransformerEncoder,
        keras_hub.layers.TransformerDecoder,
    )
    return [
        layer
        for layer in backbone._flatten_layers(include_self=False)
        if isinstance(layer, block_classes)
    ]


def self_attention_layers(backbone):
    """The distinct self-attention layers of `backbone`'s blocks, in order.

    Raises `ValueError` if `backbone` holds no keras-hub transformer block,
    or a block that keeps its self-attention elsewhere (Moonshine's).
    """
    layers = []
    for block in _checked_blocks(backbone):
        layer = getattr(block, "_self_attention_layer", None)
        if not isinstance(layer, keras.layers.MultiHeadAttention):
            raise ValueError(_unsupported_block_message(backbone, block))
        layers.append(layer)
    return layers


def _unsupported_block_message(backbone, block):
    layer = getattr(block, "_self_attention_layer", None)
    what = (
        "keeps no `_self_attention_layer`"
        if layer is None
        else f"has a {type(layer).__name__} self-attention"
    )
    return (
        f"`backbone` holds a {type(block).__name__} block ({block.name}) that "
        f"{what}. Only blocks whose self-attention is keras-hub's standard "
        "`keras.layers.MultiHeadAttention` or "
        "`keras_hub.layers.CachedMultiHeadAttention` are supported: a "
        "model-specific attention (Whisper's key projection without bias, "
        "Moonshine's rotary attention) would be lost. Received: backbone of "
        f"class {type(backbone).__name__}"
    )


def _check_attention_class(attention_class):
    if not (
        isinstance(attention_class, type)
        and issubclass(attention_class, keras.layers.MultiHeadAttention)
    ):
        raise ValueError(
            "`attention_class` must be a subclass of "
            "`keras.layers.MultiHeadAttention` (any attention of "
            "keras_attnvariants, or your own). "
            f"Received: attention_class={attention_class!r}"
        )
    if attention_class is VariantAttention:
        # The base class has no normalization: it failed only at the
        # first forward pass.
        raise ValueError(
            "`attention_class` must be a concrete attention: "
            "`VariantAttention` is the base class of this package's "
            "layers (subclass it and implement `normalize`). Received: "
            "attention_class=VariantAttention"
        )


# MultiHeadAttention arguments that set the shapes (or the presence) of
# the projection weights the converted layers take over.
_WEIGHT_SHAPE_ARGUMENTS = (
    "num_heads",
    "key_dim",
    "value_dim",
    "use_bias",
    "output_shape",
)
_WEIGHT_PRESENCE_ARGUMENTS = ("use_gate",)


def _output_dims(output_shape):
    """`output_shape` as MultiHeadAttention's trailing output dims (a
    tuple), or None for the query's last dimension; `ValueError` naming
    it otherwise."""
    if output_shape is None:
        return None
    if is_int(output_shape):
        return (int(output_shape),)
    if isinstance(output_shape, (tuple, list)) and all(
        is_int(dim) for dim in output_shape
    ):
        return tuple(int(dim) for dim in output_shape)
    raise ValueError(
        "`output_shape` must be None, an int or a tuple of ints (the "
        "output's trailing dimensions). "
        f"Received: output_shape={output_shape!r}"
    )


def _check_weight_shape_kwargs(backbone, attention_kwargs):
    """`ValueError` naming the first attention argument that would give
    the converted layers weights of other shapes than the backbone's (the
    copy by path then failed on a variable, naming no argument)."""
    names = _WEIGHT_SHAPE_ARGUMENTS + _WEIGHT_PRESENCE_ARGUMENTS
    if not any(name in attention_kwargs for name in names):
        return
    for layer in self_attention_layers(backbone):
        old = layer.get_config()
        new = dict(old)
        new.update({k: v for k, v in attention_kwargs.items() if k in old})
        # The output projection's trailing dims: None (the query's last
        # dimension, the backbone's hidden size) keeps them; another size
        # failed on a variable's shape, naming no argument.
        output_dims = tuple(layer._output_dense.kernel.shape[2:])
        for config in (old, new):
            # MultiHeadAttention's default: values as wide as keys.
            if "value_dim" in config and not config["value_dim"]:
                config["value_dim"] = config["key_dim"]
            if "output_shape" in config:
                dims = _output_dims(config["output_shape"])
                config["output_shape"] = output_dims if dims is None else dims
        for name in names:
            if name not in old or new[name] == old[name]:
                continue
            given = name if name in attention_kwargs else "key_dim"
            raise ValueError(
                f"`{given}` must match the self-attention of the backbone, "
                "whose weights the converted layers take over "
                f"({name}={old[name]!r} in {layer.path!r}); leave it out "
                "to keep the backbone's. "
                f"Received: {given}={attention_kwargs[given]!r}"
            )


def _class_reference(cls):
    """A serializable reference to a class: registered name and module."""
    return {
        "registered_name": keras.saving.get_registered_name(cls),
        "module": cls.__module__,
        "class_name": cls.__qualname__,
    }


# The packages whose modules a saved config may make `_resolve_class`
# import under `safe_mode=True`: those Keras 3.15 imports from (less
# keras_cv, which holds no backbone or attention class) and this one.
_SAFE_MODE_PACKAGES = ("keras", "keras_hub", "keras_nlp", "keras_attnvariants")


def _resolve_class(reference, argument, expected, expected_name):
    """The class a `_class_reference` names, a subclass of `expected`.

    A class that is not registered (nor in `custom_objects`) is imported
    from its module. Under `safe_mode=True` (Keras's default for
    `load_model` and `deserialize_keras_object`) only modules of
    `_SAFE_MODE_PACKAGES` are imported: a `.keras` file could otherwise run
    any installed module's import-time code, which Keras itself refuses
    since CVE-2025-1550. Outside any deserialization scope (a direct
    `from_config`, as `first_layers` and cloning do) a module this process
    has already imported is accepted too: importing it runs nothing.
    `argument` names the config entry and `expected_name` the base class
    in the errors.
    """
    cls = keras.saving.get_registered_object(reference["registered_name"])
    module = reference["module"]
    if cls is None and module != "__main__":
        safe_mode = serialization_lib.in_safe_mode()
        if module.split(".", maxsplit=1)[0] not in _SAFE_MODE_PACKAGES and (
            safe_mode or (safe_mode is None and module not in sys.modules)
        ):
            raise ValueError(
                f"Refusing to import the module {module!r} named by "
                f"`{argument}` of a converted backbone in safe mode: only "
                "keras, keras_hub, keras_nlp and keras_attnvariants modules "
                "are imported from a saved file. Register the class with "
                "`@keras.saving.register_keras_serializable()` and import "
                "it before loading (or pass it in `custom_objects`), or, if "
                "you trust the file, load it with `safe_mode=False` (or "
                "call `keras.config.enable_unsafe_deserialization()`). "
                f"Received: {argument}={reference!r}"
            )
        cls = getattr(
            importlib.import_module(module), reference["class_name"], None
        )
    if cls is None:
        raise ValueError(
            "Cannot find the class "
            f"{reference['module']}.{reference['class_name']} needed to "
            "rebuild a converted backbone. Register it with "
            "`@keras.saving.register_keras_serializable()` and import it "
            f"before loading. Received: {argument}={reference!r}"
        )
    if not (isinstance(cls, type) and issubclass(cls, expected)):
        raise ValueError(
            f"`{argument}` of a converted backbone must name a subclass of "
            f"`{expected_name}`. Received: {argument}={reference!r} "
            f"(resolved to {cls!r})"
        )
    return cls


@functools.cache
def cached_attention_class(attention_class):
    """`attention_class` with keras-hub's KV-cache call signature.

    keras-hub decoders call their self-attention with `cache` and
    `cache_update_index`. The returned class takes `call` from
    `keras_hub.layers.CachedMultiHeadAttention` and everything else
    (`__init__`, `build`, `_compute_attention`, `get_config`) from
    `attention_class`.
    """
    keras_hub = import_keras_hub()
    cached = keras_hub.layers.CachedMultiHeadAttention
    if issubclass(attention_class, cached):
        return attention_class
    return type(
        f"Cached{attention_class.__name__}",
        (cached, attention_class),
        {"__module__": __name__},
    )


def _check_decoder_class(attention_class):
    if not getattr(attention_class, "supports_causal", True):
        raise ValueError(
            f"{attention_class.__name__} cannot replace the self-attention "
            "of a decoder (keras_hub.layers.TransformerDecoder): decoders "
            "attend causally, and "
            f"{attention_class.__name__} is not causal: "
            f"{getattr(attention_class, 'causal_error_reason', '')} "
            "Use a causal attention class for decoder backbones. "
            f"Received: attention_class={attention_class.__name__}"
        )
    own_call = attention_class.call
    if own_call not in (
        keras.layers.MultiHeadAttention.call,
        VariantAttention.call,
        import_keras_hub().layers.CachedMultiHeadAttention.call,
    ):
        raise ValueError(
            "In a decoder, the self-attention is called through keras-hub's "
            "cached call path, which keeps only `_compute_attention` of the "
            f"attention class; {attention_class.__name__} overrides `call`, "
            "which would be skipped. Override `_compute_attention` instead. "
            f"Received: attention_class={attention_class.__name__}"
        )


def scope_prefix(model):
    """The name scope `model`'s layers were built in, as the start of their
    paths: `"outer/"` for a backbone built in `keras.name_scope("outer")`
    (or in a layer's `build`, which Keras runs in the layer's scope), `""`
    outside any. Weights are matched by their paths below it."""
    for layer in model.layers:
        path = layer.path
        if path is not None and path.endswith(layer.name):
            return path[: len(path) - len(layer.name)]
    return ""


def relative_path(obj, prefix):
    """The path of a layer or variable below `prefix` (`scope_prefix`)."""
    path = obj.path
    if path is not None and path.startswith(prefix):
        return path[len(prefix) :]
    return path


def relative_paths(objects, model):
    """`{path below scope_prefix(model): obj}` for layers or variables."""
    prefix = scope_prefix(model)
    return {
        relative_path(obj, prefix): obj
        for obj in objects
        if obj.path is not None
    }


@contextlib.contextmanager
def _path_scope(path):
    """Name scopes reproducing a layer path, so variable paths match.

    `path` starts with the name scope open now when the layer was built in
    it (a conversion in a scope): only the part below it is entered, which
    gave `outer/outer/...` paths before."""
    current = current_path()
    if current and path.startswith(current + "/"):
        path = path[len(current) + 1 :]
    with contextlib.ExitStack() as stack:
        for part in path.split("/"):
            stack.enter_context(keras.name_scope(part))
        yield


def _replace_self_attention(block, attention_class, attention_kwargs):
    """Swaps `block`'s self-attention for a new, built `attention_class`."""
    keras_hub = import_keras_hub()
    is_decoder = isinstance(block, keras_hub.layers.TransformerDecoder)
    old = block._self_attention_layer
    config = old.get_config()
    for key in ("name", "dtype", "trainable"):
        config.pop(key, None)
    if not is_decoder and issubclass(attention_class, VariantAttention):
        # keras-hub encoders mask keys only; keep padded queries out of the
        # normalizations over queries (DNAS, HNAS).
        config["self_attention_padding"] = True
    config.update(attention_kwargs)
    # Built trainable, frozen after `build` (below): `trainable=False` in
    # the constructor freezes neither the variables nor the sublayers
    # `build` creates, and TensorFlow skips assigning a layer the flag it
    # already has, so the later assignment froze nothing there.
    trainable = config.pop("trainable", old.trainable)
    layer_class = attention_class
    if is_decoder:
        _check_decoder_class(attention_class)
        layer_class = cached_attention_class(attention_class)
    new = layer_class(name=old.name, dtype=old.dtype_policy, **config)
    if isinstance(new, VariantAttention):
        new._is_self_attention = True
    query_dim = old._query_dense.kernel.shape[0]
    key_dim = old._key_dense.kernel.shape[0]
    value_dim = old._value_dense.kernel.shape[0]
    with _path_scope(block.path):
        new.build(
            query_shape=(None, None, query_dim),
            value_shape=(None, None, value_dim),
            key_shape=(None, None, key_dim),
        )
    # Frozen like `old`, or as `trainable` says (attached terms keep
    # their own flags: `VariantAttention.trainable`).
    new.trainable = trainable
    # Untrack the old layer so its variables leave the block.
    place = _tracked_index(block, old)
    block._tracker.unlock()
    block._tracker.untrack(old)
    block._self_attention_layer = new
    block._tracker.lock()
    # keras-hub's config of the block does not record the new attention: a
    # model built on the backbone's own graph (`keras.Model(backbone.input,
    # backbone.output[...])`) was rebuilt from it with stock MHA on a
    # `.keras` reload (DNAS silently; HNAS and Gumbel then failed to load
    # their extra variable). The backbone's own config is the
    # constructor's, which never asks its blocks.
    object.__setattr__(
        block, "get_config", functools.partial(_refuse_block_config, block)
    )
    # In the old one's place among the block's sublayers: appended last,
    # it moved its variables after the layer norms and the feedforward's in
    # `weights`, and `set_weights(original.get_weights())` failed.
    if place is not None and _tracked_index(block, new) is not None:
        block._layers.remove(new)
        block._layers.insert(place, new)


def _refuse_block_config(block):
    """`get_config` of a block whose self-attention was converted."""
    raise ValueError(
        f"The {type(block).__name__} {block.name!r} holds a converted "
        f"{type(block._self_attention_layer).__name__}, which keras-hub's "
        "config of the block does not record: a model rebuilt from it "
        "(`.keras` reload, `Model.from_config`, `clone_model`) would get "
        "stock attention. Build the model on the converted backbone called "
        "as a layer, `outputs = backbone(inputs)`, not on `backbone.input` / "
        "`backbone.output`: its config then holds the conversion."
    )


def _tracked_index(block, layer):
    """`layer`'s index among `block`'s tracked sublayers, or None."""
    for index, tracked in enumerate(getattr(block, "_layers", ())):
        if tracked is layer:
            return index
    return None


def convert_in_place(backbone, attention_class, attention_kwargs):
    """Replaces the self-attention of every block of a freshly built backbone.

    Args:
        backbone: a keras-hub backbone whose blocks hold keras-hub's own
            attention layers.
        attention_class: subclass of `keras.layers.MultiHeadAttention`.
        attention_kwargs: dict of constructor arguments.
    """
    _check_attention_class(attention_class)
    keras_hub = import_keras_hub()
    stock = (
        keras.layers.MultiHeadAttention,
        keras_hub.layers.CachedMultiHeadAttention,
    )
    blocks = _checked_blocks(backbone)
    for block in blocks:
        if type(getattr(block, "_self_attention_layer", None)) not in stock:
            raise ValueError(_unsupported_block_message(backbone, block))
    seed = attention_kwargs.get("seed")
    for i, block in enumerate(blocks):
        kwargs = attention_kwargs
        if is_int(seed):
            # One seed per layer: with one seed for all, every layer drew
            # the same dropout masks and the same Gumbel noise. A Python
            # int: Keras's dropout `SeedGenerator` rejects a NumPy one.
            kwargs = dict(attention_kwargs, seed=layer_seed(int(seed), i))
        _replace_self_attention(block, attention_class, kwargs)


def _checked_blocks(backbone):
    """`transformer_blocks(backbone)`, raising if there is none."""
    blocks = transformer_blocks(backbone)
    if not blocks:
        raise ValueError(
            "`backbone` holds no `keras_hub.layers.TransformerEncoder` or "
            "`TransformerDecoder` block whose self-attention could be "
            "replaced. Supported: BertBackbone, RobertaBackbone, "
            "AlbertBackbone, DistilBertBackbone, ElectraBackbone, "
            "GPT2Backbone and other backbones built from these blocks. "
            f"Received: backbone of class {type(backbone).__name__}"
        )
    return blocks


def _live(value):
    """A constructor argument, deserialized if it is a serialized object.

    A serialized object is rebuilt unbuilt (its `build_config` dropped):
    an attached loss term is then built by the first converted attention
    layer, under that layer's path, as in `convert_backbone`. Built from
    its `build_config` at the top level, a term with weights (the
    `KQAlignment` adversary) had other variable paths after `from_config`
    or a `.keras` reload (`kq_alignment/...` instead of
    `transformer_layer_0/self_attention_layer/kq_alignment/...`), and
    `first_layers` of a converted backbone raised `KeyError`.
    """
    if isinstance(value, (list, tuple)):
        return [_live(item) for item in value]
    if isinstance(value, dict) and "class_name" in value:
        value = {k: v for k, v in value.items() if k != "build_config"}
        return keras.saving.deserialize_keras_object(value)
    return value


def _build_terms(backbone, attention_losses):
    """Builds the attached terms that their attention layers' `build` left
    unbuilt (a user term holding a `Dense` of its own), by one symbolic
    call of `backbone`.

    `build_for_attention` cannot build a term's sublayers, whose input
    shapes only a call shows. A symbolic call runs the unbuilt terms
    (`VariantAttention._losses_active`) on the contexts, token ids
    included, of a real forward pass, and adds no loss. Built only at
    their first training step before, such a term's weights did not exist
    when a `.keras` file was loaded into the rebuilt backbone: Keras
    skipped them without an error, and they trained again from a new
    initialization. A frozen term freezes the weights built here (created
    trainable, they trained).
    """

    def run():
        # Two examples of two tokens: with unknown sizes the position
        # embeddings failed on JAX and PyTorch (a length over
        # `max_sequence_length` could not be ruled out).
        inputs = keras.tree.map_structure(
            lambda x: keras.KerasTensor(
                tuple(2 if dim is None else dim for dim in x.shape), x.dtype
            ),
            backbone.input,
        )
        compute_output_spec(backbone.call, inputs)

    build_unbuilt_terms(attention_losses, run)


class _LiveAttention:
    """A converted backbone's attention class and kwargs (live objects)."""

    def __init__(self, attention_class, attention_kwargs):
        self.attention_class = attention_class
        self.attention_kwargs = attention_kwargs

    def config(self):
        return {
            "attention_class": _class_reference(self.attention_class),
            "attention_kwargs": {
                key: keras.saving.serialize_keras_object(value)
                for key, value in self.attention_kwargs.items()
            },
        }


class ConvertedBackbone:
    """Mixin of converted backbones; also their deserialization entry point.

    `convert_backbone` returns an instance of
    `converted_class(type(original))`, a subclass of both this mixin and the
    original keras-hub backbone class. The mixin:

    - takes one extra constructor argument, `attention_config` (the
      attention class, or its serialized reference, and its kwargs), and
      converts the freshly built backbone in `__init__` (so `from_config`
      and `.keras` reloads rebuild the variant);
    - opens a `token_ids_scope` around the forward pass with the
      `"token_ids"` input, so attached attention losses that need token ids
      (attention guidance `[Delim]`, `[Period]`) receive them.
    """

    def __init__(self, *args, attention_config=None, **kwargs):
        if attention_config is None:
            # Keras's `clone_model` calls a Functional subclass whose
            # constructor takes `*args, **kwargs` as `cls(inputs, outputs)`,
            # after rebuilding every layer from its own config: keras-hub's
            # blocks then hold stock attention again.
            raise ValueError(
                "A converted backbone is built with `attention_config`. "
                "`keras.models.clone_model` rebuilds each block from "
                "keras-hub's config, which would drop the converted "
                "attention; clone it with "
                "`type(backbone).from_config(backbone.get_config())` and "
                "`clone.set_weights(backbone.get_weights())` instead "
                "(`clone_model` of a task model holding the backbone does "
                "this itself)."
            )
        super().__init__(*args, **kwargs)
        attention_class = attention_config["attention_class"]
        if not isinstance(attention_class, type):
            attention_class = _resolve_class(
                attention_class,
                "attention_class",
                keras.layers.MultiHeadAttention,
                "keras.layers.MultiHeadAttention",
            )
        attention_kwargs = {
            key: _live(value)
            for key, value in attention_config["attention_kwargs"].items()
        }
        # The terms' flags as saved: the conversion's own `trainable`
        # assignments (each converted layer takes its block's flag) thawed
        # a frozen term on JAX and PyTorch.
        flags = term_flags(attention_kwargs.get("attention_losses"))
        convert_in_place(self, attention_class, attention_kwargs)
        for layer, trainable in flags:
            layer.trainable = trainable
        _build_terms(self, attention_kwargs.get("attention_losses"))
        # The live kwargs, serialized when a config is asked for: a term
        # frozen (or otherwise changed) after the conversion was saved as
        # it was at conversion time, and came back trainable. Held in a
        # plain object, which Keras does not track: the terms are not
        # sublayers of the backbone itself.
        self._live_attention = _LiveAttention(attention_class, attention_kwargs)

    @property
    def attention_config(self):
        """The attention class reference and its kwargs, serialized now."""
        return self._live_attention.config()

    def call(self, inputs, training=None, mask=None, **kwargs):
        # Named `training` and `mask`: Keras passes them only to a `call`
        # that declares them.
        token_ids = None
        if isinstance(inputs, dict):
            token_ids = inputs.get("token_ids")
        with token_ids_scope(token_ids):
            return super().call(inputs, training=training, mask=mask, **kwargs)

    def get_config(self):
        config = super().get_config()
        config["attention_config"] = self.attention_config
        config["base_class"] = _class_reference(original_class(type(self)))
        return config

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Loads a converted backbone saved with `save_to_preset`.

        keras-hub's own `Backbone.from_preset` finds a preset's class by its
        registered name, which every converted class shares, and refuses
        the mixin it finds ("Call `from_preset` directly on
        `ConvertedBackbone`"): this is that call. Called on a converted
        class (`type(backbone).from_preset`), the preset must hold that
        keras-hub class.

        Args:
            preset: a local preset directory written by `save_to_preset` of
                a converted backbone (or of a task holding one).
            load_weights: whether to load the saved weights. Defaults to
                `True`.
            **kwargs: backbone arguments keras-hub's `from_preset` forwards
                (e.g. `dtype`).

        Returns:
            The converted backbone, with its attention class, attached
            terms and their weights.
        """
        keras_hub = import_keras_hub()
        # keras-hub checks the class it finds against the calling class:
        # the mixin always passes, whichever converted class is registered
        # last in this process.
        backbone = keras_hub.models.Backbone.from_preset.__func__(
            ConvertedBackbone, preset, load_weights=load_weights, **kwargs
        )
        if not isinstance(backbone, cls):
            raise ValueError(
                f"The preset holds a converted "
                f"`{original_class(type(backbone)).__name__}`, not a "
                f"`{original_class(cls).__name__}`: load it with "
                "`keras_attnvariants.backbones.ConvertedBackbone"
                f".from_preset`. Received: preset={preset!r}"
            )
        return backbone

    @classmethod
    def from_config(cls, config):
        keras_hub = import_keras_hub()
        config = dict(config)
        base = _resolve_class(
            config.pop("base_class"),
            "base_class",
            keras_hub.models.Backbone,
            "keras_hub.models.Backbone",
        )
        converted = converted_class(base)
        # keras-hub's `Backbone.from_config`, with the converted class.
        return base.from_config.__func__(converted, config)


ConvertedBackbone = keras.saving.register_keras_serializable(
    package="keras_attnvariants", name="ConvertedBackbone"
)(ConvertedBackbone)


@functools.cache
def converted_class(backbone_class):
    """The subclass of `backbone_class` that holds converted attention."""
    converted = type(
        backbone_class.__name__,
        (ConvertedBackbone, backbone_class),
        {
            "__module__": __name__,
            "__qualname__": backbone_class.__qualname__,
            "__doc__": (
                f"`{backbone_class.__name__}` with converted self-attention "
                "(see `keras_attnvariants.convert_backbone`)."
            ),
        },
    )
    # Every generated class serializes under the mixin's registered name;
    # its `from_config` dispatches on the stored base class.
    return keras.saving.register_keras_serializable(
        package="keras_attnvariants", name="ConvertedBackbone"
    )(converted)


def original_class(backbone_class):
    """The keras-hub class under a converted class (or the class itself)."""
    if issubclass(backbone_class, ConvertedBackbone):
        for base in backbone_class.__mro__[1:]:
            if not issubclass(base, ConvertedBackbone):
                return base
    return backbone_class


def _attention_extra_variables(backbone):
    """ids of attention variables beyond MultiHeadAttention's projections."""
    extra = set()
    for layer in self_attention_layers(backbone):
        projections = {
            id(v)
            for name in _PROJECTIONS
            if getattr(layer, name, None) is not None
            for v in getattr(layer, name).weights
        }
        extra.update(id(v) for v in layer.weights if id(v) not in projections)
    return extra


def _by_path(model, what):
    table = relative_paths(model.weights, model)
    if len(table) < len(model.weights):
        paths = [variable.path for variable in model.weights]
        twice = sorted({path for path in paths if paths.count(path) > 1})
        raise ValueError(
            f"Two variables of the {what} backbone share a path "
            f"({twice}); weights cannot be carried over by name."
        )
    return table


def copy_weights_by_path(source, target):
    """Assigns every variable of `source` to the `target` one of same path.

    Variables of `target` without a counterpart must be new attention
    variables (e.g. HNAS's mixing weights), which keep their initial values;
    variables of `source` without a counterpart must be extra variables of
    a previously converted attention layer.
    """
    source_vars = _by_path(source, "original")
    target_vars = _by_path(target, "converted")
    new_ok = _attention_extra_variables(target)
    dropped_ok = _attention_extra_variables(source)
    missing = [
        path
        for path, v in target_vars.items()
        if path not in source_vars and id(v) not in new_ok
    ]
    dropped = [
        path
        for path, v in source_vars.items()
        if path not in target_vars and id(v) not in dropped_ok
    ]
    if missing or dropped:
        raise ValueError(
            "Could not carry the weights over by name. Converted variables "
            f"without an original: {missing}; original variables without a "
            f"converted counterpart: {dropped}"
        )
    for path, variable in target_vars.items():
        if path not in source_vars:
            continue
        value = source_vars[path]
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"Variable {path!r} has shape {tuple(value.shape)} in the "
                f"original and {tuple(variable.shape)} after conversion."
            )
        # A copy: on JAX `assign` keeps the source's buffer, which the
        # compiled train step of the converted model then donated and
        # freed, deleting the original backbone's weights.
        variable.assign(keras.ops.copy(value))


def carry_lora(source, target):
    """LoRA on every layer of `target` whose `source` layer of the same
    path has it (the attention projections, and any other layer keras-hub's
    `enable_lora(target_layer_names=...)` reached).

    MHA's config does not hold its projections' LoRA, so the rebuilt layers
    had none and the copy by path raised. Enabled here with the same rank
    and alpha (the adapters are then copied by path, and the flags of
    `copy_trainable_by_path` keep the base kernels frozen), and the
    backbone's LoRA bookkeeping is redone for `save_lora_weights`.
    """
    targets = relative_paths(target._flatten_layers(include_self=False), target)
    sources = relative_paths(source._flatten_layers(include_self=False), source)
    for path, old in sources.items():
        new = targets.get(path)
        if (
            not getattr(old, "lora_enabled", False)
            or new is None
            or getattr(new, "lora_enabled", False)
        ):
            continue
        parent = new.path.rpartition("/")[0]
        scope = _path_scope(parent) if parent else contextlib.nullcontext()
        with scope:
            new.enable_lora(old.lora_rank, lora_alpha=old.lora_alpha)
    if getattr(source, "_lora_enabled_layers", None):
        weighted = [
            layer
            for layer in target._flatten_layers(include_self=False)
            if layer.weights
        ]
        target._lora_rank = source._lora_rank
        target._lora_enabled_layers = [
            i
            for i, layer in enumerate(weighted)
            if getattr(layer, "lora_enabled", False)
        ]


def copy_trainable_by_path(source, target):
    """Gives each layer of `target` the `trainable` flag of the `source`
    layer of the same path (parents first, so a frozen parent's unfrozen
    sublayer stays unfrozen, as in `source`)."""
    layers = relative_paths(source._flatten_layers(include_self=False), source)
    prefix = scope_prefix(target)
    for layer in target._flatten_layers(include_self=False):
        path = relative_path(layer, prefix)
        if path in layers:
            layer.trainable = layers[path].trainable
    # Then each variable's own flag: LoRA freezes a projection's kernel
    # inside a trainable layer.
    variables = relative_paths(source.weights, source)
    for variable in target.weights:
        path = relative_path(variable, prefix)
        if path in variables:
            variable.trainable = variables[path].trainable


def _accepted_arguments(attention_class):
    """Names of the constructor arguments `attention_class` takes: the
    named parameters of each `__init__` along its MRO, for as long as they
    pass `**kwargs` on (down to `keras.layers.Layer`'s)."""
    names = set()
    for cls in attention_class.__mro__:
        if "__init__" not in vars(cls):
            continue
        parameters = inspect.signature(cls.__init__).parameters.values()
        names.update(
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        )
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    names.discard("self")
    return names


def _inherited_attention_kwargs(backbone, attention_class):
    """The attention kwargs of `backbone`'s own conversion, that of a
    converted backbone converted again starts from (`{}` for a backbone
    that is not converted).

    With another attention class, those it does not take are left out
    (DNAS's `iterations` for a keras MHA, HNAS's `hybrid_init` for DNAS).
    Attached terms are copies (from their configs; their weights and
    flags are then copied by path with the backbone's): the original
    backbone keeps its own. Before, a re-conversion (to attach a term, or
    to reset HNAS's `u`) rebuilt the layers from keras-hub's stock
    attention and silently dropped them all (DNAS `iterations=5` ran one
    Sinkhorn iteration again), while HNAS's `u` was carried by path.
    """
    live = getattr(backbone, "_live_attention", None)
    if live is None:
        return {}
    kwargs = dict(live.attention_kwargs)
    if live.attention_class is not attention_class:
        accepted = _accepted_arguments(attention_class)
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    if kwargs.get("attention_losses"):
        kwargs["attention_losses"] = [
            type(term).from_config(term.get_config())
            for term in kwargs["attention_losses"]
        ]
    return kwargs


def convert_backbone(
    backbone, attention_class, attention_losses=None, **attention_kwargs
):
    """Returns `backbone` with its self-attention layers replaced.

    The result is a new backbone of the same keras-hub class (a generated
    subclass: `isinstance(result, type(backbone))` holds and the class name
    is the same) and configuration. The self-attention layer of every
    `keras_hub.layers.TransformerEncoder` / `TransformerDecoder` is an
    `attention_class` built with the original layer's
    `keras.layers.MultiHeadAttention` arguments updated by
    `attention_kwargs`, and every weight of `backbone` is copied over by
    variable path, as is every layer's `trainable` flag (a converted layer
    is frozen like the one it replaces; the attached terms, shared by all
    blocks, keep their own); no variable is duplicated and
    weight sharing (ALBERT's layer groups) is kept. In encoders, this
    package's variants get `self_attention_padding=True`: keras-hub masks
    only padded keys, and DNAS / HNAS must also keep padded queries out of
    their normalization over queries. Decoders (GPT-2) accept causal
    attention classes only.

    A converted backbone converts again from its own conversion's
    arguments: its attention kwargs (`iterations`, `dropout`, `seed`,
    `attention_path`, ...) and attached terms (copies, with their weights)
    carry over under `attention_kwargs` and `attention_losses`, which win
    (`attention_losses=[]` removes the terms). With another attention
    class, the kwargs it does not take are left out (its terms too, for a
    class that takes none).

    The result survives `.keras` save / load (after
    `import keras_attnvariants.backbones`) and `export()`. Its
    `save_to_preset` preset reloads with `ConvertedBackbone.from_preset`,
    not keras-hub's `Backbone.from_preset`: keras-hub finds a preset's
    class by its registered name, which all converted classes share. A
    task's preset does not reload (keras-hub matches tokenizers,
    preprocessors and tasks to the backbone's class); save task models as
    `.keras`.

    Args:
        backbone: a keras-hub backbone built from `TransformerEncoder` or
            `TransformerDecoder` blocks: `BertBackbone`, `RobertaBackbone`,
            `AlbertBackbone`, `DistilBertBackbone`, `ElectraBackbone`,
            `GPT2Backbone`, ... (pretrained or not). Blocks with a
            model-specific self-attention (Whisper, Moonshine) raise
            `ValueError`.
        attention_class: a subclass of `keras.layers.MultiHeadAttention`:
            any attention of this package or your own (register it with
            `keras.saving.register_keras_serializable` to reload `.keras`
            files).
        attention_losses: list (or tuple) of `AttentionLoss` attached to
            every converted layer (one shared instance per term, so each
            term is one metric in `fit`); needs an attention class of this
            package. A single term not in a list raises `ValueError`.
            Defaults to `None`: no terms, or those of a converted
            `backbone`.
        **attention_kwargs: constructor arguments of `attention_class`
            (e.g. `hybrid_init=0.0`), except `name` and `dtype`
            (`ValueError`: every converted layer keeps the name and dtype
            policy of the layer it replaces). `num_heads`, `key_dim`,
            `value_dim`, `use_bias`, `output_shape` (None, the default,
            means the backbone's hidden size) and `use_gate` must equal
            the backbone's (`ValueError` otherwise: its weights would not
            fit). `trainable` must be a bool. An int `seed` seeds the
            `i`-th converted layer with `(seed + i) % 2**31`, so that
            layers do not share dropout masks or Gumbel noise.

    Returns:
        The converted backbone.

    Example:

    >>> import keras_hub
    >>> import keras_attnvariants as kav
    >>> from keras_attnvariants.backbones import convert_backbone
    >>> backbone = keras_hub.models.BertBackbone(
    ...     vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=8)
    >>> hnas = convert_backbone(backbone, kav.HybridAttention, hybrid_init=0.0)
    >>> isinstance(hnas, keras_hub.models.BertBackbone)
    True
    >>> len(hnas.weights) - len(backbone.weights)  # one u per layer
    2
    """
    keras_hub = import_keras_hub()
    if not isinstance(backbone, keras_hub.models.Backbone):
        raise ValueError(
            "`backbone` must be a `keras_hub.models.Backbone` (for a task "
            "model, convert `task.backbone`; for a preset, load it with "
            "`from_preset` first). Received: "
            f"backbone={backbone!r}"
        )
    _check_attention_class(attention_class)
    _checked_blocks(backbone)
    for reserved in ("name", "dtype"):
        # Passed on with the layer's own name and policy: a TypeError
        # ("multiple values for keyword argument") deep in the rebuild.
        if reserved in attention_kwargs:
            raise ValueError(
                f"`{reserved}` cannot be an attention argument: every "
                "converted layer keeps the name and dtype policy of the "
                "layer it replaces (build the backbone with another "
                "`dtype` to change the policy). Received: "
                f"{reserved}={attention_kwargs[reserved]!r}"
            )
    if "seed" in attention_kwargs:
        # Checked before the per-layer seeds wrap into range: -1 or 2**40
        # became other valid seeds instead of the layers' `ValueError`.
        attention_kwargs["seed"] = check_seed(attention_kwargs["seed"])
    if attention_kwargs.get("output_shape") is not None:
        # As Python ints: `_output_dims` accepts NumPy ints, which Keras's
        # `MultiHeadAttention` rejects ("Invalid output_shape") in the
        # rebuild.
        given = attention_kwargs["output_shape"]
        dims = _output_dims(given)
        attention_kwargs["output_shape"] = dims[0] if is_int(given) else dims
    if "trainable" in attention_kwargs:
        # Assigned to each converted layer after the rebuild: "yes" or 1
        # was accepted there.
        attention_kwargs["trainable"] = check_bool(
            "trainable", attention_kwargs["trainable"]
        )
    # Before `term_flags` below reads the elements' sublayers.
    check_attention_loss_terms(attention_losses)
    _check_weight_shape_kwargs(backbone, attention_kwargs)
    inherited = _inherited_attention_kwargs(backbone, attention_class)
    if attention_losses is not None:
        inherited.pop("attention_losses", None)
    if attention_losses:
        if not issubclass(attention_class, VariantAttention):
            raise ValueError(
                "`attention_losses` needs an attention class of "
                "keras_attnvariants (a `VariantAttention`), which computes "
                "them from its weights before dropout. Received: "
                f"attention_class={attention_class.__name__}"
            )
        attention_kwargs["attention_losses"] = list(attention_losses)
    base = original_class(type(backbone))
    config = backbone.get_config()
    config.pop("attention_config", None)
    config.pop("base_class", None)
    config["attention_config"] = {
        # Live objects: only a reload needs to find the class by name, and
        # the attached loss terms are the caller's instances.
        "attention_class": attention_class,
        "attention_kwargs": {**inherited, **attention_kwargs},
    }
    converted = converted_class(base)
    # The terms are shared by every converted layer, and Keras's
    # `trainable` setter recurses: a frozen block reached them and froze a
    # shared adversary for every block. They keep the caller's flags, read
    # before the rebuild: on JAX the rebuild's own `trainable` assignments
    # (each converted layer takes its block's flag) had already unfrozen a
    # term the caller froze.
    saved_flags = term_flags(attention_losses)
    unbuilt = [term for term in attention_losses or () if not term.built]
    result = base.from_config.__func__(converted, config)
    carry_lora(backbone, result)
    copy_weights_by_path(backbone, result)
    copy_trainable_by_path(backbone, result)
    if "hybrid_init" in attention_kwargs:
        # Given explicitly, it wins over a converted original's `u` (copied
        # by path just above): re-converting an HNAS backbone with
        # `hybrid_init=0.0` is how its softmax is recovered.
        for layer in self_attention_layers(result):
            if hasattr(layer, "hybrid_weight"):
                weight = layer.hybrid_weight
                weight.assign(
                    ops.full(
                        weight.shape,
                        attention_kwargs["hybrid_init"],
                        weight.dtype,
                    )
                )
    if "trainable" in attention_kwargs:
        # Given explicitly, it wins over the original layers' flags, as it
        # does when the converted backbone is rebuilt from its config.
        for layer in self_attention_layers(result):
            layer.trainable = attention_kwargs["trainable"]
    for layer, trainable in saved_flags:
        layer.trainable = trainable
    for term in unbuilt:
        # Its weights were made by the rebuild, after `saved_flags` was
        # read, and Keras creates them trainable: a frozen term freezes
        # them.
        apply_frozen_flag(term)
    return result
