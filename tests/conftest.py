"""Test-session setup: full float32 matmuls on every device.

The tests compare layers with float32 / float64 NumPy references at float32
tolerances. On Ampere and later GPUs, TensorFlow and JAX run float32
matmuls as TensorFloat-32 by default (10-bit mantissa, errors near 1e-3),
which such comparisons do not allow; TensorFlow's own tests turn it off
the same way (`run_without_tensor_float_32`). A no-op on CPUs, where CI
runs. Models trained by users keep each framework's default.

Every test also starts from the same global seed, so layers built without
a seed get the same initial weights whichever tests ran before (and on
whichever pytest-xdist worker): a threshold on their outputs cannot pass
or fail by test order.
"""

import json
import os

import keras
import pytest


def _full_float32_matmuls():
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    elif backend == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


_full_float32_matmuls()


@pytest.fixture(autouse=True)
def _seeded():
    keras.utils.set_random_seed(20261127)


# Scheduling for pytest-xdist (`-n 2 --dist loadgroup`, the CI and README
# command). xdist hands out tests in collection order, one at a time; a
# long test that starts late leaves the other worker idle at the end (the
# TensorFlow run took 1,326 s for 2,231 s of tests on 2 workers, 211 s
# over an even split, 2026-11-29). Tests that took 5 s or more in CI
# (`tests/durations.json`, per backend; `.ci/durations.py` rewrites it
# from a run's `--durations` report) now go first, longest first. The
# tests of a unittest class with its own `setUpClass` (a converted
# backbone, built once) stay together on one worker.
_DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")


def _recorded_durations():
    try:
        with open(_DURATIONS) as f:
            return json.load(f).get(keras.config.backend(), {})
    except FileNotFoundError:
        return {}


def _shares_class_setup(cls):
    """Whether `cls` or a test base class of it defines `setUpClass`."""
    for klass in cls.__mro__:
        if "setUpClass" in vars(klass):
            return not klass.__module__.startswith(("unittest", "absl"))
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    durations = _recorded_durations()
    grouping = config.pluginmanager.hasplugin("xdist")
    groups = {}
    for item in items:
        cls = getattr(item, "cls", None)
        key = item.nodeid
        if cls is not None and _shares_class_setup(cls):
            key = f"{item.nodeid.split('::')[0]}::{cls.__name__}"
            if grouping:
                item.add_marker(pytest.mark.xdist_group(key))
        groups.setdefault(key, []).append(item)
    seconds = {
        key: sum(durations.get(item.nodeid, 0.0) for item in group)
        for key, group in groups.items()
    }
    # A stable sort: the rest keep their collection order.
    order = sorted(groups, key=lambda key: -seconds[key])
    items[:] = [item for key in order for item in groups[key]]
