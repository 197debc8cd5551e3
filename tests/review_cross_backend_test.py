"""Cross-backend parity: same layers, weights and inputs on every backend.

The test session's backend (TensorFlow in CI) builds every layer, gives it
random weights (`hybrid_weight` set to 0, 0.35 and 1 per head) and computes
the reference results. One subprocess per other installed backend (JAX,
PyTorch; both at once) rebuilds the same layers from the same
constructors, `set_weights` from the reference's `get_weights`, runs the
same calls in the same order (so every seed generator is in the same state
at every call) and writes its results; each must match the reference to
float32 tolerance, with the same dtypes.

Covered: DNAS, HNAS and Gumbel attention with Keras masks (through an
`Embedding(mask_zero=True)`), `query_mask` / `value_mask` (also as ints),
`attention_mask` (fully masked rows and columns, broadcast shapes),
key-only masks with `self_attention_padding`, cross-attention `T != S`
with `key != value`, `value_dim != key_dim`, one key / one query, large
logits, both `attention_path`s, returned scores, training with attention
dropout (folded and materialized); Gumbel `"argmax"` / `"soft"` /
`"sample"` inference, exact ties, causal masks, relaxed / straight-through
training noise; `TwoStreamBlock` (two-stream, single-stream, soft,
multiview, causal, Keras masks) and `TwoStreamEncoder`; every
`KQAlignment` method and option with the same adversary weights; attention
guidance (patterns, reductions, edge rows, decay schedule) and attached
terms (`layer.losses`); gradients for the trainable weights (analytic
backward passes, fused kernels, straight-through, reversed adversaries);
compiled `train_on_batch` steps and `predict` of zoo models (XLA on
TensorFlow and JAX); `.keras` files saved by the reference backend and
loaded by the others; the pure ops; `mixed_bfloat16`, `mixed_float16` and
`bfloat16` outputs (compute dtype, finite, close).

Documented differences that are not compared: `attention_path="auto"`
(fused under PyTorch, explicit elsewhere: both paths are compared
explicitly instead); an error of `mixed_float16` on PyTorch's CPU (older
releases lack float16 kernels; `TestCase.assert_mixed_precision_outputs`
skips it); Gumbel picks in low precision (a rounding difference between
backends may flip a near tie: only dtype and finiteness are checked);
layer metrics in `fit` logs (the JAX trainer drops them).

Run as a script (`python review_cross_backend_test.py worker IN OUT`) this
file is the worker: `KERAS_BACKEND` must be set before it starts.
`REVIEW_CROSS_BACKEND_PROFILE=1` prints the time of each section.
"""

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

B, T, S, D = 2, 5, 6, 8
HEADS, KEY_DIM = 3, 4
VOCAB = 11
BACKENDS = ("tensorflow", "jax", "torch")
POLICIES = ("mixed_bfloat16", "mixed_float16", "bfloat16")
# `keras_attnvariants.testing.layer_zoo` models trained a few steps.
# Models saved as `.keras` by the reference backend (before training).
SAVED_MODELS = ("fit_hnas_with_kq_gan_per_head", "model_block")
FIT_MODELS = (
    "gumbel_with_guidance",
    "hnas_with_kq_gan_per_head",
    "two_stream_encoder",
)
WORKER_TIMEOUT = 480
# Prints the time of each section of cases (stderr) when set.
PROFILE = bool(os.environ.get("REVIEW_CROSS_BACKEND_PROFILE"))


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------


def make_inputs():
    """The fixed inputs of every case (NumPy, the same on every backend)."""
    rng = np.random.default_rng(0)
    data = {
        "x": rng.normal(size=(B, T, D)),
        "y": rng.normal(size=(B, S, D)),  # cross-attention value
        "k": rng.normal(size=(B, S, D)),  # cross-attention key (!= value)
        "g": rng.normal(size=(B, T, 6)),  # two-stream controller
        "h": rng.normal(size=(B, T, 6)),  # two-stream model stream
        "q4": rng.normal(size=(B, T, HEADS, KEY_DIM)),  # projected queries
        "k4": rng.normal(size=(B, S, HEADS, KEY_DIM)) + 0.5,
        "k4self": rng.normal(size=(B, T, HEADS, KEY_DIM)) + 0.5,
        "attn": rng.random((B, 3, T, T)),  # attention weights to guide
    }
    data = {k: v.astype("float32") for k, v in data.items()}
    data["attn"] /= data["attn"].sum(-1, keepdims=True)
    # Padding: example 1 has 3 real queries and 4 real keys.
    data["qmask"] = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    data["vmask"] = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
    amask = rng.random((B, T, S)) < 0.7
    amask[0, 1, :] = False  # a query with no valid key
    amask[1, :, 2] = False  # a key no query may attend
    amask[1, 3:, :] = False  # padded queries
    amask[:, :, 0] = amask[:, :, 0] | (np.arange(T) != 1)[None]
    data["amask"] = amask
    self_mask = np.ones((B, T, T), bool)
    self_mask[1, :, 3:] = False
    self_mask[1, 3:, :] = False
    data["self_mask"] = self_mask
    data["key_only"] = data["qmask"][:, None, :]  # (B, 1, T), keras-hub style
    ids = rng.integers(1, VOCAB, size=(B, T)).astype("int32")
    ids[1, 3:] = 0
    ids[0, 1], ids[0, 3] = 1, 2  # delimiter and period tokens
    data["ids"] = ids
    return data


