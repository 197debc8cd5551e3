"""Inputs that worked before the validation sweep of 2026-11-26 and that a
review of the sweep found rejected, plus a compiled-PyTorch gradient found
by a review of the compiled paths. CI runs this file on all three
backends."""

import keras
import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants import ops as kops
from keras_attnvariants.analysis import attention_importance
from keras_attnvariants.losses.attention_guidance import (
    AttentionGuidanceRegularizer,
)
from keras_attnvariants.losses.attention_guidance import guidance_attention_bias


def _np(x):
    return keras.ops.convert_to_numpy(x)


def test_guidance_bias_takes_a_variable_strength():
    # An annealed or learned strength: the sweep accepted numbers only.
    mask = np.ones((2, 4), bool)
    strength = keras.Variable(2.0)
    got = guidance_attention_bias({0: "next"}, 2, mask, strength=strength)
    want = guidance_attention_bias({0: "next"}, 2, mask, strength=2.0)
    np.testing.assert_allclose(_np(got), _np(want))
    with pytest.raises(ValueError, match="`strength`"):
        guidance_attention_bias({0: "next"}, 2, mask, strength=float("nan"))


def test_gaussian_mmd_broadcasts_a_reference_cloud():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4)).astype("float32")
    y = rng.normal(size=(1, 5, 4)).astype("float32")
    got = kops.gaussian_mmd(x, y)
    want = kops.gaussian_mmd(x, np.repeat(y, 2, axis=0))
    np.testing.assert_allclose(_np(got), _np(want), rtol=1e-6)


def test_precision_recall_takes_a_square_mask_when_the_batch_differs():
    rng = np.random.default_rng(1)
    pred = rng.random((2, 3, 3)) > 0.5
    true = rng.random((2, 3, 3)) > 0.5
    tril = np.tril(np.ones((3, 3), bool))
    got = kops.precision_recall(pred, true, tril)
    want = kops.precision_recall(pred, true, tril[None])
    np.testing.assert_allclose([_np(v) for v in got], [_np(v) for v in want])
    # B == T: ambiguous, a (B, T) padding mask broadcast over wrong axes.
    square = np.ones((3, 3, 3), bool)
    with pytest.raises(ValueError, match="`mask` must be rank 3"):
        kops.precision_recall(square, square, tril)


def test_stacked_layers_equal_a_list_of_layers():
    rng = np.random.default_rng(2)
    z = rng.random((3, 2, 2, 4, 4)).astype("float32")
    z /= z.sum(-1, keepdims=True)
    np.testing.assert_allclose(
        _np(kops.receptive_fields(z)), _np(kops.receptive_fields(list(z)))
    )
    np.testing.assert_allclose(
        attention_importance(z), attention_importance(list(z))
    )


@pytest.mark.parametrize(
    "cls", [kav.HybridAttention, kav.GumbelDiscreteAttention]
)
def test_numpy_bool_flags_are_accepted(cls):
    x = np.random.default_rng(3).normal(size=(2, 3, 4)).astype("float32")
    layer = cls(2, 2)
    out, scores = layer(x, x, return_attention_scores=np.bool_(True))
    assert tuple(scores.shape) == (2, 2, 3, 3)
    # The fused path (PyTorch's default) differs from the explicit one,
    # which returned scores take, by float32 rounding.
    np.testing.assert_allclose(
        _np(out), _np(layer(x, x, return_attention_scores=False)), atol=1e-5
    )


def _guided_step(jit_compile, alpha, decay_steps):
    keras.utils.set_random_seed(0)
    term = AttentionGuidanceRegularizer(
        {0: "next"}, alpha=alpha, decay_steps=decay_steps
    )
    inputs = keras.Input((5, 8))
    layer = kav.DoublyNormalizedAttention(2, 4, attention_losses=[term])
    model = keras.Model(inputs, layer(inputs, inputs))
    model.compile(keras.optimizers.SGD(1.0), "mse", jit_compile=jit_compile)
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    model.train_on_batch(x, np.zeros_like(x))
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


