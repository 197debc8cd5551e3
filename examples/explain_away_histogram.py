"""The idea of the paper's Fig. 1: how much attention each key receives.

One attention layer (single head, 100 keys as in the paper's VQA model)
with random projections on inputs scaled by `--scale` (sharp attention),
applied as softmax attention and as DNAS with the same weights; plots the
histogram of log(sum_i A_ij) of both and prints the fraction of
epsilon-explained-away
keys (sum_i A_ij < 1e-8, paper Definition 1).

    python examples/explain_away_histogram.py [--output explain_away.png]
"""

import argparse

import matplotlib

matplotlib.use("Agg")
import keras  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from flag_types import output_file  # noqa: E402
from flag_types import positive_float  # noqa: E402

import keras_attnvariants as kav  # noqa: E402
from keras_attnvariants import evaluation  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output", type=output_file, default="explain_away.png"
    )
    parser.add_argument(
        "--scale",
        type=positive_float,
        default=6.0,
        help="input scale: larger means sharper attention",
    )
    return parser.parse_args(argv)


def main():
    args = parse_args()
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(16, 20, 32)).astype("float32") * args.scale
    keys = rng.normal(size=(16, 100, 32)).astype("float32") * args.scale
    keras.utils.set_random_seed(0)
    softmax = kav.HybridAttention(1, 32, hybrid_init=0.0)
    dnas = kav.DoublyNormalizedAttention(1, 32)
    totals = {}
    for name, layer in (("softmax", softmax), ("DNAS", dnas)):
        layer(queries, keys)
        if layer is dnas:  # same projections for both
            for sub in (
                "query_dense",
                "key_dense",
                "value_dense",
                "output_dense",
            ):
                getattr(dnas, sub).set_weights(
                    getattr(softmax, sub).get_weights()
                )
        _, weights = layer(queries, keys, return_attention_scores=True)
        weights = keras.ops.convert_to_numpy(weights)
        totals[name] = evaluation.key_attention_totals(weights).ravel()
        fraction = evaluation.explained_away_fraction(weights)
        print(
            f"{name:8s} epsilon-explained-away keys (1e-8): {fraction:.3f}; "
            f"min total attention {totals[name].min():.2e}"
        )
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, value in totals.items():
        ax.hist(
            np.log(np.maximum(value, 1e-300)), bins=60, alpha=0.6, label=name
        )
    ax.axvline(np.log(1 / 100), color="k", ls="--", lw=1, label="log(1/S)")
    ax.set(xlabel="log sum_i A_ij", ylabel="keys", title="Explaining away")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print("saved", args.output)


if __name__ == "__main__":
    main()
