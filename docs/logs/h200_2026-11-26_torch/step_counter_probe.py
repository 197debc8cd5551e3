"""Does a non-trainable variable advanced inside `call` keep its value
under `jit_compile=True` (torch.compile) on the PyTorch backend?

Prints one line per case: a plain Keras layer with an unconditional
`assign_add`, one conditioned on `training`, one conditioned on
`not self.losses` (as AttentionGuidanceRegularizer's step counter
was), on `not self._get_own_losses()` (the layer's own list only), on a
Python flag that `_clear_losses` resets, and the guidance term itself.
Run with KERAS_BACKEND=torch.
"""

import keras
import numpy as np
import torch

import keras_attnvariants as kav


class Counter(keras.layers.Layer):
    def __init__(self, mode, **kwargs):
        super().__init__(**kwargs)
        self.mode = mode

    _advanced = False

    def _clear_losses(self):
        self._advanced = False
        super()._clear_losses()

    def build(self, shape):
        self.n = self.add_weight(
            shape=(), initializer="zeros", trainable=False, name="n"
        )

    def call(self, x, training=None):
        if self.mode == "always":
            self.n.assign_add(1.0)
        elif self.mode == "training" and training:
            self.n.assign_add(1.0)
        elif self.mode == "losses" and training and not self.losses:
            self.n.assign_add(1.0)
        elif self.mode == "own" and training and not self._get_own_losses():
            self.n.assign_add(1.0)
        elif self.mode == "flag" and training and not self._advanced:
            self._advanced = True
            self.n.assign_add(1.0)
        if self.mode in ("losses", "own"):
            self.add_loss(ops_sum(x) * 0.0)
        return x


def ops_sum(x):
    return keras.ops.sum(x)


def counter_case(mode, jit):
    layer = Counter(mode)
    model = keras.Sequential([keras.Input((3,)), layer, keras.layers.Dense(1)])
    model.compile("sgd", "mse", jit_compile=jit)
    model.fit(np.ones((4, 3)), np.ones((4, 1)), epochs=3, verbose=0)
    return float(keras.ops.convert_to_numpy(layer.n))


def guidance_case(jit):
    reg = kav.AttentionGuidanceRegularizer(
        {0: "next"}, alpha=1.0, decay_steps=2, name="ag"
    )
    x = keras.Input((5, 8))
    mha = keras.layers.MultiHeadAttention(2, 4)
    out, weights = mha(x, x, return_attention_scores=True)
    model = keras.Model(x, {"out": out, "ag": reg(weights)})
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss={"out": "mse"},
        jit_compile=jit,
    )
    data = np.random.default_rng(0).random((2, 5, 8)).astype("float32")
    model.fit(data, {"out": np.zeros_like(data)}, epochs=3, verbose=0)
    return float(keras.ops.convert_to_numpy(reg.step))


print("torch", torch.__version__, "device", keras.ops.ones(1).device)
for jit in (False, True):
    for mode in ("always", "training", "losses", "own", "flag"):
        try:
            got = counter_case(mode, jit)
        except Exception as e:  # noqa: BLE001 (a probe: report and go on)
            got = f"{type(e).__name__}: {str(e)[:200]}"
        print(f"jit={jit} counter[{mode}] after 3 steps: {got}")
    try:
        got = guidance_case(jit)
    except Exception as e:  # noqa: BLE001
        got = f"{type(e).__name__}: {str(e)[:200]}"
    print(f"jit={jit} guidance step after 3 steps: {got}")
