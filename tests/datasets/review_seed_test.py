import pytest

from keras_attnvariants.datasets.arithmetic import multiview_arithmetic
from keras_attnvariants.datasets.stack_language import stack_language


@pytest.mark.parametrize("generate", [multiview_arithmetic, stack_language])
@pytest.mark.parametrize("seed", ["0", -1, 1.5, True])
def test_bad_seed_raises_value_error_naming_seed(generate, seed):
    # Used to raise NumPy's TypeError ("SeedSequence expects int ...") or a
    # ValueError that did not name the argument ("expected non-negative
    # integer"); a bool was taken as the seed 1.
    with pytest.raises(ValueError, match=r"`seed` must be .*Received: seed="):
        generate(3, seed=seed)
