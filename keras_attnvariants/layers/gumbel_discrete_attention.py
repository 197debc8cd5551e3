"""`GumbelDiscreteAttention`: each query attends to one sampled key."""

import keras
from keras import ops

from keras_attnvariants.layers.variant_attention import VariantAttention
from keras_attnvariants.ops import gumbel as gumbel_ops
from keras_attnvariants.ops.combine import relaxed_gumbel_attend
from keras_attnvariants.ops.combine import softmax_attend
from keras_attnvariants.ops.combine import straight_through_gumbel_attend
from keras_attnvariants.ops.gumbel import argmax_indices
from keras_attnvariants.ops.gumbel import gather_values
from keras_attnvariants.ops.gumbel import gumbel_from_uniform
from keras_attnvariants.ops.gumbel import one_hot_at
from keras_attnvariants.ops.gumbel import relaxed_logits
from keras_attnvariants.ops.gumbel import rows_with_valid_key
from keras_attnvariants.ops.gumbel import sample_of_logits
from keras_attnvariants.ops.gumbel import selection_logits
from keras_attnvariants.ops.gumbel import straight_through
from keras_attnvariants.ops.noise import distributed_uniform
from keras_attnvariants.ops.normalization import masked_softmax
from keras_attnvariants.validation import check_bool
from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_seed

INFERENCE_MODES = ("argmax", "sample", "soft")

# Lower bound applied to the temperature variable inside `call`, so a
# schedule that reaches 0 cannot divide by zero (the ops' own floor).
MIN_TEMPERATURE = gumbel_ops.MIN_TEMPERATURE


def check_temperature(temperature):
    """Raises `ValueError` unless `temperature` is a finite number > 0.

    Python and NumPy scalars are accepted (`np.float32(0.5)`), booleans and
    infinities are not.
    """
    check_float("temperature", temperature)


def assign_temperature(variable, value):
    """Assigns the float `value` to a temperature `variable`.

    `ValueError` on JAX while a `fit` holds the model's variables (their
    values are purged from the variables between steps, until
    `model.jax_state_sync()`): the trainer kept its own copy, so the value
    took no effect and was overwritten at the end of the epoch. A
    callback's `self.model` syncs the state (Keras's `Callback.model`),
    after which the trainer reads the new value at the next step.
    """
    if keras.backend.backend() == "jax" and variable._value is None:
        raise ValueError(
            "`set_temperature` was called while a JAX `fit` holds the "
            "model's variables: the value would be lost at the end of the "
            "epoch. Read `self.model` in the callback first (it syncs the "
            "state), or call `model.jax_state_sync()`. Received: "
            f"value={value!r}"
        )
    variable.assign(float(value))


def noise_seed(seed):
    """The Gumbel noise generator's seed for the layer's `seed`.

    MHA seeds its dropout with `seed` itself. A generator with the same
    seed draws the same uniforms, so dropout removed exactly the keys with
    the lowest (TensorFlow) or highest (JAX, PyTorch) Gumbel noise. The
    noise gets a seed mixed from `seed` (a Weyl-sequence multiply) instead;
    `None` stays `None` (a random seed).
    """
    if seed is None:
        return None
    # An odd multiplier modulo 2**31: a bijection of the seed range, so
    # distinct seeds keep distinct noise (`% (2**31 - 1)` merged seeds
    # 2**31 - 1 apart).
    return (seed * 0x9E3779B1 + 0x632BE5AB) % 2**31


def training_noise(scores, temperature, seed_generator):
    """Gumbel noise shaped like `scores` and the floored temperature."""
    noise = gumbel_from_uniform(
        distributed_uniform(ops.shape(scores), seed_generator)
    )
    return noise, ops.maximum(temperature, MIN_TEMPERATURE)


