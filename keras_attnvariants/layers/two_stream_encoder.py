"""`TwoStreamEncoder`: a stack of `TwoStreamBlock`s with embeddings."""

import keras
from keras import ops

from keras_attnvariants.layers.gumbel_discrete_attention import (
    check_temperature,
)
from keras_attnvariants.layers.two_stream_block import MODEL_ATTENTIONS
from keras_attnvariants.layers.two_stream_block import MODES
from keras_attnvariants.layers.two_stream_block import TwoStreamBlock
from keras_attnvariants.layers.variant_attention import apply_frozen_flag
from keras_attnvariants.losses.attention_loss import KeepsStepLosses
from keras_attnvariants.losses.attention_loss import batch_mean
from keras_attnvariants.ops.receptive_field import receptive_field_mean_size
from keras_attnvariants.ops.receptive_field import receptive_field_union_size
from keras_attnvariants.ops.receptive_field import receptive_fields
from keras_attnvariants.validation import check_bool
from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_int
from keras_attnvariants.validation import check_seed
from keras_attnvariants.validation import layer_seed
from keras_attnvariants.validation import python_scalars

REDUCTIONS = ("mean", "union")


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class TwoStreamEncoder(KeepsStepLosses, keras.layers.Layer):
    """Two-stream (or single-stream discrete) transformer encoder.

    Token ids (0 = padding) are embedded with learned token and position
    embeddings, once for the model stream and, unless `share_embeddings`,
    once per controller; then `num_layers` `TwoStreamBlock`s run. With
    `num_views > 1` each view has its own controllers (and controller
    embeddings) and all views share the model stream (multiview model of
    Kinley 2020, chapter 4.2). The last block does not update the
    controller (only the model stream leaves the encoder; see
    `TwoStreamBlock(update_controller=False)`). With
    `receptive_field_coefficient > 0` the layer adds, in training,
    `coefficient * mean_b size(s^L)` as a loss,
    where `s^L` are the soft receptive fields of the discrete samples (see
    `keras_attnvariants.ops.receptive_field`; `receptive_field_reduction`
    `"mean"` = per-position mean size, `"union"` = size of the union,
    which is constant: every token is in its own field).

    Args:
        vocab_size: int. Token ids are in `[0, vocab_size)`; float ids
            are truncated to ints. Ids out of range are not checked (as in
            `keras.layers.Embedding`): TensorFlow and PyTorch fail in the
            lookup, JAX returns NaN, and negative ids count from the end.
        max_length: int. Longest sequence.
        num_layers: int. Number of blocks.
        d_model, num_heads, d_ff, mode, temperature, straight_through,
            seed, model_attention: as in `TwoStreamBlock` (block `i` gets
            `(seed + i) % 2**31`); `d_model`, `num_heads` and `d_ff`
            default to `64`, `4` and `128` (the thesis's Table 6.5 model).
        num_views: int >= 1. Controllers per block. Defaults to `1`.
        share_embeddings: bool. Controllers reuse the model stream's
            embeddings. Defaults to `True`.
        receptive_field_coefficient: float >= 0. Defaults to `0.0`.
        receptive_field_reduction: `"mean"` or `"union"`. Defaults to
            `"mean"`.
        mask_zero: bool. Give the model stream the Keras mask
            `token_ids != 0`, as `keras.layers.Embedding(mask_zero=True)`
            does, so mask-aware layers after the encoder (pooling,
            recurrent layers, losses) skip the padding. The encoder itself
            always treats id 0 as padding. Defaults to `False`.
        **kwargs: `keras.layers.Layer` arguments.

    Call arguments:
        token_ids: int `(B, T)`.
        view: int. Which controller set to use. Defaults to `0`.
        use_causal_mask: bool. Defaults to `False`.
        return_attention: bool. Also return the list of per-layer discrete
            weights `(B, N, T, T)`. Defaults to `False`.
        training: bool.

    Returns:
        The model stream `(B, T, d_model)` (the controller is internal),
        and with `return_attention=True` the list of weights.

    Example:

    >>> import numpy as np
    >>> encoder = TwoStreamEncoder(10, 6, 2, d_model=8, num_heads=2, d_ff=16)
    >>> tuple(encoder(np.array([[3, 4, 5, 0]])).shape)
    (1, 4, 8)
    """

    def __init__(
        self,
        vocab_size,
        max_length,
        num_layers,
        d_model=64,
        num_heads=4,
        d_ff=128,
        num_views=1,
        mode="two_stream",
        share_embeddings=True,
        temperature=1.0,
        straight_through=False,
        receptive_field_coefficient=0.0,
        receptive_field_reduction="mean",
        seed=None,
        model_attention="discrete",
        mask_zero=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        vocab_size = check_int("vocab_size", vocab_size)
        max_length = check_int("max_length", max_length)
        num_layers = check_int("num_layers", num_layers)
        d_model = check_int("d_model", d_model)
        num_heads = check_int("num_heads", num_heads)
        d_ff = check_int("d_ff", d_ff)
        num_views = check_int("num_views", num_views)
        seed = check_seed(seed)
        share_embeddings = check_bool("share_embeddings", share_embeddings)
        straight_through = check_bool("straight_through", straight_through)
        mask_zero = check_bool("mask_zero", mask_zero)
        if mode not in MODES:
            raise ValueError(
                f"`mode` must be one of {MODES}. Received: mode={mode!r}"
            )
        if mode == "single_stream" and num_views != 1:
            raise ValueError(
                "`num_views` must be 1 in single_stream mode. "
                f"Received: num_views={num_views}"
            )
        if model_attention not in MODEL_ATTENTIONS:
            raise ValueError(
                f"`model_attention` must be one of {MODEL_ATTENTIONS}. "
                f"Received: model_attention={model_attention!r}"
            )
        if receptive_field_reduction not in REDUCTIONS:
            raise ValueError(
                f"`receptive_field_reduction` must be one of {REDUCTIONS}. "
                "Received: receptive_field_reduction="
                f"{receptive_field_reduction!r}"
            )
        temperature = check_float("temperature", temperature)
        receptive_field_coefficient = check_float(
            "receptive_field_coefficient",
            receptive_field_coefficient,
            low_inclusive=True,
        )
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.num_layers = num_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.num_views = num_views
        self.mode = mode
        self.share_embeddings = share_embeddings
        self.initial_temperature = float(temperature)
        self.straight_through = straight_through
        self.receptive_field_coefficient = float(receptive_field_coefficient)
        self.receptive_field_reduction = receptive_field_reduction
        self.seed = seed
        self.model_attention = model_attention
        self.mask_zero = mask_zero
        policy = self.dtype_policy

        def embeddings(prefix):
            return (
                keras.layers.Embedding(
                    vocab_size, d_model, name=f"{prefix}_tokens", dtype=policy
                ),
                keras.layers.Embedding(
                    max_length,
                    d_model,
                    name=f"{prefix}_positions",
                    dtype=policy,
                ),
            )

        self.model_embeddings = embeddings("model")
        separate = mode == "two_stream" and not self.share_embeddings
        self.controller_embeddings = [
            embeddings(f"controller{v}") if separate else self.model_embeddings
            for v in range(num_views if mode == "two_stream" else 1)
        ]
        self.blocks = [
            TwoStreamBlock(
                d_model,
                num_heads,
                d_ff,
                num_controllers=num_views if mode == "two_stream" else 1,
                mode=mode,
                temperature=temperature,
                straight_through=straight_through,
                seed=layer_seed(seed, i),
                model_attention=model_attention,
                # The last controller update would never be read.
                update_controller=mode == "single_stream" or i < num_layers - 1,
                name=f"block{i}",
                dtype=policy,
            )
            for i in range(num_layers)
        ]

    @property
    def temperature(self):
        """The blocks' Gumbel temperature: the first block's non-trainable
        variable once built (`TemperatureSchedule` and `set_temperature`
        set every block's together), the initial float before. Assigning
        it calls `set_temperature`."""
        if self.blocks and self.blocks[0].built:
            return self.blocks[0].temperature
        return self.initial_temperature

    @temperature.setter
    def temperature(self, value):
        self.set_temperature(value)

    def set_temperature(self, value):
        """Sets every block's Gumbel temperature (a float > 0), also inside
        `fit`."""
        check_temperature(value)
        for block in self.blocks:
            block.set_temperature(value)
        if not self.built:
            self.initial_temperature = float(value)

    def _check_call_flags(self, view, use_causal_mask, return_attention):
        """`ValueError` for a bad `view`, `use_causal_mask` or
        `return_attention` (in `call` and `compute_output_spec`)."""
        check_int("view", view, low=0, high=self.num_views - 1)
        check_bool("use_causal_mask", use_causal_mask)
        check_bool("return_attention", return_attention)

    def _check_shape(self, shape):
        # Only an int length is compared: JAX's shape-polymorphic export
        # (`model.export`) traces with a symbolic one, which cannot be
        # compared with an int.
        if len(shape) != 2 or (
            isinstance(shape[1], int) and shape[1] > self.max_length
        ):
            # Position ids past max_length would be clamped (JAX) or fail
            # inside the embedding lookup.
            raise ValueError(
                "`token_ids` must be `(B, T)` with "
                f"T <= max_length={self.max_length}. "
                f"Received: token_ids.shape={shape}"
            )

    def _checked_length(self, token_ids):
        """`token_ids`, checked at run time where `T` is unknown when
        tracing (a TensorFlow graph of any length: an exported model
        serving traffic). Without the check a longer input fails inside
        the position lookup on a CPU, and reads zero rows on a GPU, whose
        gather returns zeros out of range. (PyTorch and JAX's `jit` trace
        with known lengths, checked by `_check_shape`; a model exported
        from JAX with a symbolic length has no run-time check, and XLA
        drops the assertion.)"""
        if isinstance(token_ids.shape[1], int):
            return token_ids
        if keras.backend.backend() != "tensorflow":
            return token_ids
        import tensorflow as tf

        check = tf.debugging.assert_less_equal(
            tf.shape(token_ids)[1],
            self.max_length,
            message=(
                f"`token_ids` must be `(B, T)` with T <= max_length="
                f"{self.max_length}"
            ),
        )
        with tf.control_dependencies([check]):
            return tf.identity(token_ids)

    def build(self, input_shape):
        shape = tuple(input_shape)
        self._check_shape(shape)
        for tokens, positions in [
            self.model_embeddings,
            *self.controller_embeddings,
        ]:
            tokens.build(shape)
            positions.build(shape)
        stream = (*shape, self.d_model)
        for block in self.blocks:
            block.build(
                (stream, stream) if self.mode == "two_stream" else stream
            )
        apply_frozen_flag(self)

    def _embed(self, token_ids, layers):
        tokens, positions = layers
        index = ops.arange(ops.shape(token_ids)[1])
        return tokens(token_ids) + ops.expand_dims(positions(index), 0)

    def call(
        self,
        token_ids,
        view=0,
        use_causal_mask=False,
        return_attention=False,
        training=None,
    ):
        self._check_call_flags(view, use_causal_mask, return_attention)
        self._check_shape(tuple(token_ids.shape))
        token_ids = self._checked_length(token_ids)
        if "int" not in keras.backend.standardize_dtype(token_ids.dtype):
            # The embeddings look float ids up truncated to ints (as
            # `keras.layers.Embedding` does): the padding mask reads the
            # same ids (0.4 counted as a real token, embedded as padding).
            token_ids = ops.cast(token_ids, "int32")
        padding_mask = ops.not_equal(token_ids, 0)
        h = self._embed(token_ids, self.model_embeddings)
        if self.mode == "two_stream":
            g = self._embed(token_ids, self.controller_embeddings[view])
        attentions = []
        for block in self.blocks:
            if self.mode == "two_stream":
                (g, h), z = block(
                    [g, h],
                    padding_mask=padding_mask,
                    view=view,
                    use_causal_mask=use_causal_mask,
                    training=training,
                )
            else:
                h, z = block(
                    h,
                    padding_mask=padding_mask,
                    use_causal_mask=use_causal_mask,
                    training=training,
                )
            attentions.append(z)
        if training and self.receptive_field_coefficient > 0:
            fields = receptive_fields(attentions, padding_mask)
            if self.receptive_field_reduction == "mean":
                size = receptive_field_mean_size(fields, padding_mask)
            else:
                size = receptive_field_union_size(fields)
            # Kept over calls per view in one model (`KeepsStepLosses`).
            self._add_step_loss(
                self.receptive_field_coefficient * batch_mean(size)
            )
        if return_attention:
            return h, attentions
        return h

    def __call__(self, *args, **kwargs):
        return super().__call__(
            *args,
            **python_scalars(
                kwargs, ("view", "use_causal_mask", "return_attention")
            ),
        )

    def compute_mask(self, token_ids, previous_mask=None):
        # The model stream's Keras mask (the attention list has none).
        if not self.mask_zero:
            return None
        return ops.not_equal(token_ids, 0)

    def compute_output_spec(
        self, token_ids, view=0, return_attention=False, **kwargs
    ):
        # A functional model with a bad `view`, `return_attention` or
        # `use_causal_mask` was built, and failed only when it ran.
        self._check_call_flags(
            view, kwargs.get("use_causal_mask", False), return_attention
        )
        shapes = self.compute_output_shape(
            token_ids.shape, return_attention=return_attention
        )
        if not return_attention:
            return keras.KerasTensor(shapes, self.compute_dtype)
        h, attention = shapes
        # One KerasTensor per layer (a shared one would alias them all).
        return keras.KerasTensor(h, self.compute_dtype), [
            keras.KerasTensor(shape, "float32") for shape in attention
        ]

    def compute_output_shape(self, input_shape, return_attention=False):
        """`(B, T, d_model)`, and with `return_attention` the list of the
        layers' `(B, N, T, T)` attention shapes."""
        self._check_shape(tuple(input_shape))
        batch, length = input_shape
        h = (batch, length, self.d_model)
        if not return_attention:
            return h
        z = (batch, self.num_heads, length, length)
        return h, [z] * self.num_layers

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "max_length": self.max_length,
                "num_layers": self.num_layers,
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "num_views": self.num_views,
                "mode": self.mode,
                "share_embeddings": self.share_embeddings,
                "temperature": self.initial_temperature,
                "straight_through": self.straight_through,
                "receptive_field_coefficient": (
                    self.receptive_field_coefficient
                ),
                "receptive_field_reduction": self.receptive_field_reduction,
                "seed": self.seed,
                "model_attention": self.model_attention,
                "mask_zero": self.mask_zero,
            }
        )
        return config