# --------------------------------------------------------------------------
# Layers (built in this order on every backend)
# --------------------------------------------------------------------------


def make_layers(data):
    """`{name: built layer}`; construction and build consume no noise."""
    import keras

    import keras_attnvariants as kav
    from keras_attnvariants.losses.attention_guidance import (
        AttentionGuidanceRegularizer,
    )
    from keras_attnvariants.testing import layer_zoo

    layers = {}
    qshape, vshape = (B, T, D), (B, S, D)

    def mha(name, cls, cross=False, **kwargs):
        layer = cls(HEADS, KEY_DIM, name=name, **kwargs)
        layer.build(
            qshape, vshape if cross else qshape, vshape if cross else None
        )
        layers[name] = layer

    for path in ("explicit", "fused"):
        tag = path[0]
        mha(
            f"dnas_{tag}",
            kav.DoublyNormalizedAttention,
            True,
            attention_path=path,
            dropout=0.25,
            seed=11,
        )
        mha(
            f"dnas_sap_{tag}",
            kav.DoublyNormalizedAttention,
            attention_path=path,
            self_attention_padding=True,
        )
        mha(
            f"dnas_vdim_{tag}",
            kav.DoublyNormalizedAttention,
            True,
            attention_path=path,
            value_dim=5,
            output_shape=7,
        )
        mha(
            f"hnas_{tag}",
            kav.HybridAttention,
            True,
            attention_path=path,
            dropout=0.25,
            seed=12,
        )
        mha(
            f"hnas_sap_{tag}",
            kav.HybridAttention,
            attention_path=path,
            self_attention_padding=True,
        )
    mha("dnas_it2", kav.DoublyNormalizedAttention, True, iterations=3)
    mha("hnas_it2", kav.HybridAttention, True, iterations=2)
    for mode in ("argmax", "soft", "sample"):
        mha(
            f"gumbel_{mode}",
            kav.GumbelDiscreteAttention,
            True,
            inference_mode=mode,
            temperature=0.7,
            seed=5,
        )
    mha(
        "gumbel_st",
        kav.GumbelDiscreteAttention,
        True,
        straight_through=True,
        seed=6,
    )
    mha(
        "gumbel_drop",
        kav.GumbelDiscreteAttention,
        True,
        dropout=0.3,
        seed=7,
        temperature=2.0,
    )

    # Keras masks from an embedding, in a functional model.
    for name, factory in (
        ("dnas", lambda: kav.DoublyNormalizedAttention(HEADS, KEY_DIM)),
        ("hnas", lambda: kav.HybridAttention(HEADS, KEY_DIM)),
        ("gumbel", lambda: kav.GumbelDiscreteAttention(HEADS, KEY_DIM, seed=8)),
    ):
        tokens = keras.Input((T,), dtype="int32")
        emb = keras.layers.Embedding(VOCAB, D, mask_zero=True)(tokens)
        out = factory()(emb, emb)
        pooled = keras.layers.GlobalAveragePooling1D()(out)
        layers[f"model_{name}"] = keras.Model(tokens, [out, pooled])

    # Two-stream blocks and the encoder.
    def block(name, **kwargs):
        layer = kav.TwoStreamBlock(6, 2, 8, name=name, **kwargs)
        two = kwargs.get("mode", "two_stream") == "two_stream"
        layer.build(((B, T, 6), (B, T, 6)) if two else (B, T, 6))
        layers[name] = layer

    block("block", seed=7, temperature=0.8)
    block("block_st", seed=8, straight_through=True)
    block("block_single", seed=9, mode="single_stream")
    block("block_soft", seed=10, model_attention="soft")
    block("block_multi", seed=11, num_controllers=2, update_controller=False)
    encoder = kav.TwoStreamEncoder(
        VOCAB,
        T,
        2,
        d_model=8,
        num_heads=2,
        d_ff=16,
        num_views=2,
        share_embeddings=False,
        receptive_field_coefficient=0.1,
        seed=3,
    )
    encoder(data["ids"], training=False)  # argmax inference: no noise
    layers["encoder"] = encoder

    # Loss terms (the adversaries' weights are created by `build`).
    q = data["q4"]
    for name, kwargs in (
        ("kq_gan", dict(method="gan", hidden_dim=6, reversal_beta=0.5)),
        (
            "kq_gan_ns_head",
            dict(
                method="gan", gan_loss="non_saturating", adversary_per_head=True
            ),
        ),
        ("kq_ct", dict(method="ct")),
        ("kq_ct_head", dict(method="ct", adversary_per_head=True, rho=0.3)),
        ("kq_ct_heads", dict(method="ct", match_over="heads")),
        ("kq_ot", dict(method="ot", epsilon=0.05, iterations=37)),
        ("kq_mmd", dict(method="mmd", bandwidth=2.0)),
    ):
        term = kav.KQAlignment(weight=1.0, name=name, **kwargs)
        term.build(q.shape)
        layers[name] = term

    # Attention layers with attached terms (losses read in training).
    guidance = AttentionGuidanceRegularizer(
        {0: "next", 1: "first"}, alpha=2.0, decay_steps=4, name="guided"
    )
    kq = kav.KQAlignment("ct", weight=0.5, name="attached_ct")
    mha(
        "hnas_terms",
        kav.HybridAttention,
        attention_losses=[guidance, kq],
        self_attention_padding=True,
        attention_path="explicit",
    )
    mha(
        "gumbel_terms",
        kav.GumbelDiscreteAttention,
        attention_losses=[kav.KQAlignment("mmd", weight=1.0, name="g_mmd")],
        seed=13,
    )

    # Mixed precision and bfloat16 variables.
    for policy in POLICIES:
        for path in ("explicit", "fused"):
            mha(
                f"{policy}_dnas_{path[0]}",
                kav.DoublyNormalizedAttention,
                True,
                attention_path=path,
                dtype=policy,
            )
            mha(
                f"{policy}_hnas_{path[0]}",
                kav.HybridAttention,
                True,
                attention_path=path,
                dtype=policy,
            )
        mha(
            f"{policy}_gumbel",
            kav.GumbelDiscreteAttention,
            True,
            seed=14,
            dtype=policy,
        )

    # Two-stream block on Keras masks; encoder with `mask_zero`.
    tokens = keras.Input((T,), dtype="int32")
    emb = keras.layers.Embedding(VOCAB, 6, mask_zero=True)(tokens)
    (g, h), z = kav.TwoStreamBlock(6, 2, 8, seed=15)((emb, emb))
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    layers["model_block"] = keras.Model(tokens, [g, h, z, pooled])
    encoded = kav.TwoStreamEncoder(
        VOCAB,
        T,
        1,
        d_model=8,
        num_heads=2,
        d_ff=16,
        seed=16,
        mask_zero=True,
        mode="single_stream",
    )(tokens)
    pooled = keras.layers.GlobalAveragePooling1D()(encoded)
    layers["model_encoder"] = keras.Model(tokens, [encoded, pooled])

    # Zoo models trained with `train_on_batch` (compiled: XLA on TensorFlow
    # and JAX).
    for name in FIT_MODELS:
        layers[f"fit_{name}"] = layer_zoo.build_model(name)
    return layers


