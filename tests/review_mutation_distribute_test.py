"""Distribution helpers and output-path flags a mutation review of
`distribute.py` and `_argparse_types.py` found unpinned (2026-12-02): each
test fails on a mutation the suite let through (the GPU and split-CPU
branches of `pick_strategy`, with devices faked; the backend checks; the
JAX `model_scope`; the writable-folder check, faked as the tests run as
root; bare and relative paths). Also the two path flags it found wrong:
empty text and a dangling link.
"""

import argparse
import contextlib
import os
import threading

import keras
import pytest

on_tf = pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="tf.distribute needs the TensorFlow backend",
)


@pytest.fixture(autouse=True)
def _no_cached_tpu(monkeypatch):
    """Each test starts without a TPU strategy cached by an earlier one."""
    from keras_attnvariants import distribute

    monkeypatch.setattr(distribute, "_TPU_STRATEGIES", {})


def _no_tpu(monkeypatch):
    import tensorflow as tf

    def resolver(tpu=None):
        raise ValueError("Please provide a TPU Name to connect to.")

    monkeypatch.setattr(
        tf.distribute.cluster_resolver, "TPUClusterResolver", resolver
    )


def _fake_logical_devices(monkeypatch, kind, count):
    import tensorflow as tf

    real = tf.config.list_logical_devices
    fake = [
        tf.config.LogicalDevice(
            f"/job:localhost/replica:0/task:0/device:{kind}:{i}", kind
        )
        for i in range(count)
    ]

    def logical_devices(device_type=None):
        return list(fake) if device_type == kind else real(device_type)

    monkeypatch.setattr(tf.config, "list_logical_devices", logical_devices)
    return [d.name for d in fake]


