"""`TwoStreamBlock`: one layer of the two-stream transformer."""

import keras
from keras import ops

from keras_attnvariants.layers.gumbel_discrete_attention import (
    assign_temperature,
)
from keras_attnvariants.layers.gumbel_discrete_attention import (
    check_temperature,
)
from keras_attnvariants.layers.gumbel_discrete_attention import (
    gumbel_training_weights,
)
from keras_attnvariants.layers.variant_attention import apply_frozen_flag
from keras_attnvariants.layers.variant_attention import keras_masks_restored
from keras_attnvariants.layers.variant_attention import warn_misadded_biases
from keras_attnvariants.ops.gumbel import argmax_indices
from keras_attnvariants.ops.gumbel import gather_values
from keras_attnvariants.ops.gumbel import one_hot_at
from keras_attnvariants.ops.gumbel import rows_with_valid_key
from keras_attnvariants.ops.gumbel import selection_logits
from keras_attnvariants.ops.masking import causal_mask
from keras_attnvariants.ops.masking import merge_masks
from keras_attnvariants.ops.normalization import masked_softmax
from keras_attnvariants.validation import check_bool
from keras_attnvariants.validation import check_int
from keras_attnvariants.validation import check_seed
from keras_attnvariants.validation import python_scalars
from keras_attnvariants.validation import static_shape