def randomize_weights(layers):
    """Reference weights: random normal, `u` per head in `[0, 1]`."""
    rng = np.random.default_rng(1)
    weights = {}
    for name, layer in layers.items():
        values = []
        for variable in layer.weights:
            shape = tuple(variable.shape)
            if "hybrid_weight" in variable.path:
                value = np.array([0.0, 0.35, 1.0][: shape[0]], "float32")
            elif "temperature" in variable.path or "step" in variable.path:
                value = np.asarray(variable.numpy())
            else:
                value = 0.4 * rng.normal(size=shape)
            values.append(np.asarray(value, "float32").reshape(shape))
        layer.set_weights(values)
        weights[name] = values
    return weights


# --------------------------------------------------------------------------
# Cases (run in this order on every backend)
# --------------------------------------------------------------------------


def run_cases(layers, data, saved_dir):
    """`{key: array}` of every case; a case that raises is recorded as
    `error/<case>` with its traceback (a string array)."""
    import keras
    from keras import ops

    from keras_attnvariants import ops as kops
    from keras_attnvariants.losses.attention_guidance import (
        AttentionGuidanceRegularizer,
    )
    from keras_attnvariants.losses.attention_guidance import (
        guidance_attention_bias,
    )
    from keras_attnvariants.ops import combine
    from keras_attnvariants.ops.noise import positional_dropout

    results = {}
    timings = {}
    x, y, k = data["x"], data["y"], data["k"]
    qmask, vmask = data["qmask"], data["vmask"]

    def put(key, value):
        for i, item in enumerate(keras.tree.flatten(value)):
            if item is None:
                continue
            if isinstance(item, (int, float)):
                item = np.float32(item)
            array = ops.convert_to_numpy(ops.cast(item, "float32"))
            results[f"{key}/{i}"] = np.asarray(array, "float32")
            dtype = keras.backend.standardize_dtype(item.dtype)
            results[f"dtype/{key}/{i}"] = np.array(dtype)

    def case(name, function):
        start = time.perf_counter()
        try:
            function()
        except Exception:  # recorded, compared with the reference
            results[f"error/{name}"] = np.array(traceback.format_exc())
        if PROFILE:
            section = name.split("/")[0]
            timings[section] = timings.get(section, 0.0) + (
                time.perf_counter() - start
            )

    # Mask routes: (positional args, keyword args) of an attention call.
    routes = {
        "self_qv": ((x, x), dict(query_mask=qmask, value_mask=qmask)),
        "self_amask": ((x, x), dict(attention_mask=data["self_mask"])),
        "cross_amask": ((x, y), dict(key=k, attention_mask=data["amask"])),
        "cross_masks": (
            (x, y),
            dict(key=k, query_mask=qmask, value_mask=vmask),
        ),
        "cross_nomask": ((x, y), dict(key=k)),
        # Broadcast attention masks and integer padding masks.
        "bcast_batch": ((x, y), dict(key=k, attention_mask=data["amask"][:1])),
        "bcast_keys": ((x, y), dict(key=k, attention_mask=vmask[:, None])),
        "bcast_queries": ((x, y), dict(key=k, attention_mask=qmask[..., None])),
        "int_masks": (
            (x, y),
            dict(
                key=k,
                query_mask=qmask.astype("int32"),
                value_mask=vmask.astype("int32"),
            ),
        ),
    }
    main_routes = ("self_qv", "cross_amask", "cross_masks")

    def attention_calls(prefix, layer, training=False, names=main_routes):
        """Calls of `layer` on the routes `names`, with and without scores."""
        for route in names:
            args, kwargs = routes[route]
            for scores in (True, False):
                key = f"{prefix}/{route}/{scores}"
                case(
                    key,
                    lambda: put(
                        key,
                        layer(
                            *args,
                            training=training,
                            return_attention_scores=scores,
                            **kwargs,
                        ),
                    ),
                )

    # DNAS / HNAS: both paths, inference, then training with dropout.
    for name in ("dnas", "hnas"):
        for tag in "ef":
            layer = layers[f"{name}_{tag}"]
            attention_calls(f"{name}_{tag}", layer, names=tuple(routes))
            attention_calls(f"{name}_{tag}/train", layer, True, main_routes)
            sap = layers[f"{name}_sap_{tag}"]
            for scores in (True, False):
                key = f"{name}_sap_{tag}/{scores}"
                case(
                    key,
                    lambda: put(
                        key,
                        sap(
                            x,
                            x,
                            attention_mask=data["key_only"],
                            return_attention_scores=scores,
                        ),
                    ),
                )
    for tag in "ef":
        attention_calls(f"dnas_vdim_{tag}", layers[f"dnas_vdim_{tag}"])
    attention_calls("dnas_it2", layers["dnas_it2"])
    attention_calls("hnas_it2", layers["hnas_it2"])

    # Gumbel: inference modes (sample draws noise), causal, training.
    for mode in ("argmax", "soft", "sample"):
        layer = layers[f"gumbel_{mode}"]
        attention_calls(f"gumbel_{mode}", layer, names=tuple(routes))
        for scores in (True, False):
            key = f"gumbel_{mode}/causal/{scores}"
            case(
                key,
                lambda: put(
                    key,
                    layer(
                        x,
                        y,
                        key=k,
                        attention_mask=data["amask"],
                        use_causal_mask=True,
                        return_attention_scores=scores,
                    ),
                ),
            )
        attention_calls(f"gumbel_{mode}/train", layer, True)
    for name in ("gumbel_st", "gumbel_drop"):
        attention_calls(f"{name}/train", layers[name], True)
        attention_calls(name, layers[name], names=("cross_amask",))

    # Keras masks through a functional model.
    for name in ("dnas", "hnas", "gumbel"):
        model = layers[f"model_{name}"]
        case(f"model_{name}", lambda: put(f"model_{name}", model(data["ids"])))
        case(
            f"model_{name}/train",
            lambda: put(
                f"model_{name}/train", model(data["ids"], training=True)
            ),
        )

    # Two-stream blocks and the encoder.
    streams = (data["g"], data["h"])
    for name in ("block", "block_st", "block_soft", "block_multi"):
        block = layers[name]
        views = (0, 1) if name == "block_multi" else (0,)
        for view in views:
            for training in (False, True):
                for causal in (False, True):
                    key = f"{name}/{view}/{training}/{causal}"
                    case(
                        key,
                        lambda: put(
                            key,
                            block(
                                streams,
                                padding_mask=qmask,
                                view=view,
                                use_causal_mask=causal,
                                training=training,
                            ),
                        ),
                    )
    single = layers["block_single"]
    for training in (False, True):
        key = f"block_single/{training}"
        case(
            key,
            lambda: put(
                key, single(data["h"], padding_mask=qmask, training=training)
            ),
        )
    encoder = layers["encoder"]
    for view in (0, 1):
        for training in (False, True):
            key = f"encoder/{view}/{training}"

            def run_encoder():
                out = encoder(
                    data["ids"],
                    view=view,
                    training=training,
                    use_causal_mask=bool(view),
                    return_attention=True,
                )
                put(key, out)
                put(f"{key}/losses", list(encoder.losses))

            case(key, run_encoder)

    # KQAlignment terms with shared adversary weights.
    for name in (
        "kq_gan",
        "kq_gan_ns_head",
        "kq_ct",
        "kq_ct_head",
        "kq_ot",
        "kq_mmd",
    ):
        term = layers[name]
        case(
            f"{name}/plain",
            lambda: put(f"{name}/plain", term(data["q4"], data["k4"])),
        )
        case(
            f"{name}/masked",
            lambda: put(
                f"{name}/masked",
                term(data["q4"], data["k4"], query_mask=qmask, key_mask=vmask),
            ),
        )
    term = layers["kq_ct_heads"]
    case(
        "kq_ct_heads",
        lambda: put(
            "kq_ct_heads",
            term(data["q4"], data["k4self"], query_mask=qmask, key_mask=qmask),
        ),
    )

    # Guidance: patterns, reductions, edge rows, step schedule.
    attn = data["attn"]
    for reduction in ("sum", "mean"):
        for edge in ("uniform", "zero"):
            key = f"guidance/{reduction}/{edge}"

            def run_guidance():
                term = AttentionGuidanceRegularizer(
                    {0: "next", 1: "prev", 2: "first"},
                    alpha=3.0,
                    decay_steps=3,
                    warm_steps=1,
                    reduction=reduction,
                    edge_rows=edge,
                )
                values = []
                for _ in range(5):  # alpha 3, 3, 2, 1, 0
                    values.append(term(attn, padding_mask=qmask, training=True))
                put(key, values)
                tokens = AttentionGuidanceRegularizer(
                    {0: "delimiter", 2: "period"},
                    alpha=1.5,
                    reduction=reduction,
                    edge_rows=edge,
                    delimiter_ids=[1, 5],
                    period_id=2,
                )
                put(
                    f"{key}/tokens",
                    tokens(attn, padding_mask=qmask, token_ids=data["ids"]),
                )

            case(key, run_guidance)

    # Attached terms: their values in training.
    for name in ("hnas_terms", "gumbel_terms"):
        layer = layers[name]
        for step in range(2):
            key = f"{name}/{step}"

            def run_attached():
                out = layer(
                    x,
                    x,
                    attention_mask=data["key_only"]
                    if name == "hnas_terms"
                    else data["self_mask"],
                    training=True,
                )
                put(key, out)
                put(f"{key}/losses", list(layer.losses))

            case(key, run_attached)

    # Mixed precision: finite everywhere, close (loosely) where no pick.
    for policy in POLICIES:
        for name in ("dnas_e", "dnas_f", "hnas_e", "hnas_f", "gumbel"):
            layer = layers[f"{policy}_{name}"]
            # Without dropout, training changes only Gumbel's path.
            for training in (False, True) if name == "gumbel" else (False,):
                for scores in (True, False):
                    key = f"mixed/{policy}/{name}/{training}/{scores}"

                    def run_mixed():
                        out = layer(
                            x,
                            y,
                            key=k,
                            attention_mask=data["amask"],
                            training=training,
                            return_attention_scores=scores,
                        )
                        for item in keras.tree.flatten(out):
                            dtype = keras.backend.standardize_dtype(item.dtype)
                            if dtype != layer.compute_dtype:
                                raise AssertionError(f"dtype {dtype}")
                        put(key, out)

                    case(key, run_mixed)

    # Keras masks through two-stream models.
    for name in ("model_block", "model_encoder"):
        model = layers[name]
        for training in (False, True):
            key = f"{name}/{training}"

            def run_masked():
                out = model(data["ids"], training=training)
                put(key, out)
                masks = [getattr(t, "_keras_mask", None) for t in out]
                put(f"{key}/masks", [m for m in masks if m is not None])

            case(key, run_masked)

    # A few compiled training steps of the zoo models.
    for name in FIT_MODELS:
        model = layers[f"fit_{name}"]
        key = f"fit/{name}"

        def run_fit():
            from keras_attnvariants.testing import layer_zoo

            inputs, targets = layer_zoo.training_data(num=4)
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
            losses = [
                model.train_on_batch(inputs, targets, return_dict=True)["loss"]
                for _ in range(3)
            ]
            put(key, losses)
            put(f"{key}/weights", model.get_weights())
            put(f"{key}/predict", model.predict(inputs, verbose=0))

        case(key, run_fit)

    # Gradients of `sum(out * upstream) + sum(losses)` for the trainable
    # weights (custom gradients, straight-through clips, reversed
    # adversaries, noise in training).
    def grad_case(key, layer, call):
        def objective():
            total = 0.0
            for out in keras.tree.flatten(call()):
                if out is None:
                    continue
                shape = tuple(out.shape)
                upstream = np.cos(np.arange(np.prod(shape))).reshape(shape)
                upstream = ops.convert_to_tensor(upstream, "float32")
                total = total + ops.sum(ops.cast(out, "float32") * upstream)
            return total

        case(key, lambda: put(key, trainable_gradients(layer, objective)))

    # Folded DNAS with dropout, fused HNAS (two kernel calls), folded HNAS
    # with `u` at 0 and 1, iterated DNAS.
    for name, training in (
        ("dnas_e", True),
        ("hnas_f", False),
        ("hnas_e", False),
        ("dnas_it2", False),
    ):
        layer = layers[name]
        grad_case(
            f"grad/{name}/{training}",
            layer,
            lambda: layer(
                x, y, key=k, attention_mask=data["amask"], training=training
            ),
        )
    # Straight-through gather / scatter; relaxed sample with dropout folded.
    for name in ("gumbel_st", "gumbel_drop"):
        layer = layers[name]
        grad_case(
            f"grad/{name}",
            layer,
            lambda: layer(
                x, y, key=k, attention_mask=data["amask"], training=True
            ),
        )
    # Attached guidance and reversed CT adversaries; per-head GAN.
    layer = layers["hnas_terms"]
    grad_case(
        "grad/hnas_terms",
        layer,
        lambda: layer(x, x, attention_mask=data["key_only"], training=True),
    )
    for name in ("kq_gan", "kq_gan_ns_head"):
        term = layers[name]
        grad_case(
            f"grad/{name}",
            term,
            lambda: term(
                data["q4"], data["k4"], query_mask=qmask, key_mask=vmask
            ),
        )
    grad_case(
        "grad/encoder",
        encoder,
        lambda: encoder(data["ids"], view=1, training=True),
    )

    # One key, one query, an example with no valid key.
    edge = np.ones((B, T, 1), bool)
    edge[1] = False
    for name in ("dnas_e", "dnas_f", "hnas_f", "gumbel_argmax", "gumbel_st"):
        layer = layers[name]
        for training in (False, True):
            key = f"edge/{name}/{training}"
            case(
                key,
                lambda: put(
                    key,
                    layer(
                        x,
                        y[:, :1],
                        key=k[:, :1],
                        attention_mask=edge,
                        training=training,
                        return_attention_scores=True,
                    ),
                ),
            )
            key = f"edge/{name}/{training}/one_query"
            case(
                key,
                lambda: put(
                    key,
                    layer(
                        x[:, :1], y, key=k, value_mask=vmask, training=training
                    ),
                ),
            )

    # Large logits and exact ties.
    for name in (
        "dnas_e",
        "dnas_f",
        "hnas_e",
        "hnas_f",
        "gumbel_argmax",
        "gumbel_soft",
    ):
        layer = layers[name]
        for training in (False, True):
            key = f"large/{name}/{training}"
            case(
                key,
                lambda: put(
                    key,
                    layer(
                        30 * x,
                        30 * y,
                        key=30 * k,
                        attention_mask=data["amask"],
                        training=training,
                        return_attention_scores=True,
                    ),
                ),
            )
    # Exact key ties. Zero key rows project to exactly the key bias on
    # every backend; repeated nonzero rows do not: TensorFlow's CPU matmul
    # can round a block of rows differently from the rest (seen on some
    # CI machines), which breaks the tie before the layer sees it.
    tied = np.zeros_like(k)
    tie_mask = np.ones((B, T, S), bool)
    tie_mask[:, ::2, 0] = False
    tie_mask[1, 1, :3] = False
    for name in ("gumbel_argmax", "gumbel_st"):
        layer = layers[name]
        key = f"ties/{name}"
        case(
            key,
            lambda: put(
                key,
                layer(
                    x,
                    y,
                    key=tied,
                    attention_mask=tie_mask,
                    return_attention_scores=True,
                ),
            ),
        )

    # `.keras` files saved by the reference backend, loaded here.
    for name in SAVED_MODELS:
        key = f"saved/{name}"

        def run_saved():
            from keras_attnvariants.testing import layer_zoo

            model = keras.saving.load_model(
                os.path.join(saved_dir, f"{name}.keras")
            )
            inputs = layer_zoo.training_data(num=4)[0]["tokens"]
            if name == "model_block":
                inputs = data["ids"]
            put(key, model.predict(inputs, verbose=0))
            put(f"{key}/train", model(inputs, training=True))
            put(f"{key}/losses", list(model.losses))

        case(key, run_saved)

    # Pure ops.
    def run_ops():
        scores = np.random.default_rng(3).normal(size=(B, HEADS, T, S)) * 2
        scores = scores.astype("float32")
        mask = data["amask"][:, None]
        value = np.random.default_rng(4).normal(size=(B, S, HEADS, KEY_DIM))
        value = value.astype("float32")
        mix = np.array([0.0, 0.3, 1.0], "float32").reshape(HEADS, 1, 1)
        put("ops/softmax", kops.masked_softmax(scores, mask))
        put("ops/dnas", kops.doubly_normalize(scores, mask))
        put("ops/dnas3", kops.doubly_normalize(scores, mask, iterations=3))
        put("ops/hnas", kops.hybrid_normalize(scores, mix, mask))
        put("ops/bias", kops.doubly_normalized_bias(scores, mask))
        put("ops/softmax_attend", combine.softmax_attend(scores, value, mask))
        put(
            "ops/dnas_attend",
            combine.doubly_normalized_attend(scores, value, mask),
        )
        put(
            "ops/hybrid_attend", combine.hybrid_attend(scores, value, mix, mask)
        )
        put("ops/causal", kops.causal_mask(4, 6))
        uniform = kops.positional_uniform(123456789, (B, HEADS, T, S))
        put("ops/uniform", uniform)
        put(
            "ops/uniform_bits",
            ops.cast(ops.round(ops.multiply(uniform, 2.0**24) - 0.5), "int32"),
        )
        put("ops/uniform_key", kops.positional_uniform(2**32 + 7, (3, 4)))
        noise = kops.gumbel_from_uniform(uniform)
        put("ops/gumbel", noise)
        put("ops/relaxed", kops.relaxed_sample(scores, noise, 0.5, mask))
        put(
            "ops/relaxed_attend",
            combine.relaxed_gumbel_attend(scores, value, noise, 0.5, mask),
        )
        put(
            "ops/st_attend",
            combine.straight_through_gumbel_attend(
                scores, value, noise, 0.5, mask
            ),
        )
        put("ops/one_hot", kops.one_hot_argmax(scores, mask))
        indices = np.random.default_rng(5).integers(0, S, size=(B, HEADS, T))
        put("ops/gather", kops.gather_values(value, indices))
        d_out = np.random.default_rng(6).normal(size=(B, T, HEADS, KEY_DIM))
        put(
            "ops/scatter",
            kops.scatter_values(d_out.astype("float32"), indices, value.shape),
        )
        generator = keras.random.SeedGenerator(42)
        ones = np.ones((B, HEADS, T, S), "float32")
        put(
            "ops/dropout",
            [positional_dropout(ones, 0.4, generator) for _ in range(2)],
        )
        q, kk = data["q4"][:, :, 0], data["k4"][:, :, 0]
        cost = kops.squared_euclidean_cost(q, kk)
        put("ops/sinkhorn", kops.sinkhorn_plan(cost, 0.05, 25, qmask, vmask))
        put(
            "ops/sinkhorn_cost",
            kops.sinkhorn_cost(cost, 0.05, 25, qmask, vmask),
        )
        put(
            "ops/ct",
            kops.conditional_transport_cost(
                kops.cosine_cost(q, kk), -cost, qmask, vmask, rho=0.3
            ),
        )
        put("ops/mmd", kops.gaussian_mmd(q, kk, qmask, vmask, 1.5))
        one_hot = kops.one_hot_argmax(
            scores[:, :, :, :T], data["self_mask"][:, None]
        )
        fields = kops.receptive_fields([one_hot, one_hot], qmask)
        put("ops/fields", fields)
        put("ops/field_size", kops.receptive_field_mean_size(fields, qmask))
        put("ops/guidance_next", kops.guidance_pattern("next", qmask))
        left = qmask[:, ::-1]  # left padding
        put("ops/guidance_first_left", kops.guidance_pattern("first", left))
        put(
            "ops/guidance_bias",
            guidance_attention_bias({0: "prev", 2: "first"}, HEADS, left, 2.5),
        )
        empty = np.zeros_like(vmask)
        empty[0] = True
        put(
            "ops/sinkhorn_empty",
            kops.sinkhorn_plan(cost, 0.05, 12, qmask, empty),
        )
        put(
            "ops/reversal",
            kops.gradient_reversal(
                np.array([1.0, np.inf, -np.inf, np.nan], "float32"), 0.5
            ),
        )

    case("ops", run_ops)
    if PROFILE:
        for section, seconds in sorted(timings.items(), key=lambda t: -t[1]):
            print(f"{section}: {seconds:.2f} s", file=sys.stderr)
    return results