def _record_mirrored(monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(
        tf.distribute, "MirroredStrategy", lambda devices: ("mirrored", devices)
    )


@on_tf
def test_pick_strategy_mirrors_over_every_visible_gpu(monkeypatch):
    # Kills: `if gpus:` -> `if False:`; `gpus` -> `gpus[:1]`. No test ran
    # the GPU branch on a CPU-only machine.
    from keras_attnvariants import distribute

    _no_tpu(monkeypatch)
    names = _fake_logical_devices(monkeypatch, "GPU", 2)
    _record_mirrored(monkeypatch)
    assert distribute.pick_strategy() == ("mirrored", names)
    # GPUs come first: `cpu_replicas` is for machines without accelerators.
    assert distribute.pick_strategy(cpu_replicas=1) == ("mirrored", names)


@on_tf
def test_pick_strategy_uses_only_the_cpu_replicas_asked_for(monkeypatch):
    # Kills: `[:cpu_replicas]` dropped (3 split CPUs, 2 asked for: a
    # 3-replica strategy), and the `len(cpus) < cpu_replicas` check
    # skipped (a 3-replica strategy silently over the 3 that exist).
    from keras_attnvariants import distribute

    _no_tpu(monkeypatch)
    names = _fake_logical_devices(monkeypatch, "CPU", 3)
    _record_mirrored(monkeypatch)
    assert distribute.pick_strategy(cpu_replicas=2) == ("mirrored", names[:2])
    assert distribute.pick_strategy(cpu_replicas=3) == ("mirrored", names)
    with pytest.raises(
        ValueError,
        match=r"at most the 3 logical CPU device\(s\).*split_cpu.*"
        r"Received: cpu_replicas=4",
    ):
        distribute.pick_strategy(cpu_replicas=4)


@on_tf
def test_pick_strategy_without_accelerators_is_the_default_strategy():
    # Kills: the default strategy replaced by a one-device strategy (the
    # existing test checked `num_replicas_in_sync == 1` only).
    import tensorflow as tf

    from keras_attnvariants import distribute

    strategy = distribute.pick_strategy()
    assert strategy is tf.distribute.get_strategy()
    assert not tf.distribute.has_strategy()


@on_tf
def test_pick_strategy_tpu_lookup_not_found(monkeypatch):
    # Kills: `tf.errors.NotFoundError` dropped from the lookup's except.
    import tensorflow as tf

    from keras_attnvariants import distribute

    def resolver(tpu=None):
        raise tf.errors.NotFoundError(None, None, "no TPU platform")

    monkeypatch.setattr(
        tf.distribute.cluster_resolver, "TPUClusterResolver", resolver
    )
    assert distribute.pick_strategy().num_replicas_in_sync == 1
    with pytest.raises(ValueError, match="no TPU platform.*tpu='my-tpu'"):
        distribute.pick_strategy(tpu="my-tpu")


def test_tf_distribute_helpers_need_the_tensorflow_backend(monkeypatch):
    # Kills: `_tensorflow()`'s backend check removed (a strategy was built
    # under JAX, where Keras ignores it).
    from keras_attnvariants import distribute

    monkeypatch.setattr(keras.config, "backend", lambda: "jax")
    for call in (distribute.pick_strategy, lambda: distribute.split_cpu(2)):
        with pytest.raises(ValueError, match="KERAS_BACKEND='jax'"):
            call()


def test_data_parallel_needs_the_jax_backend(monkeypatch):
    # Kills: `data_parallel()`'s backend check removed.
    from keras_attnvariants import distribute

    for backend in ("tensorflow", "torch"):
        monkeypatch.setattr(keras.config, "backend", lambda: backend)
        with pytest.raises(ValueError, match=f"KERAS_BACKEND='{backend}'"):
            distribute.data_parallel()


def test_model_scope_on_jax_opens_data_parallel_over_several_devices(
    monkeypatch,
):
    # Kills: `yield distribution` -> `yield None` (only the slow JAX
    # subprocess test covered it).
    from keras_attnvariants import distribute

    entered = []

    class Distribution:
        @contextlib.contextmanager
        def scope(self):
            entered.append(True)
            yield

    distribution = Distribution()
    monkeypatch.setattr(keras.config, "backend", lambda: "jax")
    monkeypatch.setattr(
        keras.distribution, "list_devices", lambda: ["cpu:0", "cpu:1"]
    )
    monkeypatch.setattr(distribute, "data_parallel", lambda: distribution)
    with distribute.model_scope() as picked:
        assert picked is distribution
        assert entered == [True]


# `_argparse_types` (the demo CLI, examples/ and benchmarks/).


def _in_thread(call, timeout=60):
    """`call()`'s result, failing if it does not return in time."""
    result = []
    worker = threading.Thread(target=lambda: result.append(call()))
    worker.daemon = True
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"did not return within {timeout} s"
    assert result, "raised (see the thread's traceback above)"
    return result[0]


def test_folder_accepts_a_new_relative_folder(tmp_path, monkeypatch):
    # Kills: `os.path.abspath(path)` dropped in `folder_problem` (a new
    # relative folder looped forever: `os.path.dirname("new") == ""`; the
    # existing tests only hung on it), and `folder` returning another
    # spelling of the path than the one given.
    from keras_attnvariants._argparse_types import folder

    monkeypatch.chdir(tmp_path)
    nested = os.path.join("new", "sub")
    assert _in_thread(lambda: folder(nested)) == nested


def test_folder_flags_reject_a_folder_that_is_not_writable(
    tmp_path, monkeypatch, capsys
):
    # Kills: the `os.access` check removed, or `W_OK` dropped from it. As
    # root every folder is writable, so `os.access` is faked: write
    # permission is refused, search permission granted.
    from keras_attnvariants.__main__ import parse

    monkeypatch.setattr(os, "access", lambda path, mode: not mode & os.W_OK)
    with pytest.raises(SystemExit) as exit_info:
        parse(["demo", "--output", str(tmp_path / "new")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "--output: must name a folder" in lines[0]
    assert f"{str(tmp_path)!r} is not writable" in lines[0]


def test_output_file_takes_a_bare_name_and_rejects_a_file_as_folder(
    tmp_path, monkeypatch
):
    # Kills: `os.path.dirname(text) or "."` -> `os.path.dirname(text)` (a
    # bare file name, as the examples' defaults are, was rejected), and
    # `isdir(folder)` -> `exists(folder)` (a file in the folder's place
    # passed, to fail when the figure is written).
    from keras_attnvariants._argparse_types import output_file

    monkeypatch.chdir(tmp_path)
    assert output_file("report.md") == "report.md"
    (tmp_path / "a_file").write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="'a_file'"):
        output_file(os.path.join("a_file", "report.md"))


def test_output_file_rejects_empty_text():
    # `os.path.dirname("") or "."` passed it: the script failed with
    # FileNotFoundError after its work.
    from keras_attnvariants._argparse_types import output_file

    for text in ("", "  "):
        with pytest.raises(
            argparse.ArgumentTypeError, match="must name a file, got ''"
        ):
            output_file(text)


def test_folder_rejects_a_dangling_link(tmp_path):
    # `os.path.exists` is False for it, so the check climbed to its
    # folder and passed; `os.makedirs` then raised FileExistsError.
    from keras_attnvariants._argparse_types import folder

    link = tmp_path / "link"
    os.symlink(tmp_path / "missing", link)
    for path in (link, link / "sub"):
        with pytest.raises(
            argparse.ArgumentTypeError,
            match=f"{str(link)!r} is a link to a missing target",
        ):
            folder(str(path))