def test_compiled_guidance_step_applies_this_steps_alpha():
    """Under torch.compile the gradient used the next step's alpha (0.75
    instead of 1 at the first step): AOTAutograd recomputed alpha from the
    counter after its increment. The loss logged the right value."""
    eager = _guided_step(False, 1.0, 4)
    compiled = _guided_step(True, 1.0, 4)
    next_alpha = _guided_step(False, 0.75, None)
    assert np.abs(next_alpha - eager).max() > 1e-2  # the check can fail
    np.testing.assert_allclose(compiled, eager, atol=1e-5)


def test_shared_term_warns_when_its_layers_are_called_one_by_one():
    # In a torch.nn.Module (or a JAX stateless_call that drops the losses)
    # each attention layer starts its own call context, and Keras cleared
    # the shared term's losses at each: one step kept only the last
    # layer's loss, silently. Inside one Keras model it does not warn.
    import warnings

    guidance = kav.AttentionGuidanceRegularizer(
        [{0: "next"}, {0: "prev"}], alpha=1.0, name="guided"
    )
    first = kav.HybridAttention(2, 4, attention_losses=[guidance])
    second = kav.HybridAttention(2, 4, attention_losses=[guidance])
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    with pytest.warns(UserWarning, match="shared with .*keras.Model"):
        second(first(x, x, training=True), x, training=True)
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, second(first(inputs, inputs), inputs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(x, training=True)
    assert len(model.losses) == 2


def _float64_available():
    if keras.backend.backend() != "jax":
        return True
    import jax

    return bool(jax.config.jax_enable_x64)


@pytest.mark.skipif(not _float64_available(), reason="JAX without x64")
@pytest.mark.parametrize("straight_through", [False, True])
@pytest.mark.parametrize("return_scores", [False, True])
def test_float64_gumbel_layer_has_float64_gradients(
    straight_through, return_scores
):
    # The folded backward mixed the float32 Gumbel logits with float64
    # values (TF: float/double Mul; JAX: lax.div dtypes) unless the
    # weights were returned.
    from keras_attnvariants.testing.gradients import gradients

    layer = kav.GumbelDiscreteAttention(
        2, 3, seed=1, straight_through=straight_through, dtype="float64"
    )
    x = np.random.default_rng(0).normal(size=(2, 5, 4))

    def forward(q):
        out = layer(q, q, training=True, return_attention_scores=return_scores)
        return out[0] if return_scores else out

    (grad,) = gradients(forward, np.ones((2, 5, 4)), x)
    assert grad.dtype == np.float64
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0


@pytest.mark.skipif(not _float64_available(), reason="JAX without x64")
def test_ot_term_under_float64_floatx():
    # Python floats in the Sinkhorn mass floor followed floatx and failed
    # to mix with the float32 masses (TF, PyTorch).
    q = np.random.default_rng(0).normal(size=(2, 5, 2, 3)).astype("float32")
    k = q + 1.0
    expected = float(kav.KQAlignment("ot", 1.0)(q, k))
    previous = keras.config.floatx()
    keras.config.set_floatx("float64")
    try:
        got = float(kav.KQAlignment("ot", 1.0)(q, k))
    finally:
        keras.config.set_floatx(previous)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


class _ProbeLoss(kav.AttentionLoss):
    """A user term with a sublayer made in `__init__` and no `build`."""

    needs_attention_weights = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.probe = keras.layers.Dense(1)

    def compute_loss_value(self, query):
        squared = keras.ops.square(self.probe(query))
        return kav.losses.batch_mean(keras.ops.mean(squared, axis=(1, 2, 3)))

    def from_attention(self, context):
        return self(context["query"])


def test_custom_term_with_a_sublayer_fits():
    # Marked built when its attention layer built, the term skipped the
    # symbolic run that builds its sublayer, which JAX's train step then
    # created inside its stateless scope (ValueError).
    term = _ProbeLoss()
    x = keras.Input((5, 8))
    model = keras.Model(
        x, kav.DoublyNormalizedAttention(2, 4, attention_losses=[term])(x, x)
    )
    model.compile("adam", "mse")
    data = np.ones((2, 5, 8), "float32")
    model.fit(data, data, verbose=0)
    assert term.probe.built
    trainable = {id(v) for v in model.trainable_weights}
    assert {id(v) for v in term.probe.weights} <= trainable