def trainable_gradients(layer, objective):
    """Gradients of `objective() + sum(losses added)` for
    `layer.trainable_variables`, on the active backend; advances the
    layer's non-trainable state (seed generators, counters) as an eager
    call does."""
    import keras

    backend = keras.config.backend()
    variables = layer.trainable_variables
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            total = objective() + sum(layer.losses)
        grads = tape.gradient(total, [v.value for v in variables])
        return [
            g if g is not None else np.zeros(v.shape, "float32")
            for g, v in zip(grads, variables)
        ]
    if backend == "jax":
        import jax
        from keras.src.backend.common.stateless_scope import StatelessScope

        others = layer.non_trainable_variables

        # Jitted: one XLA compile per case costs less than tracing the
        # gradient op by op.
        @jax.jit
        def gradient(values, states):
            def loss(values):
                mapping = list(zip(variables, values)) + list(
                    zip(others, states)
                )
                with StatelessScope(
                    state_mapping=mapping, collect_losses=True
                ) as scope:
                    total = objective() + sum(scope.losses)
                    state = [scope.get_current_value(v) for v in others]
                return total, state

            return jax.grad(loss, has_aux=True)(values)

        grads, state = gradient(
            [v.value for v in variables], [v.value for v in others]
        )
        for variable, value in zip(others, state):
            if value is not None:
                variable.assign(value)
        return grads
    for v in variables:
        v.value.grad = None
    total = objective() + sum(layer.losses)
    total.backward()
    return [
        np.zeros(v.shape, "float32")
        if v.value.grad is None
        else v.value.grad.detach()
        for v in variables
    ]


