"""Test-session setup: full float32 matmuls on every device.

The tests compare layers with float32 / float64 NumPy references at float32
tolerances. On Ampere and later GPUs, TensorFlow and JAX run float32
matmuls as TensorFloat-32 by default (10-bit mantissa, errors near 1e-3),
which such comparisons do not allow; TensorFlow's own tests turn it off
the same way (`run_without_tensor_float_32`). A no-op on CPUs, where CI
runs. Models trained by users keep each framework's default.

XLA compiles without LLVM's optimizations (`_fast_xla_compiles`): the
tests compile thousands of tiny programs (every eager JAX op, every
`jit_compile=True` step on TensorFlow and JAX, in-process and in the
subprocesses that inherit the environment), whose compile time is the
cost, not their run time. A flag already in `XLA_FLAGS` is kept.

Every test also starts from the same global seed, so layers built without
a seed get the same initial weights whichever tests ran before (and on
whichever pytest-xdist worker): a threshold on their outputs cannot pass
or fail by test order.
"""

import json
import os


def _fast_xla_compiles():
    # LLVM at -O0 and its expensive passes off (what JAX's
    # `jax_disable_most_optimizations` sets; XLA_FLAGS reaches TensorFlow's
    # XLA too). XLA's own graph passes (fusion, buffer assignment) still
    # run; float32 results can differ in the last bit (3 DNAS/HNAS/Gumbel
    # layers' outputs and gradients: at most 1.2e-7 relative), well inside
    # the tests' tolerances. Eager JAX layer calls took 35% less CPU time,
    # TensorFlow `jit_compile=True` fits 20% less (2026-12-01).
    flags = os.environ.get("XLA_FLAGS", "").split()
    for flag in (
        "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true",
    ):
        if not any(f.startswith(flag.split("=")[0] + "=") for f in flags):
            flags.append(flag)
    os.environ["XLA_FLAGS"] = " ".join(flags)


# Before Keras imports a backend: XLA reads the flags once, at its first use.
_fast_xla_compiles()

import keras  # noqa: E402
import pytest  # noqa: E402


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
