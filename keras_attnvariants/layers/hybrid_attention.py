"""`HybridAttention`: a learned per-head mix of softmax and DNAS."""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attnvariants.layers.doubly_normalized_attention import (
    fused_biased_attention,
)
from keras_attnvariants.layers.doubly_normalized_attention import (
    fused_kernel_takes,
)
from keras_attnvariants.layers.doubly_normalized_attention import kernel_inputs
from keras_attnvariants.layers.doubly_normalized_attention import key_bias
from keras_attnvariants.layers.variant_attention import VariantAttention
from keras_attnvariants.ops.combine import hybrid_attend
from keras_attnvariants.ops.normalization import hybrid_normalize
from keras_attnvariants.ops.normalization import math_dtype
from keras_attnvariants.validation import check_int


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class UnitInterval(keras.constraints.Constraint):
    """Clips a weight to `[0, 1]` after each update (0 and 1 reachable)."""

    def __call__(self, w):
        return ops.clip(w, 0.0, 1.0)

    def get_config(self):
        return {}


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class HybridAttention(VariantAttention):
    """Hybrid normalized attention (HNAS): softmax and DNAS mixed per head.

    A drop-in `keras.layers.MultiHeadAttention` whose weights are

    `A = u_h * A_DNAS + (1 - u_h) * A_softmax` (paper Eq. 12),

    with one trainable `u_h` in `[0, 1]` per head (clipped after each update,
    so it can sit exactly at 0 or 1). At `u = 0` the layer equals
    `keras.layers.MultiHeadAttention` with the same weights, which makes
    converting a pretrained model lossless; at `u = 1` it equals
    `DoublyNormalizedAttention`. Like DNAS it is not causal.

    Args:
        num_heads: int. Number of attention heads.
        key_dim: int. Size of each head for query and key.
        hybrid_init: float in `[0, 1]`. Initial `u` of every head (paper:
            0.5 for VQA, 0.1 for summarization). Defaults to `0.5`.
        iterations: int >= 1. Sinkhorn iterations of the DNAS part.
            Defaults to `1`.
        attention_losses, self_attention_padding, attention_path: as in
            `DoublyNormalizedAttention`.
        **kwargs: every other `keras.layers.MultiHeadAttention` argument
            (see `VariantAttention`).

    Call arguments:
        Those of `keras.layers.MultiHeadAttention`.

    Returns:
        `attention_output` `(B, T, dim)` and, with
        `return_attention_scores=True`, the weights used `(B, N, T, S)`.

    Example:

    >>> import numpy as np
    >>> import keras_attnvariants as kav
    >>> layer = kav.HybridAttention(num_heads=2, key_dim=4, hybrid_init=0.1)
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> tuple(layer(x, x).shape)
    (2, 5, 8)
    >>> [round(float(u), 2) for u in layer.hybrid_weights]
    [0.1, 0.1]

    Reference:
        Ding, Soricut et al., "Attention that does not Explain Away", 2020.
    """

    supports_causal = False
    causal_error_reason = (
        "its DNAS part normalizes each key over all queries, including "
        "future ones."
    )

    def __init__(
        self, num_heads, key_dim, hybrid_init=0.5, iterations=1, **kwargs
    ):
        # NumPy scalars too: `np.float32(0.5)` is no Python `float`.
        if isinstance(hybrid_init, (bool, np.bool_)) or not isinstance(
            hybrid_init, numbers.Real
        ):
            raise ValueError(
                "`hybrid_init` must be a float in [0, 1]. "
                f"Received: hybrid_init={hybrid_init!r}"
            )
        if not 0.0 <= hybrid_init <= 1.0:
            raise ValueError(
                "`hybrid_init` must be in [0, 1]. "
                f"Received: hybrid_init={hybrid_init}"
            )
        iterations = check_int("iterations", iterations)
        super().__init__(num_heads=num_heads, key_dim=key_dim, **kwargs)
        self.hybrid_init = float(hybrid_init)
        self.iterations = iterations

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        self.hybrid_weight = self.add_weight(
            name="hybrid_weight",
            shape=(self._num_heads,),
            # `Constant` casts through float32 (a float64 `u` started at
            # 0.30000001 for 0.3); `full` converts the value to the
            # variable's dtype directly.
            initializer=lambda shape, dtype: ops.full(
                shape, self.hybrid_init, dtype
            ),
            constraint=UnitInterval(),
            trainable=True,
            autocast=False,
        )

    @property
    def hybrid_weights(self):
        """The per-head mixing weights `u` the layer uses, shape
        `(num_heads,)`: the variable clipped to `[0, 1]`, as in `call` (a
        value assigned by hand is not clipped until the next update)."""
        return np.clip(ops.convert_to_numpy(self.hybrid_weight), 0.0, 1.0)

    def _mix(self):
        # u: (N, 1, 1), float32 (float64 under a float64 policy), clipped
        # in case it was assigned by hand.
        # The clip passes the gradient straight through: JAX splits a
        # clip's gradient 50/50 at the bounds, which halved it at u = 0
        # (`hybrid_init=0.0`, the lossless conversion) and u = 1.
        u = ops.cast(self.hybrid_weight, math_dtype(self.compute_dtype))
        u = u + ops.stop_gradient(ops.clip(u, 0.0, 1.0) - u)
        return ops.reshape(u, (self._num_heads, 1, 1))

    def normalize(self, scores, mask):
        return hybrid_normalize(scores, self._mix(), mask, self.iterations)

    def normalize_and_attend(self, scores, value, mask, training):
        if self.iterations != 1 or self._normalize_overridden():
            return None
        keep = self._dropout_keep(scores, training)
        return hybrid_attend(scores, value, self._mix(), mask, keep)

    def _folds_dropout(self):
        return True

    def fused_attention(self, query, key, value, mask):
        if self.iterations != 1 or not fused_kernel_takes(key, value):
            return None
        out_dtype = value.dtype
        query, key, value = kernel_inputs(query, key, value)
        bias = key_bias(self, query, key, mask)
        dnas = fused_biased_attention(self, query, key, value, mask, bias)
        unas = fused_biased_attention(self, query, key, value, mask, None)
        # u: (1, 1, N, 1) in the output layout (B, T, N, H).
        u = ops.cast(ops.reshape(self._mix(), (1, 1, -1, 1)), dnas.dtype)
        return ops.cast(unas + u * (dnas - unas), out_dtype)

    def get_config(self):
        config = super().get_config()
        config["hybrid_init"] = self.hybrid_init
        config["iterations"] = self.iterations
        return config
