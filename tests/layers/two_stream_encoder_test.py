import keras
import numpy as np

from keras_attnvariants.callbacks.temperature_schedule import gumbel_layers
from keras_attnvariants.layers.two_stream_encoder import TwoStreamEncoder
from keras_attnvariants.testing.test_case import TestCase

TOKENS = np.array([[3, 4, 5, 6, 0], [1, 2, 3, 0, 0]], "int32")


def tiny_encoder(num_layers, **kwargs):
    """A `TwoStreamEncoder` of vocabulary 10, length 5, width 8, 2 heads."""
    return TwoStreamEncoder(
        10, 5, num_layers, d_model=8, num_heads=2, d_ff=16, **kwargs
    )


def classifier(encoder, views=1):
    inputs = [keras.Input((5,), dtype="int32") for _ in range(views)]
    head = keras.layers.Dense(5)
    outputs = [head(encoder(x, view=v)[:, 0]) for v, x in enumerate(inputs)]
    model = keras.Model(inputs, outputs if views > 1 else outputs[0])
    # The head gives logits. (As probabilities they would be clipped, and
    # an example whose true-class output is clipped has no gradient.)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile("adam", loss, jit_compile=False)
    return model


class TwoStreamEncoderTest(TestCase):
    def test_multiview_model_trains_and_round_trips(self):
        encoder = tiny_encoder(1, num_views=2, seed=0)
        model = classifier(encoder, views=2)
        labels = np.array([1, 2])
        history = model.fit(
            [TOKENS, TOKENS], [labels, labels], epochs=1, verbose=0
        )
        self.assertTrue(np.all(np.isfinite(history.history["loss"])))
        self.assert_keras_save_load_parity(model, [TOKENS, TOKENS], atol=1e-5)

    def test_every_weight_learns(self):
        # The last block has no controller update (it would never be
        # read), so no weight is left without a gradient: one Adam step
        # moves every trainable weight.
        for views in (1, 2):
            encoder = tiny_encoder(2, num_views=views)
            model = classifier(encoder, views=views)
            labels = np.array([1, 2])
            inputs = [TOKENS] * views if views > 1 else TOKENS
            targets = [labels] * views if views > 1 else labels
            model(inputs)
            before = [
                np.array(keras.ops.convert_to_numpy(w), copy=True)
                for w in model.trainable_weights
            ]
            model.fit(inputs, targets, epochs=1, verbose=0)
            frozen = [
                w.path
                for w, old in zip(model.trainable_weights, before)
                if np.array_equal(keras.ops.convert_to_numpy(w), old)
            ]
            self.assertEqual(frozen, [])
            last = encoder.blocks[-1]
            self.assertFalse(last.update_controller)
            self.assertTrue(encoder.blocks[0].update_controller)

    def test_separate_embeddings_and_config(self):
        shared = tiny_encoder(1)
        separate = tiny_encoder(1, share_embeddings=False)
        shared(TOKENS)
        separate(TOKENS)
        self.assertEqual(
            len(separate.trainable_weights), len(shared.trainable_weights) + 2
        )
        self.assert_config_covers_init_args(separate)

    def test_receptive_field_loss_added_in_training_only(self):
        encoder = tiny_encoder(
            2,
            mode="single_stream",
            receptive_field_coefficient=0.1,
        )
        encoder(TOKENS, use_causal_mask=True)
        self.assertEqual(len(encoder.losses), 0)
        _, attentions = encoder(
            TOKENS, use_causal_mask=True, training=True, return_attention=True
        )
        self.assertEqual(len(encoder.losses), 1)
        loss = float(keras.ops.convert_to_numpy(encoder.losses[0]))
        # Mean field size lies in [1, T] per position; times 0.1.
        self.assertTrue(0.1 <= loss <= 0.5)
        # Exactly 0.1 * the mean over real positions of the soft field size
        # after both layers (appendix recursion, padding left out).
        valid = TOKENS != 0
        pair = (valid[:, :, None] & valid[:, None, :]).astype("float64")
        fields = np.eye(5)[None] * pair
        for z in attentions:
            z = keras.ops.convert_to_numpy(z).astype("float64").sum(1)
            fields = np.minimum(fields + (z * pair) @ fields, 1.0)
        sizes = (fields.sum(-1) * valid).sum(-1) / valid.sum(-1)
        self.assertAllClose(loss, 0.1 * sizes.mean(), atol=1e-5)
        self.assertEqual(len(attentions), 2)
        # The temperature schedule finds every block.
        self.assertEqual(len(gumbel_layers(classifier(encoder))), 2)

    def test_invalid_arguments(self):
        with self.assertRaisesRegex(ValueError, "num_views"):
            TwoStreamEncoder(10, 5, 1, num_views=2, mode="single_stream")
        with self.assertRaisesRegex(ValueError, "receptive_field_reduction"):
            TwoStreamEncoder(10, 5, 1, receptive_field_reduction="max")

    def test_functional_model_returns_every_layers_attention(self):
        encoder = tiny_encoder(3)
        tokens = keras.Input((5,), dtype="int32")
        h, attentions = encoder(tokens, return_attention=True)
        model = keras.Model(tokens, [h, *attentions])
        h_eager, z_eager = encoder(TOKENS, return_attention=True)
        got = model(TOKENS)
        for a, b in zip(got, [h_eager, *z_eager]):
            self.assertAllClose(a, b, atol=1e-6)

    def test_float_ids_read_as_the_embeddings_read_them(self):
        # 0.4 was a real token for the padding mask but embedded as id 0
        # (padding): its output differed from the int ids'.
        encoder = tiny_encoder(2)
        floats = TOKENS.astype("float32")
        floats[0, 4] = 0.4
        floats[1, 1] = 2.7
        self.assertAllClose(
            encoder(floats), encoder(np.trunc(floats).astype("int32"))
        )

    def test_invalid_input_shapes_and_arguments_raise(self):
        encoder = TwoStreamEncoder(10, 4, 1, d_model=8, num_heads=2, d_ff=16)
        # Longer than max_length: JAX would clamp the position lookups.
        with self.assertRaisesRegex(ValueError, "max_length=4"):
            encoder(np.ones((1, 6), "int32"))
        encoder(np.ones((1, 4), "int32"))
        with self.assertRaisesRegex(ValueError, "max_length=4"):
            encoder(np.ones((1, 5), "int32"))  # after build too
        with self.assertRaisesRegex(ValueError, "token_ids"):
            encoder(np.ones((1, 3, 2), "int32"))
        with self.assertRaisesRegex(ValueError, "d_model"):
            TwoStreamEncoder(10, 5, 1, d_model=0)
        for bad in ("a", float("inf"), -1.0):
            with self.assertRaisesRegex(
                ValueError, "receptive_field_coefficient"
            ):
                TwoStreamEncoder(10, 5, 1, receptive_field_coefficient=bad)
        with self.assertRaisesRegex(ValueError, "seed"):
            TwoStreamEncoder(10, 5, 1, seed="0")
        # A float view passed the range check, then failed with a TypeError
        # indexing the controllers.
        for bad in (0.5, True, 1):
            with self.assertRaisesRegex(ValueError, "`view` must be an int"):
                encoder(np.ones((1, 4), "int32"), view=bad)

    def test_each_block_draws_from_its_own_seed(self):
        # One seed for every block made every layer draw the same Gumbel
        # noise: their samples were perfectly correlated.
        def seeds(seed):
            encoder = TwoStreamEncoder(
                10, 6, 3, d_model=8, num_heads=2, d_ff=16, seed=seed
            )
            return [block.seed for block in encoder.blocks]

        self.assertLen(set(seeds(0)), 3)
        self.assertEqual(seeds(0), seeds(0))
        self.assertNotEqual(seeds(0), seeds(1))

    def test_mask_zero_lets_pooling_skip_padding(self):
        # Without a Keras mask, pooling after the encoder averaged padded
        # positions in, so the pooled output depended on the padding.
        def pooled(mask_zero, length):
            keras.utils.set_random_seed(0)
            encoder = TwoStreamEncoder(
                10,
                8,
                2,
                d_model=8,
                num_heads=2,
                d_ff=16,
                seed=0,
                mask_zero=mask_zero,
            )
            tokens = keras.Input((length,), dtype="int32")
            h, attentions = encoder(tokens, return_attention=True)
            pooled = keras.layers.GlobalAveragePooling1D()(h)
            model = keras.Model(tokens, [pooled, *attentions])
            ids = np.zeros((1, length), "int32")
            ids[0, :3] = [3, 4, 5]
            return model, model.predict(ids, verbose=0)[0]

        model, short = pooled(True, 4)
        _, long = pooled(True, 8)
        self.assertAllClose(short, long, atol=1e-5)
        _, unmasked_short = pooled(False, 4)
        _, unmasked_long = pooled(False, 8)
        self.assertNotAllClose(unmasked_short, unmasked_long)
        self.assertTrue(model.layers[1].get_config()["mask_zero"])
        restored = TwoStreamEncoder.from_config(model.layers[1].get_config())
        self.assertTrue(restored.mask_zero)

    def test_encoder_called_per_view_adds_both_regularizers(self):
        # Under the JAX trainer the second call of the encoder cleared the
        # first call's receptive-field loss. "union" makes the term
        # deterministic (the union of the fields covers every token), soft
        # model attention makes the training forward pass the inference one.
        keras.utils.set_random_seed(0)
        encoder = tiny_encoder(
            2,
            num_views=2,
            seed=0,
            receptive_field_coefficient=0.5,
            receptive_field_reduction="union",
            model_attention="soft",
        )
        encoder(TOKENS, training=True)
        per_call = float(keras.ops.convert_to_numpy(encoder.losses[0]))
        self.assertGreater(per_call, 0.0)
        first, second = (keras.Input((5,), dtype="int32") for _ in "ab")
        pooled = keras.layers.Concatenate()(
            [encoder(first, view=0)[:, 0], encoder(second, view=1)[:, 0]]
        )
        model = keras.Model([first, second], keras.layers.Dense(1)(pooled))
        model.compile(keras.optimizers.SGD(0.0), "mse")
        target = np.zeros((2, 1), "float32")
        loss = model.train_on_batch([TOKENS, TOKENS], target)
        mse = np.mean(np.square(model.predict([TOKENS, TOKENS], verbose=0)))
        self.assertAllClose(loss, mse + 2 * per_call, atol=1e-4)

    def test_invalid_temperature_names_the_argument(self):
        # None raised float()'s TypeError, a string a ValueError that did
        # not name the argument.
        for bad in (None, "a", 0.0, float("nan"), True):
            with self.assertRaisesRegex(
                ValueError, r"`temperature` must be .*Received: temperature="
            ):
                TwoStreamEncoder(10, 5, 1, temperature=bad)

    def test_flags_must_be_bools(self):
        # `bool("false")` made a string flag True without a word.
        for name in ("share_embeddings", "straight_through", "mask_zero"):
            for bad in ("false", 1, None):
                with self.assertRaisesRegex(
                    ValueError, rf"`{name}` must be a bool\. Received: {name}="
                ):
                    TwoStreamEncoder(10, 5, 1, **{name: bad})
        encoder = TwoStreamEncoder(
            10,
            5,
            1,
            share_embeddings=np.bool_(False),
            straight_through=True,
            mask_zero=np.bool_(True),
        )
        config = encoder.get_config()
        for name, want in (
            ("share_embeddings", False),
            ("straight_through", True),
            ("mask_zero", True),
        ):
            self.assertIs(config[name], want)
        restored = TwoStreamEncoder.from_config(config)
        self.assertIs(restored.blocks[0].straight_through, True)
        self.assertIs(restored.mask_zero, True)