# --------------------------------------------------------------------------
# Worker and comparison
# --------------------------------------------------------------------------


def _save(path, arrays):
    np.savez(path, **arrays)


def _load(path):
    with np.load(path, allow_pickle=False) as f:
        return {key: f[key] for key in f.files}


class _NumpyInitializerRandom:
    """The backend `random` module as Keras's random initializers see it,
    with their draws made by NumPy.

    The worker overwrites every initial value with the reference weights,
    and JAX compiles one random kernel per shape (about 5 s of the
    worker's layer building); NumPy draws cost nothing.
    """

    def __init__(self, module):
        self._module = module
        self._rng = np.random.default_rng(0)

    def __getattr__(self, name):
        return getattr(self._module, name)

    def _draw(self, shape, dtype):
        from keras import ops

        return ops.convert_to_tensor(
            self._rng.uniform(-0.1, 0.1, size=shape), dtype or "float32"
        )

    def normal(self, shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
        return self._draw(shape, dtype)

    def truncated_normal(
        self, shape, mean=0.0, stddev=1.0, dtype=None, seed=None
    ):
        return self._draw(shape, dtype)

    def uniform(self, shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
        return self._draw(shape, dtype)


def _cheap_initializers():
    """Random initial weights from NumPy (see `_NumpyInitializerRandom`);
    nothing changes if Keras's module layout differs."""
    try:
        from keras.src.initializers import random_initializers
    except ImportError:
        return
    module = getattr(random_initializers, "random", None)
    if module is not None and not isinstance(module, _NumpyInitializerRandom):
        random_initializers.random = _NumpyInitializerRandom(module)


def worker(in_path, out_path):
    """Rebuilds the layers, loads the reference weights, runs the cases."""
    _cheap_initializers()
    stored = _load(in_path)
    data = {k[5:]: v for k, v in stored.items() if k.startswith("data/")}
    start = time.perf_counter()
    layers = make_layers(data)
    if PROFILE:
        print(
            f"make_layers: {time.perf_counter() - start:.2f} s", file=sys.stderr
        )
    for name, layer in layers.items():
        count = len(layer.weights)
        layer.set_weights([stored[f"weights/{name}/{i}"] for i in range(count)])
    _save(out_path, run_cases(layers, data, os.path.dirname(in_path)))


def reference(path):
    """This process's backend: weights, inputs and outputs."""
    data = make_inputs()
    layers = make_layers(data)
    weights = randomize_weights(layers)
    arrays = {f"data/{k}": v for k, v in data.items()}
    for name, values in weights.items():
        for i, value in enumerate(values):
            arrays[f"weights/{name}/{i}"] = value
    _save(path, arrays)
    saved_dir = os.path.dirname(path)
    for name in SAVED_MODELS:
        layers[name].save(os.path.join(saved_dir, f"{name}.keras"))
    return run_cases(layers, data, saved_dir)


def tolerance(key):
    """`(atol, rtol)` for a result key."""
    if key.startswith("mixed/"):
        return 6e-2, 6e-2
    if key.startswith("grad/") or key.startswith("large/"):
        # Gradients and large logits: float32 round-off grows with them
        # (every backend is as far from a float64 run).
        return 1e-4, 1e-4
    if "kq_ot" in key or "sinkhorn" in key:
        return 1e-4, 1e-4
    return 2e-5, 2e-5


def low_precision_pick(key):
    """Gumbel picks in low precision: a rounding difference between
    backends may flip a near tie, so only finiteness is compared."""
    return key.startswith("mixed/") and "gumbel" in key


def skipped_error(case, backend):
    """Errors of documented limitations."""
    # PyTorch's CPU kernels may lack float16 (`TestCase` skips it too).
    return case.startswith("mixed/mixed_float16") and backend == "torch"


def compare(ref, got, backend):
    """Problems of `got` against `ref`, one line each."""
    problems = []
    for key in sorted(ref):
        if key.startswith("error/"):
            continue
        if key not in got:
            # A key of a case that raised there is reported with the error.
            base = key[6:] if key.startswith("dtype/") else key
            if not any(
                e.startswith("error/") and base.startswith(e[6:] + "/")
                for e in got
            ):
                problems.append(f"{backend}: {key} missing")
            continue
        want, have = ref[key], got[key]
        if key.startswith("dtype/"):
            if str(want) != str(have):
                problems.append(f"{backend}: {key} {have} != {want}")
            continue
        if want.shape != have.shape:
            problems.append(
                f"{backend}: {key} shape {have.shape} != {want.shape}"
            )
            continue
        if key.startswith("mixed/"):
            if not np.all(np.isfinite(have)):
                problems.append(f"{backend}: {key} not finite")
                continue
            if low_precision_pick(key):
                continue
        atol, rtol = tolerance(key)
        close = np.isclose(have, want, atol=atol, rtol=rtol, equal_nan=True)
        if not close.all():
            diff = np.nanmax(np.abs(have - want))
            problems.append(
                f"{backend}: {key} max diff {diff:.3g} "
                f"({int((~close).sum())}/{close.size} entries)"
            )
    for key in sorted(got):
        if key.startswith("error/") and key not in ref:
            if skipped_error(key[6:], backend):
                continue
            last = str(got[key]).strip().splitlines()[-1]
            problems.append(f"{backend}: {key[6:]} raised: {last}")
    return problems


def start_worker(backend, in_path, out_path):
    """The worker process of `backend` (stdout and stderr to files)."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    log = open(out_path + ".log", "w")  # noqa: SIM115 (closed in finish)
    process = subprocess.Popen(
        [
            sys.executable,
            os.path.abspath(__file__),
            "worker",
            in_path,
            out_path,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    return process, log


def finish_worker(backend, process, log, out_path):
    """The worker's results; `AssertionError` with its log if it failed."""
    try:
        code = process.wait(timeout=WORKER_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        code = "timeout"
    log.close()
    if PROFILE or code != 0:
        with open(out_path + ".log") as f:
            output = f.read()
        if PROFILE:  # the worker's section times
            print(f"{backend} worker:\n{output}", file=sys.stderr)
        if code != 0:
            raise AssertionError(
                f"{backend} worker failed ({code}):\n{output[-4000:]}"
            )
    return _load(out_path)


def _installed(backend):
    return importlib.util.find_spec(backend) is not None


def test_cross_backend_parity():
    import keras
    import pytest

    this = keras.config.backend()
    others = [b for b in BACKENDS if b != this and _installed(b)]
    if not others:
        pytest.skip("no other Keras backend installed")
    with tempfile.TemporaryDirectory() as tmp:
        in_path = os.path.join(tmp, "reference.npz")
        start = time.perf_counter()
        ref = reference(in_path)
        print(f"{this} (reference): {time.perf_counter() - start:.1f} s")
        problems = [
            f"{this}: {key[6:]} raised: {str(v).strip().splitlines()[-1]}"
            for key, v in ref.items()
            if key.startswith("error/") and not skipped_error(key[6:], this)
        ]
        # The workers run side by side (JAX's compiles dominate).
        start = time.perf_counter()
        workers = {
            backend: (
                *start_worker(backend, in_path, f"{in_path}.{backend}.npz"),
                f"{in_path}.{backend}.npz",
            )
            for backend in others
        }
        for backend, (process, log, out_path) in workers.items():
            got = finish_worker(backend, process, log, out_path)
            print(f"{backend}: done at {time.perf_counter() - start:.1f} s")
            problems += compare(ref, got, backend)
    # Guards against a vacuous comparison.
    assert sum(not k.startswith(("error/", "dtype/")) for k in ref) > 500
    assert not problems, "\n".join(problems)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "worker":
    worker(sys.argv[2], sys.argv[3])
