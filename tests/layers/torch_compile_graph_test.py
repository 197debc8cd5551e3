"""Every layer's training call is one graph under torch.compile.

`jit_compile=True` on the PyTorch backend runs the train step through
torch.compile. A graph break inside a layer's name scope made Dynamo run
the whole layer call eagerly: NumPy constants in the noise hash, Keras's
`SeedGenerator.next` (a NumPy increment), `ops.max` (it reads
`result.values`), keras's flash-attention check, `math.isfinite` on the
dropout rate and `max(..., default=...)` each broke it. With those gone
a compiled train step (`benchmarks/torch_compile_step.py`, 2-core CPU,
B=8, S=128, 4 heads of 16, 2026-11-27) went from 35 to 10 ms (DNAS with
dropout), 39 to 11 ms (HNAS) and 31 to 9.5 ms (Gumbel): from 2.1-2.5x
keras MHA's to 0.6-0.7x.

`fullgraph=True` raises at the first break; the "eager" backend traces
without compiling, so these checks take seconds.
"""

import keras
import numpy as np
import pytest

import keras_attnvariants as kav
from keras_attnvariants.ops.noise import _next_state
from keras_attnvariants.testing import layer_zoo

on_torch = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="torch.compile is the PyTorch backend's jit_compile",
)

# One layer per code path the fixes touched (tracing a layer call takes
# about 10 s): the noise of Gumbel samples (hash constants, seed state;
# DNAS's dropout, its rate's check and row maxima are traced in the
# test of several rates below); HNAS's fused kernel (keras's flash
# check); the adversaries, the masked softmax and the paper's sum over
# heads of KQ alignment (CT). The attention-guidance term breaks the graph
# on purpose after its step counter's increment
# (`_break_torch_compile_graph`: a PyTorch AOTAutograd bug), so layers
# carrying it are left out; the Sinkhorn loop is traced below as an op
# (100 iterations take 34 s as a layer). The two-stream encoder is
# traced in a test of its own below.
LAYERS = {
    "hybrid_attention": layer_zoo.LAYERS["hybrid_attention"],
    "gumbel_relaxed": layer_zoo.LAYERS["gumbel_discrete_attention"],
    "gumbel_straight_through": lambda: kav.GumbelDiscreteAttention(
        2, 4, seed=3, straight_through=True
    ),
    "hnas_with_kq_ct": lambda: kav.HybridAttention(
        2, 4, attention_losses=[kav.KQAlignment("ct", head_reduction="sum")]
    ),
}


def _inputs():
    import torch

    x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
    valid = np.ones((2, 6), bool)
    valid[1, 4:] = False
    mask = valid[:, None, :] & valid[:, :, None]
    return torch.tensor(x), torch.tensor(mask)


@on_torch
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_training_call_traces_as_one_graph(name):
    import torch

    torch._dynamo.reset()  # no cache (or its size limit) from other layers
    x, mask = _inputs()
    layer = LAYERS[name]()
    layer(x, x, attention_mask=mask, training=True)  # built eagerly

    def call(x, mask):
        return layer(x, x, attention_mask=mask, training=True)

    compiled = torch.compile(call, fullgraph=True, backend="eager")
    output = compiled(x, mask)
    assert torch.all(torch.isfinite(output))
    # The traced call draws fresh noise too (the seed state advanced).
    if "gumbel" in name:
        again = compiled(x, mask)
        assert not torch.equal(output, again)


@on_torch
def test_one_function_traced_for_layers_of_different_dropout_rates():
    # A function traced again for a second layer whose rate differs makes
    # the rate a symbolic float (Dynamo's automatic dynamic shapes);
    # `math.isfinite` of it, in the rate's check, broke the graph.
    import torch

    torch._dynamo.reset()
    x, mask = _inputs()

    def call(layer, x, mask):
        return layer(x, x, attention_mask=mask, training=True)

    compiled = torch.compile(call, fullgraph=True, backend="eager")
    for rate in (0.1, 0.2):
        layer = kav.DoublyNormalizedAttention(2, 4, dropout=rate, seed=1)
        call(layer, x, mask)  # built eagerly
        output = compiled(layer, x, mask)
        assert torch.all(torch.isfinite(output))
        # Fresh dropout on the next call: the seed state advanced.
        assert not torch.equal(output, compiled(layer, x, mask))


@on_torch
def test_sinkhorn_plan_traces_as_one_graph():
    import torch

    from keras_attnvariants.ops import transport

    torch._dynamo.reset()
    rng = np.random.default_rng(0)
    cost = torch.tensor(rng.random((2, 5, 4)).astype("float32"))
    rows = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    cols = torch.tensor([[True] * 4, [True] * 2 + [False] * 2])

    def plan(cost, rows, cols):
        return transport.sinkhorn_plan(
            cost, iterations=4, row_mask=rows, col_mask=cols
        )

    compiled = torch.compile(plan, fullgraph=True, backend="eager")
    np.testing.assert_allclose(
        compiled(cost, rows, cols).numpy(),
        plan(cost, rows, cols).numpy(),
        atol=1e-6,
    )


@on_torch
def test_attention_mask_merged_with_query_mask_traces_as_one_graph():
    # Merging the masks checked their shapes with `max(..., default=0)`,
    # a keyword torch.compile cannot trace.
    import torch

    torch._dynamo.reset()
    x, mask = _inputs()
    query_mask = mask[:, :, 0]
    layer = kav.DoublyNormalizedAttention(2, 4)

    def call(x, mask, query_mask):
        return layer(x, x, attention_mask=mask, query_mask=query_mask)

    want = call(x, mask, query_mask)
    compiled = torch.compile(call, fullgraph=True, backend="eager")
    np.testing.assert_allclose(
        compiled(x, mask, query_mask).detach().numpy(),
        want.detach().numpy(),
        atol=1e-6,
    )


@on_torch
def test_two_stream_encoder_training_call_traces_as_one_graph():
    # Keras's `tree.flatten` of a layer's arguments and outputs compares
    # nested containers with `is not`, which Dynamo cannot trace for two
    # tuples: the blocks' `((g, h), z)` outputs, and their `(g, h)` inputs
    # from the encoder, broke the graph at every block. The streams are
    # lists now.
    import torch

    torch._dynamo.reset()
    encoder = kav.TwoStreamEncoder(
        vocab_size=10,
        max_length=6,
        num_layers=2,
        d_model=8,
        num_heads=2,
        d_ff=16,
        num_views=2,
        receptive_field_coefficient=0.1,
        seed=1,
    )
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [3, 1, 4, 1, 0, 0]])
    encoder(ids, training=True)  # built eagerly

    def call(ids):
        return encoder(ids, view=1, training=True, return_attention=True)

    compiled = torch.compile(call, fullgraph=True, backend="eager")
    h, attentions = compiled(ids)
    assert torch.all(torch.isfinite(h))
    assert len(attentions) == 2
    # The receptive-field penalty was added inside the traced call.
    assert torch.isfinite(encoder.losses[-1])


def test_next_state_advances_like_seed_generator_next():
    # The layers' noise keys read `_next_state`, Keras's `next()` without
    # its NumPy increment: the same states, in the same order.
    ours = keras.random.SeedGenerator(123)
    theirs = keras.random.SeedGenerator(123)
    for _ in range(3):
        a = keras.ops.convert_to_numpy(_next_state(ours))
        b = keras.ops.convert_to_numpy(theirs.next())
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(ours.state.value),
        keras.ops.convert_to_numpy(theirs.state.value),
    )
