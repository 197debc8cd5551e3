"""Table 6.5 of Kinley (2020): multiview arithmetic with two-stream models.

Three models classify arithmetic expressions (digits 0-4, `+`, `*`, value
mod 5, nesting depth 1-3) from their characters:

- a two-stream transformer trained on the prefix view only,
- a two-stream transformer trained on the infix view only,
- the multiview two-stream transformer: one controller per view, one shared
  model stream (and classifier), trained on both views at once with the sum
  of the two cross-entropies.

Each controller stream has its own token and position embeddings (the
thesis: "a separate controller stream for each of x_infix and x_prefix");
`--share-embeddings` makes the controllers reuse the model stream's.

As a control, `--models transformer-prefix transformer-infix` trains a
standard soft-attention transformer of the same size (keras-hub
`TransformerEncoder`, post-layer-norm, on `keras.layers.MultiHeadAttention`)
with the same data, head and optimizer: it tells whether the two-stream
layers or the training recipe limit the accuracy.

As in the thesis (section 5.3, footnote 3) the model stream uses the
controller's soft attention (`model_attention="soft"`). Each expression is
prefixed with a `<cls>` token whose final model-stream state is projected
to the 5 classes. The script prints the test accuracy (%) overall and by
depth next to the thesis's Table 6.5.

Usage:

    python examples/thesis_multiview_arithmetic.py --quick   # CI, < 60 s
    python examples/thesis_multiview_arithmetic.py           # thesis sizes
    python examples/thesis_multiview_arithmetic.py --train-size 10000 \\
        --epochs 10 --num-layers 6
    # To the plateau on a GPU (docs/gumbel_results.md: 56-75 epochs):
    KERAS_BACKEND=jax python examples/thesis_multiview_arithmetic.py \\
        --models multiview --epochs 300 --time-limit 520
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from flag_types import non_negative_int  # noqa: E402
from flag_types import output_file  # noqa: E402
from flag_types import positive_float  # noqa: E402
from flag_types import positive_int  # noqa: E402
from flag_types import seed  # noqa: E402

from keras_attnvariants import distribute  # noqa: E402
from keras_attnvariants.datasets.arithmetic import multiview_arithmetic  # noqa: E402
from keras_attnvariants.datasets.arithmetic import tokenize  # noqa: E402
from keras_attnvariants.layers.two_stream_encoder import TwoStreamEncoder  # noqa: E402

VIEWS = ("prefix", "infix")
CLS = 10  # token ids 1..9 come from `tokenize`, 0 is padding
VOCAB_SIZE = 11
NUM_CLASSES = 5
DEPTHS = (1, 2, 3)

# Table 6.5 (accuracy %): all depths, depth 1, 2, 3. The thesis prints
# "0.75" for the prefix model at depth 1, a fraction among percentages: its
# all-depths figure, 45.9, is the mean of 75.0, 33.6 and 29.2.
THESIS = {
    ("separate", "prefix"): (45.9, 75.0, 33.6, 29.2),
    ("separate", "infix"): (66.0, 97.6, 63.7, 36.8),
    ("multiview", "prefix"): (65.3, 97.9, 62.6, 35.5),
    ("multiview", "infix"): (68.3, 97.9, 66.9, 40.1),
}


# --models name: (kind, views)
PLANS = {
    "prefix": ("separate", ("prefix",)),
    "infix": ("separate", ("infix",)),
    "multiview": ("multiview", VIEWS),
    "transformer-prefix": ("transformer", ("prefix",)),
    "transformer-infix": ("transformer", ("infix",)),
}


# --quick: a tiny CI run. XLA compiles cost more than its few steps.
QUICK = dict(
    train_size=400,
    test_size=100,
    epochs=1,
    num_layers=1,
    batch_size=32,
    jit_compile=False,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Reproduce Table 6.5 (multiview arithmetic).",
        usage="%(prog)s [--quick] [options] (see --help)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny CI run (< 60 s)"
    )
    parser.add_argument("--train-size", type=positive_int, default=30000)
    parser.add_argument("--test-size", type=positive_int, default=3000)
    parser.add_argument("--epochs", type=positive_int, default=10)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--num-layers", type=positive_int, default=6)
    parser.add_argument("--d-model", type=positive_int, default=64)
    parser.add_argument("--d-ff", type=positive_int, default=128)
    parser.add_argument("--num-heads", type=positive_int, default=4)
    parser.add_argument("--learning-rate", type=positive_float, default=5e-4)
    parser.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        default=0,
        help="linear warm-up steps, then inverse-sqrt decay (fairseq's "
        "inverse_sqrt); 0 = constant learning rate",
    )
    parser.add_argument(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train with XLA",
    )
    parser.add_argument(
        "--share-embeddings",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="controllers reuse the model stream's token and position "
        "embeddings (default: each view's controller stream has its own; "
        "shared, the multiview model learned far more slowly)",
    )
    parser.add_argument(
        "--time-limit",
        type=positive_float,
        default=None,
        help="seconds per model: training stops after the epoch in which "
        "the limit passes (the table then states the epochs run)",
    )
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument(
        "--models",
        nargs="+",
        choices=tuple(PLANS),
        default=["prefix", "infix", "multiview"],
        help="which models to train (transformer-*: a standard transformer "
        "of the same size on one view, as a control)",
    )
    parser.add_argument(
        "--plot", type=output_file, help="optional PNG of accuracy by depth"
    )
    args = parser.parse_args(argv)
    if args.quick:  # new defaults: flags given explicitly still apply
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    if args.d_model % args.num_heads:
        parser.error(
            f"--d-model must be divisible by --num-heads, got "
            f"{args.d_model} and {args.num_heads}"
        )
    return args


def encode(data, length):
    """`{view: int32 (n, length)}`: `<cls>` + characters, 0-padded."""
    out = {}
    for view in VIEWS:
        ids = tokenize(data[view])
        padded = np.zeros((len(ids), length), "int32")
        padded[:, 0] = CLS
        padded[:, 1 : ids.shape[1] + 1] = ids
        out[view] = padded
    return out


class BucketedBatches(keras.utils.PyDataset):
    """Training batches padded to their bucket's length, not the longest.

    Expressions of depth 1 are ~10 characters and depth 3 up to ~60, so
    padding every batch to the longest wastes most of the step. Examples
    are grouped by the length of their longest view rounded up to a
    multiple of `bucket`; each epoch reshuffles within buckets and the
    order of the (full) batches. The encoder masks padding, so outputs
    do not depend on the padded length: this only saves time.
    """

    def __init__(self, inputs, labels, batch_size, seed, bucket=16):
        super().__init__()
        self.inputs, self.labels = inputs, labels
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)
        lengths = np.max([(x > 0).sum(1) for x in inputs.values()], axis=0)
        self.width = -(-lengths // bucket) * bucket
        self.buckets = [
            np.flatnonzero(self.width == w) for w in set(self.width)
        ]
        self._plan()

    def _plan(self):
        batches = []
        for members in self.buckets:
            members = self.rng.permutation(members)
            usable = len(members) - len(members) % self.batch_size
            if usable == 0:  # a bucket smaller than one batch
                batches.append(members)
                continue
            batches.extend(
                np.split(members[:usable], usable // self.batch_size)
            )
        self.batches = [batches[i] for i in self.rng.permutation(len(batches))]

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        rows = np.sort(self.batches[index])
        width = int(self.width[rows].max())
        x = {v: ids[rows, :width] for v, ids in self.inputs.items()}
        y = {v: self.labels[rows] for v in self.inputs}
        return x, y

    def on_epoch_end(self):
        self._plan()

    def for_fit(self):
        """What to pass to `fit`: this PyDataset, or on TensorFlow a
        `tf.data.Dataset` of its batches with unknown widths.

        Keras's TensorFlow adapter fixes a PyDataset's shapes from its
        first two batches, so a later batch of another width failed
        ("yielded an element of shape (32, 48) where an element of shape
        (None, 16) was expected") whenever the first two shared a bucket.
        The generator replans (reshuffles) after each pass, one per epoch.
        """
        if keras.backend.backend() != "tensorflow":
            return self
        import tensorflow as tf

        x, y = self[0]

        def spec(array):
            return tf.TensorSpec((None,) * array.ndim, array.dtype)

        def generate():
            for index in range(len(self)):
                yield self[index]
            self.on_epoch_end()

        signature = (
            {v: spec(a) for v, a in x.items()},
            {v: spec(a) for v, a in y.items()},
        )
        dataset = tf.data.Dataset.from_generator(
            generate, output_signature=signature
        )
        # Every epoch plans as many batches (the buckets do not change);
        # without a known length Keras warns that the data ran out.
        return dataset.apply(tf.data.experimental.assert_cardinality(len(self)))


@keras.saving.register_keras_serializable(package="examples")
class InverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak` over `warmup` steps, then `peak/sqrt(t/w)`."""

    def __init__(self, peak, warmup):
        self.peak, self.warmup = float(peak), int(warmup)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32") + 1.0
        warmup = float(self.warmup)
        return self.peak * keras.ops.minimum(
            step / warmup, keras.ops.sqrt(warmup / step)
        )

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup}


