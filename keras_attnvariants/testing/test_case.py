"""`TestCase`: Keras's layer test harness plus the checks it lacks."""

import inspect
import os

import keras
import numpy as np
from keras.src.testing import TestCase as KerasTestCase


class TestCase(KerasTestCase):
    """Keras's `TestCase` (`run_layer_test`, `assertAllClose`, ...) plus:

    - `assert_config_covers_init_args`: `get_config` holds every `__init__`
      argument of the class and its bases up to `keras.layers.Layer`.
    - `assert_mixed_precision_outputs`: under `mixed_float16`,
      `mixed_bfloat16` and `bfloat16` (bfloat16 variables too) every
      output is in the compute dtype and finite (so it is for layers whose
      outputs are all floating: outputs and attention scores).
    - `run_multi_input_training_step`: a functional model around a
      multi-input layer takes a few `fit` steps; the loss is finite and
      every trainable weight changes (Adam moves each one with a gradient).
    - `assert_keras_save_load_parity`: a `.keras` round trip of a model gives
      identical outputs and preserves the layer classes.
    """

    def assert_config_covers_init_args(self, layer):
        config = layer.get_config()
        missing = []
        for cls in type(layer).__mro__:
            if cls in (keras.layers.Layer, keras.layers.MultiHeadAttention):
                break
            if "__init__" not in vars(cls):
                continue
            params = inspect.signature(cls.__init__).parameters.values()
            for param in params:
                if param.name == "self" or param.kind in (
                    param.VAR_KEYWORD,
                    param.VAR_POSITIONAL,
                ):
                    continue
                if param.name not in config:
                    missing.append(f"{cls.__name__}.{param.name}")
        self.assertEqual(
            missing, [], f"get_config() misses __init__ args: {missing}"
        )

    def assert_mixed_precision_outputs(
        self, layer_cls, init_kwargs, inputs, call_kwargs=None
    ):
        for policy in ("mixed_float16", "mixed_bfloat16", "bfloat16"):
            if policy == "mixed_float16" and keras.backend.backend() == "torch":
                # Torch CPU kernels lack float16 matmuls; Keras skips too.
                continue
            layer = layer_cls(**init_kwargs, dtype=policy)
            outputs = layer(*inputs, **(call_kwargs or {}))
            for out in keras.tree.flatten(outputs):
                self.assertEqual(
                    keras.backend.standardize_dtype(out.dtype),
                    layer.compute_dtype,
                    f"output leaks {out.dtype} under {policy}",
                )
                values = keras.ops.convert_to_numpy(
                    keras.ops.cast(out, "float32")
                )
                self.assertTrue(
                    np.all(np.isfinite(values)), f"non-finite under {policy}"
                )

    def run_multi_input_training_step(
        self, build_outputs, input_data, steps=3, jit_compile="auto"
    ):
        """Trains `keras.Model(inputs, build_outputs(inputs))` a few steps.

        Args:
            build_outputs: function mapping a list of `keras.Input` to one
                output tensor.
            input_data: list of NumPy arrays (the model's inputs).
        """
        inputs = [
            keras.Input(shape=x.shape[1:], dtype=str(x.dtype))
            for x in input_data
        ]
        model = keras.Model(inputs, build_outputs(inputs))
        model.compile(optimizer="adam", loss="mse", jit_compile=jit_compile)
        target = np.zeros(
            keras.ops.convert_to_numpy(model(input_data)).shape, "float32"
        )
        before = [np.array(w) for w in model.trainable_weights]
        history = model.fit(
            input_data,
            target,
            batch_size=len(target),
            epochs=steps,
            verbose=0,
        )
        losses = history.history["loss"]
        self.assertTrue(np.all(np.isfinite(losses)), f"losses: {losses}")
        # Adam moves every weight whose gradient is not zero: one that did
        # not move got no gradient (e.g. a stopped or dropped path).
        unchanged = [
            w.path
            for w, b in zip(model.trainable_weights, before)
            if np.allclose(np.array(w), b)
        ]
        self.assertEqual(unchanged, [], "weights that did not train")
        return model, history

    def assert_keras_save_load_parity(self, model, inputs, atol=1e-6):
        path = os.path.join(self.get_temp_dir(), "model.keras")
        model.save(path)
        reloaded = keras.saving.load_model(path)
        self.assertAllClose(
            keras.tree.map_structure(keras.ops.convert_to_numpy, model(inputs)),
            keras.tree.map_structure(
                keras.ops.convert_to_numpy, reloaded(inputs)
            ),
            atol=atol,
        )
        original = sorted(type(layer).__name__ for layer in model.layers)
        restored = sorted(type(layer).__name__ for layer in reloaded.layers)
        self.assertEqual(original, restored)
        return reloaded