MODES = ("two_stream", "single_stream")
MODEL_ATTENTIONS = ("discrete", "soft")


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class TwoStreamBlock(keras.layers.Layer):
    """A two-stream transformer layer (Kinley 2020, chapter 4.2).

    Two residual streams over the same tokens:

    - the controller `g` has its own query, key, value and output
      projections and updates itself with soft attention,
      `g_i += O(sum_j A_ij V g_j)`, `A = softmax(Q g (K g)^T / sqrt(H))`;
    - the model `h` has only value and output projections and reads one
      token per head chosen by the controller, `h_i += O'(V' h_{z_i})`,
      `z_i ~ Cat(A_i)`: a relaxed Gumbel-softmax sample in training
      (straight-through optional), the argmax at inference (a gather).

    Each stream then applies its own feed-forward network; both use
    post-layer-norm residuals as in the original transformer. The
    controller learns only through `A`. With `num_controllers > 1`
    (multiview) each view has its own controller weights and all views
    share the model stream; `view` picks the controller. With
    `mode="single_stream"` there is one stream with Q, K, V updated by the
    discrete sample of its own attention (single-stream discrete
    transformer). With `model_attention="soft"` the model stream reads the
    controller's soft attention `A` instead of a discrete sample (the
    "two-stream transformer with soft attention" of the thesis's multiview
    arithmetic experiment, section 5.3, footnote 3).

    In a stack only the model stream leaves the last block, so the last
    block's controller update is never read: `update_controller=False`
    builds that block without the controller's value, output and
    feed-forward weights (which would get no gradient) and passes `g`
    through unchanged. `TwoStreamEncoder` does this for its last block.

    Args:
        d_model: int. Width of both streams.
        num_heads: int. Attention heads; `d_model` must divide by it.
        d_ff: int. Hidden width of the feed-forward networks.
        num_controllers: int >= 1. Controllers sharing the model stream.
            Defaults to `1`.
        mode: `"two_stream"` or `"single_stream"`. Defaults to
            `"two_stream"`.
        model_attention: `"discrete"` (Gumbel sample / argmax) or
            `"soft"` (the softmax `A`). Defaults to `"discrete"`.
        update_controller: bool. Whether the block updates the controller
            stream (two-stream mode only; `False` returns `g` as given and
            keeps only the controller's query and key weights). Defaults
            to `True`.
        temperature: float > 0. Gumbel-softmax temperature (a
            non-trainable variable; see `set_temperature`). Defaults to
            `1.0`.
        straight_through: bool. One-hot samples in training. Defaults to
            `False`.
        seed: int in `[0, 2**31)` or `None`. Seeds the Gumbel noise.
            Defaults to `None`.
        **kwargs: `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `[g, h]`, each `(B, T, d_model)`, or `h` alone in
            `"single_stream"` mode (a tuple `(g, h)` works too, but is a
            graph break under torch.compile: see Returns).
        padding_mask: optional `(B, T)` booleans, `True` = real token.
            Without it, the inputs' Keras masks (e.g. from
            `Embedding(mask_zero=True)`) are used; they are passed on to
            the output streams.
        view: int. Which controller to use. Defaults to `0`.
        use_causal_mask: bool. Defaults to `False`.
        training: bool.

    Returns:
        `([g, h], z)` in two-stream mode, `(h, z)` in single-stream mode;
        `z` `(B, N, T, T)` float32 are the weights the model stream used
        (relaxed or one-hot; the softmax with `model_attention="soft"`).
        The streams are a list, and pass as one, not a tuple: Keras
        flattens a layer's arguments and outputs with an `is not` between
        containers that torch.compile cannot trace for two tuples (a
        graph break at every block).

    Example:

    >>> import numpy as np
    >>> block = TwoStreamBlock(d_model=8, num_heads=2, d_ff=16)
    >>> g = h = np.random.rand(2, 5, 8).astype("float32")
    >>> (g2, h2), z = block([g, h])
    >>> tuple(h2.shape), tuple(z.shape)
    ((2, 5, 8), (2, 2, 5, 5))

    Reference:
        Kinley, "Two-Stream Transformer Architecture With Discrete
        Attention for Better Interpretrability and Separation of Model
        Concerns", 2020.
    """

    def __init__(
        self,
        d_model,
        num_heads,
        d_ff,
        num_controllers=1,
        mode="two_stream",
        temperature=1.0,
        straight_through=False,
        seed=None,
        model_attention="discrete",
        update_controller=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        d_model = check_int("d_model", d_model)
        num_heads = check_int("num_heads", num_heads)
        d_ff = check_int("d_ff", d_ff)
        num_controllers = check_int("num_controllers", num_controllers)
        straight_through = check_bool("straight_through", straight_through)
        update_controller = check_bool("update_controller", update_controller)
        if d_model % num_heads:
            raise ValueError(
                "`d_model` must be divisible by `num_heads`. Received: "
                f"d_model={d_model}, num_heads={num_heads}"
            )
        if mode not in MODES:
            raise ValueError(
                f"`mode` must be one of {MODES}. Received: mode={mode!r}"
            )
        if mode == "single_stream" and num_controllers != 1:
            raise ValueError(
                "`num_controllers` must be 1 in single_stream mode. "
                f"Received: num_controllers={num_controllers}"
            )
        if model_attention not in MODEL_ATTENTIONS:
            raise ValueError(
                f"`model_attention` must be one of {MODEL_ATTENTIONS}. "
                f"Received: model_attention={model_attention!r}"
            )
        if mode == "single_stream" and not update_controller:
            raise ValueError(
                "`update_controller` must be True in single_stream mode "
                "(the one stream is the controller). Received: "
                f"update_controller={update_controller!r}"
            )
        check_temperature(temperature)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.num_controllers = num_controllers
        self.mode = mode
        self.initial_temperature = float(temperature)
        self.straight_through = straight_through
        self.seed = check_seed(seed)
        self.model_attention = model_attention
        self.update_controller = update_controller
        self.seed_generator = keras.random.SeedGenerator(self.seed)
        head = d_model // num_heads
        policy = self.dtype_policy

        def proj(name):
            return keras.layers.EinsumDense(
                "btd,dnh->btnh",
                (None, num_heads, head),
                bias_axes="nh",
                name=name,
                dtype=policy,
            )

        def out(name):
            return keras.layers.EinsumDense(
                "btnh,nhd->btd",
                (None, d_model),
                bias_axes="d",
                name=name,
                dtype=policy,
            )

        def ffn(prefix):
            return [
                keras.layers.Dense(
                    d_ff, "relu", name=f"{prefix}_ff1", dtype=policy
                ),
                keras.layers.Dense(d_model, name=f"{prefix}_ff2", dtype=policy),
                keras.layers.LayerNormalization(
                    name=f"{prefix}_norm1", dtype=policy
                ),
                keras.layers.LayerNormalization(
                    name=f"{prefix}_norm2", dtype=policy
                ),
            ]

        self.controllers = []
        for c in range(num_controllers):
            parts = {
                "query": proj(f"controller{c}_query"),
                "key": proj(f"controller{c}_key"),
            }
            if self.update_controller:
                parts["value"] = proj(f"controller{c}_value")
                parts["output"] = out(f"controller{c}_output")
                parts["ffn"] = ffn(f"controller{c}")
            self.controllers.append(parts)
        if mode == "two_stream":
            self.model_value = proj("model_value")
            self.model_output = out("model_output")
            self.model_ffn = ffn("model")

    def build(self, input_shape):
        # Checked first: a build that raised after adding the temperature
        # left it behind, and the next build added a second one.
        self._check_input_shape(input_shape)
        self.temperature = self.add_weight(
            name="temperature",
            shape=(),
            initializer=keras.initializers.Constant(self.initial_temperature),
            dtype="float32",
            trainable=False,
            autocast=False,
        )
        shape = input_shape[0] if self.mode == "two_stream" else input_shape
        shape = tuple(shape)
        heads = (*shape[:-1], self.num_heads, self.d_model // self.num_heads)
        for parts in self.controllers:
            parts["query"].build(shape)
            parts["key"].build(shape)
            if self.update_controller:
                parts["value"].build(shape)
                parts["output"].build(heads)
                self._build_ffn(parts["ffn"], shape)
        if self.mode == "two_stream":
            self.model_value.build(shape)
            self.model_output.build(heads)
            self._build_ffn(self.model_ffn, shape)
        warn_misadded_biases(self._flatten_layers(include_self=False))
        apply_frozen_flag(self)

    def _check_input_shape(self, input_shape):
        """Raises `ValueError` unless the streams are `(B, T, d_model)`."""
        two = self.mode == "two_stream"
        shapes = tuple(input_shape) if two else (input_shape,)
        valid = len(shapes) == (2 if two else 1) and all(
            isinstance(s, (list, tuple))
            and len(s) == 3
            and s[-1] == self.d_model
            for s in shapes
        )
        # The model stream reads the controller's picks: same B and T.
        valid = valid and all(
            len({s[axis] for s in shapes} - {None}) <= 1 for axis in (0, 1)
        )
        if not valid:
            expected = "`(g, h)`, each" if two else "one stream"
            raise ValueError(
                f"`inputs` must be {expected} `(B, T, d_model="
                f"{self.d_model})` (mode={self.mode!r}). "
                f"Received: input_shape={input_shape}"
            )

    def _build_ffn(self, layers, shape):
        ff1, ff2, norm1, norm2 = layers
        ff1.build(shape)
        ff2.build((*shape[:-1], self.d_ff))
        norm1.build(shape)
        norm2.build(shape)

    def set_temperature(self, value):
        """Sets the Gumbel temperature (a float > 0), also inside `fit`."""
        check_temperature(value)
        if self.built:
            assign_temperature(self.temperature, value)
        else:
            self.initial_temperature = float(value)

    def _check_padding_mask(self, padding_mask, x):
        """`ValueError` unless `padding_mask` is `(B, T)` for `x`."""
        # A nested list (no `.shape`) is checked by its NumPy shape.
        shape = static_shape(padding_mask)
        if shape is None:  # an unknown rank
            return
        lengths = {shape[-1], x.shape[1]} - {None} if shape else set()
        # A batch of 1 broadcasts; another mismatch failed in a backend
        # `BroadcastTo`.
        batches = {shape[0], x.shape[0]} - {None, 1} if shape else set()
        if len(shape) != 2 or len(lengths) > 1 or len(batches) > 1:
            raise ValueError(
                f"`padding_mask` must be `(B={x.shape[0]}, T={x.shape[1]})` "
                f"booleans. Received: padding_mask.shape={shape}"
            )

    def __call__(self, *args, **kwargs):
        return super().__call__(
            *args, **python_scalars(kwargs, ("view", "use_causal_mask"))
        )

    def _check_call_arguments(
        self, inputs, padding_mask, view, use_causal_mask=False
    ):
        """`ValueError` for a bad `view`, `use_causal_mask`, stream or
        `padding_mask` shape."""
        check_int("view", view, low=0, high=self.num_controllers - 1)
        check_bool("use_causal_mask", use_causal_mask)
        self._check_input_shape(
            keras.tree.map_structure(lambda x: tuple(x.shape), inputs)
        )
        for stream in keras.tree.flatten(inputs):
            if not keras.backend.is_float_dtype(stream.dtype):
                # Integer streams failed in a backend matmul.
                raise ValueError(
                    "The streams must be float tensors `(B, T, d_model)` "
                    "(embeddings: `TwoStreamEncoder` takes token ids). "
                    "Received: a stream of dtype "
                    f"{keras.backend.standardize_dtype(stream.dtype)}"
                )
        if padding_mask is not None:
            g = inputs[0] if self.mode == "two_stream" else inputs
            self._check_padding_mask(padding_mask, g)

    def _mask(self, x, padding_mask, use_causal_mask, keras_mask):
        """`(B, 1, T, T)` booleans or `None`."""
        if padding_mask is None:
            # Keras masks of the streams, e.g. from `Embedding(mask_zero=True)`.
            padding_mask = merge_masks(*keras.tree.flatten(keras_mask))
        else:
            self._check_padding_mask(padding_mask, x)
            padding_mask = ops.cast(padding_mask, "bool")
        mask = None
        if padding_mask is not None:
            valid = padding_mask
            mask = ops.logical_and(
                ops.expand_dims(valid, 1), ops.expand_dims(valid, 2)
            )
        if use_causal_mask:
            length = ops.shape(x)[1]
            causal = ops.expand_dims(causal_mask(length, length), 0)
            mask = causal if mask is None else ops.logical_and(mask, causal)
        return None if mask is None else ops.expand_dims(mask, 1)

    def _residual(self, x, update, layers):
        ff1, ff2, norm1, norm2 = layers
        x = norm1(x + update)
        return norm2(x + ff2(ff1(x)))

    def _sample(self, scores, mask, training):
        """Weights `(B, N, T, T)` float32 and argmax indices (or `None`)."""
        if self.model_attention == "soft":
            return masked_softmax(scores, mask), None
        if training:
            z = gumbel_training_weights(
                scores,
                mask,
                self.temperature,
                self.seed_generator,
                self.straight_through,
            )
            return z, None
        indices = argmax_indices(selection_logits(scores, mask))
        return one_hot_at(indices, ops.shape(scores)[-1], mask), indices

    def _discrete_update(self, values, z, indices, mask, output_layer):
        """`O(V_{z_i})`: a gather at inference, weighted sum in training."""
        if indices is None:
            context = ops.einsum(
                "bnts,bsnh->btnh", ops.cast(z, values.dtype), values
            )
        else:
            row_valid = rows_with_valid_key(mask, indices)
            context = gather_values(values, indices, row_valid)
        return output_layer(context)

    def call(
        self,
        inputs,
        padding_mask=None,
        view=0,
        use_causal_mask=False,
        training=None,
        mask=None,
    ):
        self._check_call_arguments(inputs, padding_mask, view, use_causal_mask)
        g = inputs[0] if self.mode == "two_stream" else inputs
        mask = self._mask(g, padding_mask, use_causal_mask, mask)
        # `mask` holds the streams' Keras masks; the projections (which do
        # not support masking) warned on every traced call that they would
        # "destroy" them. Detached for the call, then put back on the
        # caller's tensors; `compute_mask` passes them on to the outputs.
        with keras_masks_restored(keras.tree.flatten(inputs), detach=True):
            return self._streams(inputs, mask, view, training)

    def _streams(self, inputs, mask, view, training):
        """`call` after the checks: the updated stream(s) and `z`."""
        parts = self.controllers[view]
        g = inputs[0] if self.mode == "two_stream" else inputs
        # q, k: (B, T, N, H); scores: (B, N, T, T) float32
        q = ops.cast(parts["query"](g), "float32")
        k = ops.cast(parts["key"](g), "float32")
        head = self.d_model // self.num_heads
        scores = ops.einsum("btnh,bsnh->bnts", q, k) / (head**0.5)
        z, indices = self._sample(scores, mask, training)
        if self.mode == "single_stream":
            update = self._discrete_update(
                parts["value"](g), z, indices, mask, parts["output"]
            )
            return self._residual(g, update, parts["ffn"]), z
        # Controller: soft attention over its own values.
        h = inputs[1]
        if self.update_controller:
            soft = ops.cast(masked_softmax(scores, mask), g.dtype)
            g_update = parts["output"](
                ops.einsum("bnts,bsnh->btnh", soft, parts["value"](g))
            )
            g = self._residual(g, g_update, parts["ffn"])
        # Model: one value row per head and query, chosen by the controller.
        h_update = self._discrete_update(
            self.model_value(h), z, indices, mask, self.model_output
        )
        h = self._residual(h, h_update, self.model_ffn)
        return [g, h], z

    def compute_mask(self, inputs, previous_mask):
        # The streams keep their Keras masks; `z` has none.
        return previous_mask, None

    def compute_output_spec(self, inputs, padding_mask=None, view=0, **kwargs):
        # A functional model with a bad `view` or `padding_mask` was built,
        # and failed only when it ran.
        self._check_call_arguments(
            inputs, padding_mask, view, kwargs.get("use_causal_mask", False)
        )
        two = self.mode == "two_stream"
        shapes = self.compute_output_shape(
            tuple(t.shape for t in inputs) if two else inputs.shape
        )
        streams, z = shapes
        # One KerasTensor per output: a shared one would make a functional
        # model return the model stream as `g` too.
        streams = [
            keras.KerasTensor(shape, self.compute_dtype)
            for shape in (streams if two else [streams])
        ]
        z = keras.KerasTensor(z, "float32")
        return (streams, z) if two else (streams[0], z)

    def compute_output_shape(self, input_shape):
        """`((g, h), z)` shapes in two-stream mode, `(h, z)` in
        single-stream mode; `z` is `(B, N, T, T)`."""
        self._check_input_shape(input_shape)
        two = self.mode == "two_stream"
        shape = tuple(input_shape[0] if two else input_shape)
        z = (shape[0], self.num_heads, shape[1], shape[1])
        return ((shape, shape), z) if two else (shape, z)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "num_controllers": self.num_controllers,
                "mode": self.mode,
                "temperature": self.initial_temperature,
                "straight_through": self.straight_through,
                "seed": self.seed,
                "model_attention": self.model_attention,
                "update_controller": self.update_controller,
            }
        )
        return config