def _redraw(layer, seed):
    """New random values for every weight of `layer`."""
    rng = np.random.default_rng(seed)
    layer.set_weights(
        [rng.normal(size=w.shape).astype("float32") for w in layer.weights]
    )


def _separate_multiview_encoder():
    """Two views with their own controller embeddings; "soft" model
    attention makes the model stream a smooth function of the
    controller, so any change to its input shows."""
    return tiny_encoder(
        2,
        num_views=2,
        share_embeddings=False,
        model_attention="soft",
        seed=0,
    )


class TwoStreamEncoderContractsTest(TestCase):
    """Behaviour a mutation review (2026-12-02) found unpinned: per-view
    controller embeddings, position rows, the single-stream tables,
    separate embeddings through `.keras`, symbolic dtypes under mixed
    precision, causal relaxed training, the constructor's temperature
    and dtype policy."""

    def test_each_view_reads_its_own_controller_embeddings(self):
        # With separate embeddings every view has its own controller
        # embeddings (Kinley 2020, 4.2): redrawing view 0's changes view 0
        # only, redrawing view 1's changes view 1 only.
        encoder = _separate_multiview_encoder()

        def outputs():
            return [
                keras.ops.convert_to_numpy(encoder(TOKENS, view=v))
                for v in (0, 1)
            ]

        before = outputs()
        for view in (0, 1):
            for layer in encoder.controller_embeddings[view]:
                _redraw(layer, seed=view)
            after = outputs()
            self.assertNotAllClose(after[view], before[view])
            self.assertAllClose(after[1 - view], before[1 - view])
            before = after

    def test_position_embedding_rows_up_to_the_length_are_read(self):
        # Position t reads row t of the position table: redrawing a row
        # below the length changes the output, a row past it does not.
        encoder = TwoStreamEncoder(
            10, 8, 2, d_model=8, num_heads=2, d_ff=16, model_attention="soft"
        )
        before = keras.ops.convert_to_numpy(encoder(TOKENS))
        table = encoder.model_embeddings[1]
        for row, read in ((5, False), (7, False), (0, True), (3, True)):
            rows = keras.ops.convert_to_numpy(table.embeddings).copy()
            rows[row] += 1.0
            table.embeddings.assign(rows)
            after = keras.ops.convert_to_numpy(encoder(TOKENS))
            if read:
                self.assertNotAllClose(after, before)
            else:
                self.assertAllClose(after, before)
            before = after

    def test_single_stream_has_no_controller_embeddings(self):
        # `share_embeddings` is about the controllers' embeddings: a
        # single-stream encoder has no controller, so no extra tables
        # (unused weights would never train).
        def weights(share):
            encoder = tiny_encoder(
                1,
                mode="single_stream",
                share_embeddings=share,
            )
            encoder(TOKENS)
            return [w.path.split("/", 1)[1] for w in encoder.weights]

        self.assertEqual(weights(False), weights(True))

    def test_separate_multiview_embeddings_round_trip(self):
        # `.keras` files rebuild the encoder from its config, `build` it,
        # then load the variables: the controllers' own embedding tables
        # must be in the config and created by `build`.
        encoder = _separate_multiview_encoder()
        tokens = keras.Input((5,), dtype="int32")
        model = keras.Model(
            tokens, [encoder(tokens, view=0), encoder(tokens, view=1)]
        )
        reloaded = self.assert_keras_save_load_parity(model, TOKENS, atol=1e-6)
        self.assertEqual(len(reloaded.weights), len(model.weights))

    def test_symbolic_outputs_have_the_eager_dtypes_in_mixed_precision(self):
        # The attention weights stay float32 under a mixed policy, the
        # model stream takes the compute dtype: a functional model's
        # KerasTensors must say the same.
        encoder = tiny_encoder(2, dtype="mixed_bfloat16")

        def dtypes(h, attentions):
            return [
                keras.backend.standardize_dtype(x.dtype)
                for x in (h, *attentions)
            ]

        eager = dtypes(*encoder(TOKENS, return_attention=True))
        symbolic = dtypes(
            *encoder(keras.Input((5,), dtype="int32"), return_attention=True)
        )
        self.assertEqual(eager, ["bfloat16", "float32", "float32"])
        self.assertEqual(symbolic, eager)

    def test_every_block_trains_causally_on_relaxed_samples(self):
        # In training every block draws relaxed (not one-hot) samples, and
        # with `use_causal_mask` none puts weight on a later token
        # (relaxed samples are positive on every allowed key, so a
        # missing mask shows at once).
        future = np.triu(np.ones((5, 5), bool), 1)
        for mode in ("two_stream", "single_stream"):
            encoder = tiny_encoder(2, mode=mode, seed=0)
            _, attentions = encoder(
                TOKENS,
                use_causal_mask=True,
                return_attention=True,
                training=True,
            )
            for z in attentions:
                z = keras.ops.convert_to_numpy(z)
                self.assertEqual(float(z[..., future].max()), 0.0)
                relaxed = (z > 1e-4) & (z < 1 - 1e-4)
                self.assertTrue(np.any(relaxed[..., ~future]))

    def test_constructor_temperature_reaches_every_block(self):
        # The blocks' temperature variables start at the constructor's
        # value (a sampler at 1.0 despite `temperature=0.3` read 0.3).
        encoder = tiny_encoder(2, temperature=0.3)
        encoder(TOKENS)
        for block in encoder.blocks:
            self.assertAllClose(block.temperature, 0.3)
        self.assertAllClose(encoder.temperature, 0.3)

    def test_dtype_policy_reaches_the_embedding_tables(self):
        # Under a `bfloat16` policy every table is bfloat16 (only the
        # blocks' temperatures stay float32).
        encoder = tiny_encoder(
            1,
            share_embeddings=False,
            dtype="bfloat16",
        )
        encoder(TOKENS)
        others = {
            w.path: keras.backend.standardize_dtype(w.dtype)
            for w in encoder.weights
            if not w.path.endswith("temperature")
        }
        self.assertLen(others, len(encoder.weights) - 1)
        self.assertEqual(set(others.values()), {"bfloat16"})
