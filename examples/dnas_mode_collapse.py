"""Paper Appendix E / Fig. 6: softmax attention collapses modes, DNAS does not.

500 points around [1.8, 0.7] and 50 around [-1, -1] (covariance 0.1 I),
Q = K = I, four steps x <- A(x x^T) x. Saves the two panels side by side and
prints the distance between the cluster means after each step.

    python examples/dnas_mode_collapse.py [--output mode_collapse.png]
"""

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from flag_types import output_file  # noqa: E402
from keras import ops  # noqa: E402

from keras_attnvariants import ops as kav_ops  # noqa: E402
from keras_attnvariants.datasets.toy import self_attention_steps  # noqa: E402
from keras_attnvariants.datasets.toy import two_gaussian_clusters  # noqa: E402


def normalizer(fn):
    return lambda s: ops.convert_to_numpy(fn(s.astype("float32"))).astype(
        np.float64
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output", type=output_file, default="mode_collapse.png"
    )
    return parser.parse_args(argv)


def main():
    args = parse_args()
    points = two_gaussian_clusters(seed=0)
    runs = {
        "softmax (UNAS)": self_attention_steps(
            points, normalizer(kav_ops.masked_softmax)
        ),
        "DNAS": self_attention_steps(
            points, normalizer(kav_ops.doubly_normalize)
        ),
    }
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), sharex=True, sharey=True)
    for ax, (name, history) in zip(axes, runs.items()):
        gaps = [
            np.linalg.norm(h[:500].mean(0) - h[500:].mean(0)) for h in history
        ]
        print(f"{name:15s} cluster-mean distance per step:", np.round(gaps, 3))
        start, end = history[0], history[-1]
        ax.scatter(*start[:500].T, s=4, c="salmon", alpha=0.3)
        ax.scatter(*start[500:].T, s=4, c="lightblue", alpha=0.5)
        ax.scatter(
            *end[:500].T, s=8, c="red", label="500 points, after 4 steps"
        )
        ax.scatter(
            *end[500:].T, s=8, c="blue", label="50 points, after 4 steps"
        )
        ax.set_title(f"{name}: final gap {gaps[-1]:.3f}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print("saved", args.output)


if __name__ == "__main__":
    main()