class EpochReport(keras.callbacks.Callback):
    """Prints the loss and the test accuracy (%) per view after each epoch."""

    def __init__(self, inputs, test):
        super().__init__()
        self.inputs, self.test = inputs, test

    def on_epoch_end(self, epoch, logs=None):
        predictions = self.model.predict(self.inputs, batch_size=256, verbose=0)
        label, depth = self.test["label"], self.test["depth"]
        cells = [
            f"{v} {accuracy_by_depth(p, label, depth)[0]:.1f}"
            for v, p in predictions.items()
        ]
        print(
            f"  epoch {epoch + 1}: loss {logs['loss']:.3f}, test accuracy % "
            + ", ".join(cells),
            flush=True,
        )


class TimeLimit(keras.callbacks.Callback):
    """Stops training after the epoch in which `seconds` have passed."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds
        self.epochs = 0

    def on_train_begin(self, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epochs = epoch + 1
        if time.perf_counter() - self.start > self.seconds:
            self.model.stop_training = True


def build_model(kind, views, length, args):
    """A classifier over `views`, compiled.

    `kind` "separate" / "multiview": a two-stream encoder with one
    controller per view. "transformer" (one view): a standard transformer
    of the same size, the control. Seeded with `args.seed` here, so a
    model starts from the same weights whichever models were built before.
    """
    keras.utils.set_random_seed(args.seed)
    # Variable length: the training batches come in bucket widths.
    inputs = {v: keras.Input((None,), dtype="int32", name=v) for v in views}
    if kind == "transformer":
        import keras_hub  # only the control needs it

        (view,) = views
        x = keras_hub.layers.TokenAndPositionEmbedding(
            VOCAB_SIZE, length, args.d_model, name="embeddings"
        )(inputs[view])
        padding_mask = keras.ops.not_equal(inputs[view], 0)
        for i in range(args.num_layers):
            x = keras_hub.layers.TransformerEncoder(
                args.d_ff, args.num_heads, name=f"block{i}"
            )(x, padding_mask=padding_mask)
        states = {view: x}
    else:
        encoder = TwoStreamEncoder(
            VOCAB_SIZE,
            length,
            args.num_layers,
            d_model=args.d_model,
            num_heads=args.num_heads,
            d_ff=args.d_ff,
            num_views=len(views),
            share_embeddings=args.share_embeddings,
            model_attention="soft",
            seed=args.seed,
            name="encoder",
        )
        states = {v: encoder(inputs[v], view=i) for i, v in enumerate(views)}
    head = keras.layers.Dense(NUM_CLASSES, name="classifier")
    model = keras.Model(inputs, {v: head(states[v][:, 0]) for v in views})
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(
        optimizer=keras.optimizers.Adam(
            InverseSqrt(args.learning_rate, args.warmup_steps)
            if args.warmup_steps
            else args.learning_rate,
            clipnorm=1.0,
        ),
        loss={v: loss for v in views},
        # Each bucket width compiles once; without XLA the varying widths
        # run as a dynamic-shape graph no faster than full padding.
        jit_compile=args.jit_compile,
    )
    return model


def seen_in_training(train, test):
    """Booleans per test example: its expression is also in the training
    set. Both sets are i.i.d. draws, as in the thesis, and depth 1 has
    few distinct expressions: at the thesis's 30,000 / 3,000, about 81% of
    the depth-1 test expressions (27% of all) were training examples."""
    return np.isin(test["infix"], train["infix"])


def _percent(flags):
    return 100 * flags.mean() if flags.size else float("nan")


def overlap_by_depth(seen, depth):
    """% of test expressions seen in training: overall, depths 1..3."""
    return (_percent(seen), *(_percent(seen[depth == d]) for d in DEPTHS))


def accuracy_by_depth(logits, labels, depth, seen=None):
    """Accuracy % overall and for depths 1..3; with `seen` (booleans, see
    `seen_in_training`), then on the test expressions not seen in
    training."""
    correct = np.argmax(logits, -1) == labels
    values = (
        _percent(correct),
        *(_percent(correct[depth == d]) for d in DEPTHS),
    )
    if seen is None:
        return values
    return (*values, _percent(correct[~seen]))


def run(args):
    keras.utils.set_random_seed(args.seed)
    train = multiview_arithmetic(args.train_size, seed=args.seed)
    test = multiview_arithmetic(args.test_size, seed=args.seed + 1)
    length = 1 + max(
        tokenize(data[v]).shape[1] for data in (train, test) for v in VIEWS
    )
    x_train, x_test = encode(train, length), encode(test, length)
    seen = seen_in_training(train, test)
    results, timings, epochs_run = {}, {}, {}
    for name in args.models:
        kind, views = PLANS[name]
        with distribute.model_scope():
            model = build_model(kind, views, length, args)
            batches = BucketedBatches(
                {v: x_train[v] for v in views},
                train["label"],
                args.batch_size,
                args.seed,
            )
            start = time.perf_counter()
            callbacks = (
                []
                if args.quick
                else [EpochReport({v: x_test[v] for v in views}, test)]
            )
            limit = TimeLimit(args.time_limit or float("inf"))
            model.fit(
                batches.for_fit(),
                epochs=args.epochs,
                shuffle=False,  # BucketedBatches reshuffles every epoch
                verbose=0,
                callbacks=callbacks + [limit],
            )
            timings[name] = time.perf_counter() - start
            if limit.epochs < args.epochs:
                print(
                    f"[{name}: time limit, stopped after {limit.epochs} of "
                    f"{args.epochs} epochs]",
                    flush=True,
                )
            predictions = model.predict(
                {v: x_test[v] for v in views}, batch_size=256, verbose=0
            )
        for v in views:
            results[(kind, v)] = accuracy_by_depth(
                predictions[v], test["label"], test["depth"], seen
            )
            epochs_run[(kind, v)] = limit.epochs
        print(f"[{name}: trained in {timings[name]:.1f} s]", flush=True)
    overlap = overlap_by_depth(seen, test["depth"])
    return results, timings, length, epochs_run, overlap


def table(results, epochs_run):
    """Markdown table: measured accuracy next to the thesis's.

    `epochs_run` maps `(kind, view)` to the epochs trained, which
    `--time-limit` can make fewer than `--epochs`. A fifth measured value
    (`accuracy_by_depth` with `seen`) is the "unseen" column: accuracy on
    the test expressions that are not training examples (no thesis
    figure).
    """
    unseen = any(len(m) > len(DEPTHS) + 1 for m in results.values())
    lines = [
        "| model | view | epochs | all (thesis) | depth 1 (thesis) "
        "| depth 2 (thesis) | depth 3 (thesis) |"
        + (" unseen |" if unseen else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if unseen else ""),
    ]
    for (kind, view), measured in results.items():
        thesis = THESIS.get((kind, view), ("-",) * (len(DEPTHS) + 1))
        cells = [f"{m:.1f} ({t})" for m, t in zip(measured, thesis)]
        cells += [f"{m:.1f}" for m in measured[len(thesis) :]]
        lines.append(
            f"| {kind} | {view} | {epochs_run[(kind, view)]} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (kind, view), measured in results.items():
        ax.plot(
            DEPTHS,
            measured[1 : len(DEPTHS) + 1],
            marker="o",
            label=f"{kind} {view}",
        )
    ax.set_xlabel("depth")
    ax.set_ylabel("test accuracy (%)")
    ax.set_xticks(DEPTHS)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    results, timings, length, epochs_run, overlap = run(args)
    print(
        f"\nTable 6.5, multiview arithmetic: train {args.train_size} / test "
        f"{args.test_size}, at most {args.epochs} epochs (the epochs run are "
        f"in the table), {args.num_layers} layers, "
        f"d_model {args.d_model}, d_ff {args.d_ff}, {args.num_heads} heads, "
        f"soft model attention, length {length}. Test accuracy % "
        "(thesis in parentheses)."
    )
    print(table(results, epochs_run))
    print(
        f"Test expressions that are also training examples: {overlap[0]:.1f}%"
        " (depth 1 / 2 / 3: "
        + " / ".join(f"{o:.1f}%" for o in overlap[1:])
        + "); 'unseen' is the accuracy on the others."
    )
    if args.plot:
        plot(results, args.plot)
    print(f"\ntotal {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
