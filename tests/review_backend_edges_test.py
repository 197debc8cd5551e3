"""Backend-specific bugs found by reviews acting as users (2026-11-26).
CI runs this file on TensorFlow, JAX and PyTorch."""

import keras
import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants.ops import sinkhorn_plan
from keras_attnvariants.testing.gradients import gradients


@pytest.mark.parametrize("masked", ["rows", "cols", "both"])
def test_sinkhorn_plan_gradient_with_padding_equals_the_unpadded_one(masked):
    """JAX gave a NaN gradient as soon as a mask was passed: a padded row's
    `a / max(mass, 1e-30)` has an inf derivative, and `where` passed
    0 * inf back."""
    rng = np.random.default_rng(0)
    cost = rng.uniform(size=(2, 5, 6)).astype("float32")
    upstream = rng.normal(size=(2, 5, 6)).astype("float32")
    rows = np.ones((2, 5), bool)
    cols = np.ones((2, 6), bool)
    if masked in ("rows", "both"):
        rows[:, 3:] = False
    if masked in ("cols", "both"):
        cols[:, 4:] = False

    def padded(c):
        return sinkhorn_plan(c, row_mask=rows, col_mask=cols)

    (grad,) = gradients(padded, upstream, cost)
    n, m = rows[0].sum(), cols[0].sum()

    def unpadded(c):
        return sinkhorn_plan(c)

    (expected,) = gradients(
        unpadded, upstream[:, :n, :m], np.ascontiguousarray(cost[:, :n, :m])
    )
    assert np.isfinite(grad).all()
    np.testing.assert_allclose(grad[:, :n, :m], expected, atol=1e-4)
    np.testing.assert_array_equal(grad[:, n:, :], 0.0)
    np.testing.assert_array_equal(grad[:, :, m:], 0.0)


def _two_gumbel_model():
    tokens = keras.Input((6,), dtype="int32")
    x = keras.layers.Embedding(11, 8)(tokens)
    x = kav.GumbelDiscreteAttention(2, 4, seed=1)(x, x)
    x = kav.GumbelDiscreteAttention(2, 4, seed=2)(x, x)
    return keras.Model(tokens, x)


def test_two_gumbel_layers_have_distinct_variable_paths():
    """Both noise generators sat at `gumbel_seed_generator/...`, and
    `Model.get_state_tree` raised on the duplicate path."""
    model = _two_gumbel_model()
    paths = [v.path for v in model.variables]
    assert len(paths) == len(set(paths)), paths
    model.compile("sgd", "mse")
    model.get_state_tree()


@pytest.mark.skipif(
    keras.config.backend() != "torch", reason="PyTorch's .grad buffers"
)
def test_gradient_importance_leaves_parameter_gradients_alone():
    """`gradient_importance` called `backward()`: every parameter got (and
    accumulated) a `.grad`, which the next optimizer step applied."""
    from keras_attnvariants.analysis import gradient_importance

    inputs = keras.Input((6, 8))
    h = kav.DoublyNormalizedAttention(2, 4, seed=1)(inputs, inputs)
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    model = keras.Model(inputs, keras.layers.Dense(3)(pooled))
    h0 = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
    first = gradient_importance(lambda e: model(e, training=False), h0)
    second = gradient_importance(lambda e: model(e, training=False), h0)
    assert all(p.grad is None for p in model.parameters())
    assert first.shape == (2, 6) and (first > 0).all()
    np.testing.assert_allclose(first, second)


def test_encoder_temperature_follows_the_schedule():
    """`TwoStreamEncoder.temperature` was the constructor's float, 1.0
    after a schedule had cooled the blocks."""
    encoder = kav.TwoStreamEncoder(
        vocab_size=11,
        max_length=6,
        num_layers=2,
        d_model=8,
        num_heads=2,
        d_ff=16,
        temperature=0.7,
        seed=0,
    )
    assert encoder.temperature == 0.7
    encoder(np.ones((2, 6), "int32"))
    encoder.set_temperature(0.05)
    for block in encoder.blocks:
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(block.temperature), 0.05
        )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(encoder.temperature), 0.05
    )
    assert encoder.get_config()["temperature"] == 0.7
    with pytest.raises(ValueError, match="temperature"):
        encoder.set_temperature(0.0)
