"""Private MultiHeadAttention members our subclasses rely on.

If a Keras release renames or changes them, this fails loudly; pin the
Keras range in pyproject.toml accordingly.
"""

import inspect
import os

import keras
import numpy as np

from keras_attnvariants.testing.test_case import TestCase


class MultiHeadAttentionContractTest(TestCase):
    def test_private_members_exist_with_expected_meaning(self):
        layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
        x = np.zeros((1, 4, 5), "float32")
        layer(x, x)
        self.assertEqual(layer._dot_product_equation, "aecd,abcd->acbe")
        self.assertEqual(layer._combine_equation, "acbe,aecd->abcd")
        self.assertAllClose(layer._inverse_sqrt_key_dim, 1 / np.sqrt(3))
        for name in (
            "_dropout_layer",
            "_query_dense",
            "_key_dense",
            "_value_dense",
            "_output_dense",
            "_num_heads",
            "_key_dim",
            "_dropout",
            "_compute_causal_mask",
        ):
            self.assertTrue(hasattr(layer, name), name)

    def test_compute_attention_signature(self):
        params = list(
            inspect.signature(
                keras.layers.MultiHeadAttention._compute_attention
            ).parameters
        )
        self.assertEqual(
            params[:7],
            [
                "self",
                "query",
                "key",
                "value",
                "attention_mask",
                "training",
                "return_attention_scores",
            ],
        )
        call_params = inspect.signature(
            keras.layers.MultiHeadAttention.call
        ).parameters
        self.assertIn("value_mask", call_params)
        self.assertIn("use_causal_mask", call_params)

    def test_layer_loss_clearing_hook_exists(self):
        # `KeepsStepLosses` overrides `Layer._clear_losses` (keeping a
        # shared layer's losses over one JAX train step); a rename in Keras
        # would make the override dead code.
        self.assertTrue(callable(getattr(keras.layers.Layer, "_clear_losses")))
        self.assertEqual(
            list(
                inspect.signature(keras.layers.Layer._clear_losses).parameters
            ),
            ["self"],
        )

    def test_mha_clears_its_inputs_keras_masks(self):
        # `VariantAttention.call` puts the inputs' Keras masks back after
        # `MultiHeadAttention.call` (Keras 3.15 sets them to None in place,
        # so a second layer on the same tensor ran unmasked). Uses the
        # private `get_keras_mask` / `set_keras_mask`; when Keras stops
        # clearing the masks, the restore can go.
        from keras.src.backend.common.masking import get_keras_mask
        from keras.src.backend.common.masking import set_keras_mask

        x = keras.ops.convert_to_tensor(np.ones((1, 3, 4), "float32"))
        mask = keras.ops.convert_to_tensor(np.array([[True, True, False]]))
        set_keras_mask(x, mask)
        self.assertIs(get_keras_mask(x), mask)
        layer = keras.layers.MultiHeadAttention(num_heads=1, key_dim=2)
        layer(x, x)
        self.assertIsNone(get_keras_mask(x))

    def test_tensorflow_bias_add_of_a_one_wide_head(self):
        # Keras 3.15's TensorFlow `ops.add` turns `x + bias` into
        # `tf.nn.bias_add(..., "NCHW")` when the bias squeezes to one axis
        # whose size is `x.shape[1]`: an `EinsumDense` bias `(N, 1)`
        # (`key_dim=1` / `value_dim=1`) on `(B, T, N, 1)` with a static
        # `T == N` is added along the sequence axis. Keras MHA and these
        # layers alike (README, "DoublyNormalizedAttention and
        # HybridAttention"); when this fails, Keras fixed it: drop the note.
        if keras.backend.backend() != "tensorflow":
            self.skipTest("TensorFlow's ops.add only")
        from keras_attnvariants import DoublyNormalizedAttention

        x = np.zeros((1, 3, 3, 1), "float32")
        bias = np.array([[1.0], [2.0], [3.0]], "float32")
        got = keras.ops.convert_to_numpy(keras.ops.add(x, bias))
        self.assertAllClose(got[0, :, :, 0], np.repeat(bias, 3, axis=1))
        self.assertNotAllClose(got, x + bias)
        inputs = np.random.default_rng(0).normal(size=(1, 3, 4))
        inputs = inputs.astype("float32")
        # Projections x . 1 + bias with bias (N, 1) = (1, 2, 3).
        want = np.sum(inputs, -1)[..., None, None] + bias
        for cls in (keras.layers.MultiHeadAttention, DoublyNormalizedAttention):
            layer = cls(num_heads=3, key_dim=1, kernel_initializer="ones")
            layer(inputs, inputs)
            layer._query_dense.bias.assign(bias)
            got = keras.ops.convert_to_numpy(layer._query_dense(inputs))
            self.assertNotAllClose(got, want)
            # ... added along the sequence axis instead.
            along_t = np.broadcast_to(bias[None, :, :, None], got.shape)
            self.assertAllClose(got, want - bias + along_t)

    def test_int8_mha_does_not_reload_from_keras_file(self):
        # Keras 3.15: a model whose MHA was quantized saves, but its
        # projections reload unquantized and the int8 weights fail to
        # load; the README says to export such a model instead (tested in
        # `tests/review_export_test.py`). When this fails, Keras fixed it.
        inputs = keras.Input((4, 8))
        layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
        model = keras.Model(inputs, layer(inputs, inputs))
        model.quantize("int8")
        path = os.path.join(self.get_temp_dir(), "int8_mha.keras")
        model.save(path)
        with self.assertRaisesRegex(ValueError, "could not be loaded"):
            keras.saving.load_model(path)

    def test_layers_warn_of_a_misadded_bias_on_tensorflow(self):
        # The canary above, said to the user at build time (once per
        # layer): silent wrong numbers otherwise. Nothing to say on JAX and
        # PyTorch, or where no bias squeezes to a non-last axis.
        import warnings

        import keras_attnvariants as kav

        x = np.zeros((1, 3, 4), "float32")
        cases = [
            (lambda: kav.DoublyNormalizedAttention(3, 1), "(3, 1)"),
            (lambda: kav.HybridAttention(3, 2, value_dim=1), "(3, 1)"),
            (
                lambda: kav.GumbelDiscreteAttention(3, 2, output_shape=(3, 1)),
                "(3, 1)",
            ),
            (lambda: kav.HybridAttention(3, 1, use_bias=False), None),
            (lambda: kav.DoublyNormalizedAttention(3, 2), None),
            (lambda: kav.DoublyNormalizedAttention(1, 1), None),
        ]
        tensorflow = keras.backend.backend() == "tensorflow"
        for make, shape in cases:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                make()(x, x)
            said = [str(w.message) for w in caught if "Keras 3.15" in str(w)]
            if shape is None or not tensorflow:
                self.assertEqual(said, [])
            else:
                self.assertEqual(len(said), 1, said)
                self.assertIn(f"shape {shape}", said[0])
                self.assertIn("sequence length 3", said[0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kav.TwoStreamBlock(d_model=4, num_heads=4, d_ff=8)([x, x])
        said = [str(w.message) for w in caught if "Keras 3.15" in str(w)]
        self.assertEqual(len(said), int(tensorflow))
