"""A user-written term holding a sublayer of its own, in a functional model.

Keras MHA's `compute_output_spec` infers shapes without running `call`, so
such a term (a `Dense` built at its first call) stayed unbuilt until the
first training step. A `.keras` file saved before training held no weights
for it, and a reload of a trained model refused the file ("could not be
loaded: Dense name=projection, built=False"): the term had been rebuilt
from its `build_config` by Keras's default `build`, which marked it built
with the `Dense` unbuilt.
"""

import os

import keras
import numpy as np

import keras_attnvariants as kav
from keras_attnvariants.testing.terms import ProjectedQueryTerm
from keras_attnvariants.testing.test_case import TestCase


def _model(term):
    inputs = keras.Input((4, 8))
    layer = kav.HybridAttention(2, 4, attention_losses=[term], name="hnas")
    return keras.Model(inputs, layer(inputs, inputs))


class TermSublayerTest(TestCase):
    def test_functional_build_builds_the_term(self):
        term = ProjectedQueryTerm(name="probe")
        _model(term)
        self.assertTrue(term.projection.built)
        # The paths a first training call gives them.
        self.assertEqual(
            [w.path for w in term.weights],
            [
                "hnas/probe/projection/kernel",
                "hnas/probe/projection/bias",
            ],
        )

    def test_trained_term_survives_a_keras_reload(self):
        term = ProjectedQueryTerm(name="probe")
        model = _model(term)
        model.compile(optimizer="adam", loss="mse")
        x = np.random.default_rng(0).random((4, 4, 8)).astype("float32")
        model.fit(x, x, epochs=2, verbose=0)
        path = os.path.join(self.get_temp_dir(), "model.keras")
        model.save(path)
        reloaded = keras.saving.load_model(path)
        self.assertEqual(
            [w.path for w in reloaded.weights], [w.path for w in model.weights]
        )
        for want, got in zip(model.get_weights(), reloaded.get_weights()):
            self.assertAllClose(got, want)
        # The term computes the same loss from the same queries.
        query = np.random.default_rng(1).random((2, 4, 2, 4)).astype("float32")
        again = reloaded.layers[-1].attention_losses[0]
        self.assertAllClose(again(query), term(query))