def gumbel_training_weights(
    scores, mask, temperature, seed_generator, straight=False
):
    """Training weights: a relaxed (or straight-through) Gumbel-softmax sample.

    Args:
        scores: float32 `(B, N, T, S)`.
        mask: boolean `(B, 1, T, S)` or `None`.
        temperature: scalar (e.g. the layer's temperature variable), floored
            at `MIN_TEMPERATURE`.
        seed_generator: `keras.random.SeedGenerator` (advanced per call).
        straight: bool. One-hot forward, relaxed gradient.

    Returns:
        float32 weights shaped like `scores`.
    """
    noise, temperature = training_noise(scores, temperature, seed_generator)
    logits = relaxed_logits(scores, noise, temperature, mask)
    weights = sample_of_logits(logits, mask)
    if straight:
        # The folded path's pick: argmax of the logits.
        weights = straight_through(weights, mask, logits)
    return weights


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class GumbelDiscreteAttention(VariantAttention):
    """Discrete attention: each query reads one key's value.

    A drop-in `keras.layers.MultiHeadAttention` (same call signature and
    projection weights, plus a `temperature` variable) whose weights are a
    Gumbel-softmax sample instead of a softmax (Kinley, chapter 3.3). In
    training each row of weights is the relaxed sample over the valid keys

    `A = softmax((log_softmax(s) + g) / temperature)`, `g = -log(-log(U))`,

    computed in float32 with clamped logs; with `straight_through=True` the
    forward weights are `one_hot(argmax(A))` and the gradient is `A`'s. At
    inference `inference_mode` picks:

    - `"argmax"`: one-hot at the noise-free argmax. The output is computed
      as a gather of one value row per query (no `S`-long weighted sum),
      so it is deterministic and exactly one value row through the output
      projection.
    - `"sample"`: one-hot at a Gumbel-max sample `z ~ Cat(softmax(s))`,
      also computed as a gather.
    - `"soft"`: the plain softmax (as `keras.layers.MultiHeadAttention`).

    Masked (padded, future) keys are never selected; a query with no valid
    key gives zero weights and a zero context. `temperature` is a
    non-trainable float32 variable, so a schedule (see
    `keras_attnvariants.callbacks.temperature_schedule`) changes it inside
    a compiled `fit`. Noise comes from a `keras.random.SeedGenerator`
    seeded by `seed`, hashed with each score's index
    (`ops.gumbel.positional_uniform`), so a sample on real tokens does
    not change with the padding after them (attention `dropout` is drawn
    the same way, see `VariantAttention`); under `tf.distribute` each
    replica draws different noise.

    Args:
        num_heads: int. Number of attention heads.
        key_dim: int. Size of each head for query and key.
        temperature: float > 0. Initial temperature of the relaxed sample
            (the thesis uses 1). Defaults to `1.0`.
        straight_through: bool. One-hot forward weights in training, with
            the relaxed sample's gradient. Defaults to `False`.
        inference_mode: one of `"argmax"`, `"sample"`, `"soft"`. Defaults
            to `"argmax"`.
        seed: int in `[0, 2**31)` or `None`. Seeds the Gumbel noise (through
            `noise_seed`, so that it is independent of MHA's dropout, which
            this seed also seeds). Defaults to `None`.
        attention_losses, self_attention_padding, attention_path: as in
            `VariantAttention` (`attention_path` is ignored: there is no
            fused kernel; when the weights are not returned, the relaxed
            sample is folded into the value product).
        **kwargs: every other `keras.layers.MultiHeadAttention` argument
            (see `VariantAttention`).

    Call arguments:
        Those of `keras.layers.MultiHeadAttention`.

    Returns:
        `attention_output` `(B, T, dim)` and, with
        `return_attention_scores=True`, the weights used `(B, N, T, S)`:
        rows are distributions over the valid keys (training, `"soft"`) or
        exactly one-hot (`"argmax"`, `"sample"`, straight-through).

    Example:

    >>> import numpy as np
    >>> from keras_attnvariants.layers.gumbel_discrete_attention import (
    ...     GumbelDiscreteAttention,
    ... )
    >>> layer = GumbelDiscreteAttention(num_heads=2, key_dim=4, seed=1)
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> out, w = layer(x, x, return_attention_scores=True)
    >>> tuple(out.shape), sorted(set(np.asarray(w).ravel().tolist()))
    ((2, 5, 8), [0.0, 1.0])

    Reference:
        Kinley, "Two-Stream Transformer Architecture With Discrete
        Attention for Better Interpretrability and Separation of Model
        Concerns", 2020; Jang, Gu, Poole, "Categorical Reparameterization
        with Gumbel-Softmax", 2017.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        temperature=1.0,
        straight_through=False,
        inference_mode="argmax",
        seed=None,
        **kwargs,
    ):
        check_temperature(temperature)
        if inference_mode not in INFERENCE_MODES:
            raise ValueError(
                f"`inference_mode` must be one of {INFERENCE_MODES}. "
                f"Received: inference_mode={inference_mode!r}"
            )
        seed = check_seed(seed)
        super().__init__(
            num_heads=num_heads, key_dim=key_dim, seed=seed, **kwargs
        )
        self.straight_through = check_bool("straight_through", straight_through)
        self.inference_mode = inference_mode
        self.initial_temperature = float(temperature)
        # Keras's automatic name: a fixed one gave every Gumbel layer of a
        # model the same variable path (`get_state_tree` raised).
        self.seed_generator = keras.random.SeedGenerator(noise_seed(seed))

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        # One extra variable: Keras lists it before the projections' in
        # `get_weights()` (a layer's own variables come first).
        self.temperature = self.add_weight(
            name="temperature",
            shape=(),
            initializer=keras.initializers.Constant(self.initial_temperature),
            dtype="float32",
            trainable=False,
            autocast=False,
        )

    def set_temperature(self, value):
        """Sets the temperature (a float > 0); works inside a compiled `fit`.

        Before the layer is built this sets the value `build` starts from.
        """
        check_temperature(value)
        if self.built:
            assign_temperature(self.temperature, value)
        else:
            self.initial_temperature = float(value)

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
        # mask: (B, 1, T, S) or None; scores: (B, N, T, S) float32
        mask = self._prepare_mask(attention_mask, query, key)
        scores = self.attention_logits(query, key)
        if not training and self.inference_mode != "soft":
            if self._losses_active(training):
                # Symbolic build only: create the attached terms' weights.
                self._apply_attention_losses(
                    masked_softmax(scores, mask), query, key, mask
                )
            return self._one_hot_attention(
                scores, value, mask, return_attention_scores
            )
        with_losses = self._losses_active(training)
        if not self._need_weights(
            return_attention_scores, with_losses, training
        ):
            # Nobody needs the weights: fold them into the value product.
            if with_losses:
                self._apply_attention_losses(None, query, key, mask)
            if not training:
                return softmax_attend(scores, value, mask), None
            noise, temperature = training_noise(
                scores, self.temperature, self.seed_generator
            )
            if self.straight_through:
                output = straight_through_gumbel_attend(
                    scores, value, noise, temperature, mask
                )
            else:
                output = relaxed_gumbel_attend(
                    scores,
                    value,
                    noise,
                    temperature,
                    mask,
                    self._dropout_keep(scores, training),
                )
            return output, None
        if training:
            weights = gumbel_training_weights(
                scores,
                mask,
                self.temperature,
                self.seed_generator,
                self.straight_through,
            )
        else:
            weights = masked_softmax(scores, mask)
        if with_losses:
            self._apply_attention_losses(weights, query, key, mask)
        return self._attend(weights, value, training)

    def _folds_dropout(self):
        # The relaxed sample folds dropout into the value product; the
        # straight-through one gathers rows and drops on its weights.
        return not self.straight_through

    def _one_hot_attention(self, scores, value, mask, return_scores):
        """Inference `"argmax"` / `"sample"`: a gather of one value row."""
        # Selection is shift-invariant per row: no log_softmax needed.
        logits = selection_logits(scores, mask)
        if self.inference_mode == "sample":
            # Masked entries stay at -inf; valid ones stay finite.
            logits = logits + gumbel_from_uniform(
                distributed_uniform(ops.shape(scores), self.seed_generator)
            )
        # indices: (B, N, T); output: (B, T, N, H)
        indices = argmax_indices(logits)
        output = gather_values(
            value, indices, rows_with_valid_key(mask, indices)
        )
        weights = None
        if return_scores:
            weights = one_hot_at(indices, ops.shape(scores)[-1], mask)
            weights = ops.cast(weights, self.compute_dtype)
        return output, weights

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "temperature": self.initial_temperature,
                "straight_through": self.straight_through,
                "inference_mode": self.inference_mode,
            }
        )
        return config
