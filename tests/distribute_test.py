"""Scale-out: tf.distribute, JAX data parallel, XLA with mixed_bfloat16."""

import contextlib
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attnvariants.testing import layer_zoo
from keras_attnvariants.testing.subprocesses import run_json_script


@pytest.fixture(autouse=True)
def _no_cached_tpu(monkeypatch):
    """Each test starts without a TPU strategy cached by an earlier one."""
    from keras_attnvariants import distribute

    monkeypatch.setattr(distribute, "_TPU_STRATEGIES", {})


on_tf = pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="tf.distribute needs the TensorFlow backend",
)


def run_module(module, env_updates, args=()):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env_updates}
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [
        json.loads(line) for line in out.stdout.splitlines() if line[:1] == "{"
    ]


@on_tf
def test_mirrored_loss_history_equals_single_device():
    """Zoo models trained under MirroredStrategy over 2 logical CPUs log
    finite metrics, and the deterministic ones the loss history and term
    metrics one device logs.

    17 examples in batches of 8, one epoch: two even splits, whose
    updates the next batches' losses depend on, then a batch of one
    example, so one of the 2 replicas gets none. Its terms gave 0 / 0
    (guidance's per-example sum, the receptive-field penalty: NaN logged
    for the epoch), and every term's metric took one unweighted value per
    replica (a KQ term logged 17% off the one-device value). A separate
    run of 32 examples over 3 epochs took 60-110 s more of CI; it went
    (2026-11-27).

    One epoch: Keras 3 itself averages each replica's loss over its own
    examples, so the update of a batch split unevenly over the replicas
    is not one device's update, for any model (a plain `Dense` with
    "mse": second-epoch loss 2.06 mirrored against 2.30 on one device).
    The README says so."""
    results = run_module(
        "keras_attnvariants.testing.replica_parity",
        {"KERAS_BACKEND": "tensorflow"},
        ["--examples", "17", "--epochs", "1"],
    )
    assert {r["name"] for r in results} == set(layer_zoo.LAYERS)
    for result in results:
        assert result["replicas"] == 2
        assert len(result["mirrored"]) == 1
        for key, value in result["metrics"].items():
            assert np.isfinite(value), (result["name"], key)
        if result["name"] not in layer_zoo.DETERMINISTIC:
            continue
        np.testing.assert_allclose(
            result["mirrored"], result["single"], rtol=1e-4
        )
        # Each attached term's own metric too (KQ, guidance, ...): not
        # a per-replica part or a sum over the replicas.
        single = result["single_metrics"]
        assert set(result["metrics"]) == set(single)
        for key in single:
            np.testing.assert_allclose(
                result["metrics"][key],
                single[key],
                rtol=1e-4,
                err_msg=f"{result['name']}: {key}",
            )
    with_loss = [r for r in results if r["name"] == "dnas_with_attention_loss"]
    # The attached term is logged as its own metric, with a real value.
    assert with_loss[0]["metrics"]["weight_square"] > 0.0


@on_tf
def test_pick_strategy_on_this_machine_is_default():
    from keras_attnvariants import distribute

    strategy = distribute.pick_strategy()
    assert strategy.num_replicas_in_sync == 1


@on_tf
def test_pick_strategy_with_one_cpu_replica_is_mirrored():
    # Documented: an int >= 1 gives a MirroredStrategy over that many
    # logical CPUs (replica context, `jit_compile="auto"` as under several);
    # only None gives the default strategy. No test ran 1 unpatched.
    import tensorflow as tf

    from keras_attnvariants import distribute

    strategy = distribute.pick_strategy(cpu_replicas=1)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 1


@on_tf
def test_pick_strategy_named_tpu_that_fails_raises():
    from keras_attnvariants import distribute

    # A TPU asked for by name used to fall back to the CPU silently.
    with pytest.raises(ValueError, match="tpu='local'"):
        distribute.pick_strategy(tpu="local")


@on_tf
@pytest.mark.parametrize("tpu", ["my-tpu", None])
def test_pick_strategy_tpu_lookup_failing_with_url_error(monkeypatch, tpu):
    import urllib.error

    import tensorflow as tf

    from keras_attnvariants import distribute

    # Off Google Cloud a named TPU is looked up on the metadata server:
    # `URLError` came through instead of the documented ValueError.
    def unreachable(tpu=None):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(
        tf.distribute.cluster_resolver, "TPUClusterResolver", unreachable
    )
    if tpu is None:  # nothing asked for by name: the default strategy
        assert distribute.pick_strategy().num_replicas_in_sync == 1
    else:
        with pytest.raises(ValueError, match="tpu='my-tpu'"):
            distribute.pick_strategy(tpu=tpu)


@on_tf
def test_pick_strategy_found_tpu_that_fails_to_initialize_raises(monkeypatch):
    import tensorflow as tf

    from keras_attnvariants import distribute

    # tpu=None: a TPU configured by the environment is found, but connecting
    # fails. This used to fall back to the CPU silently.
    monkeypatch.setattr(
        tf.distribute.cluster_resolver,
        "TPUClusterResolver",
        lambda tpu=None: object(),
    )

    def refuse(resolver):
        raise RuntimeError("TPU system initialization failed")

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", refuse)
    with pytest.raises(
        ValueError,
        match=r"^The TPU 'configured by the environment' could not be "
        r"connected or initialized: TPU system initialization failed\. "
        r"Received: tpu=None$",
    ):
        distribute.pick_strategy()


@on_tf
def test_model_scope_opens_the_picked_strategy(monkeypatch):
    import tensorflow as tf

    from keras_attnvariants import distribute

    picked = tf.distribute.OneDeviceStrategy("/cpu:0")
    asked = []

    def pick_strategy(**kwargs):
        asked.append(kwargs)
        return picked

    monkeypatch.setattr(distribute, "pick_strategy", pick_strategy)
    with distribute.model_scope(cpu_replicas=1) as strategy:
        assert strategy is picked
        assert tf.distribute.get_strategy() is picked
        variable = keras.Variable(1.0)
    assert tf.distribute.get_strategy() is not picked
    assert asked == [{"tpu": None, "cpu_replicas": 1}]
    assert "CPU:0" in variable.value.device


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_model_scope_elsewhere_takes_no_strategy_arguments(
    monkeypatch, backend
):
    from keras_attnvariants import distribute

    monkeypatch.setattr(keras.config, "backend", lambda: backend)
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: ["cpu:0"])
    with distribute.model_scope() as picked:
        assert picked is None  # one device: nothing to distribute
    for kwargs in ({"tpu": "local"}, {"cpu_replicas": 2}):
        with pytest.raises(ValueError, match="TensorFlow backend"):
            with distribute.model_scope(**kwargs):
                pass


@on_tf
@pytest.mark.parametrize("value", [-1, 0, 1.5, True, "2"])
def test_pick_strategy_rejects_bad_cpu_replicas(value):
    from keras_attnvariants import distribute

    # -1 used to give a MirroredStrategy over all CPUs but the last.
    with pytest.raises(ValueError, match="cpu_replicas"):
        distribute.pick_strategy(cpu_replicas=value)


@on_tf
@pytest.mark.parametrize("value", [0, 2.0, True])
def test_split_cpu_rejects_bad_num_devices(value):
    from keras_attnvariants import distribute

    with pytest.raises(ValueError, match="num_devices"):
        distribute.split_cpu(value)


def test_jax_data_parallel_over_two_host_devices():
    pytest.importorskip("jax")
    results = run_module(
        "keras_attnvariants.testing.jax_data_parallel",
        {
            "KERAS_BACKEND": "jax",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        },
    )
    assert {r["name"] for r in results} == set(layer_zoo.LAYERS)
    for result in results:
        # `model_scope()` picked data parallelism over both devices.
        assert result["distribution"] == "DataParallel"
        assert result["devices"] == 2
        # The variables live on both devices: the distribution was in
        # effect (the device count above held without it).
        assert result["variable_devices"] == [1, 2]
        assert np.all(np.isfinite(result["loss"]))
        assert result["loss"][-1] < result["loss"][0]
        # One global program: the same history as on one device, Gumbel
        # included, whose noise is indexed by the global batch position
        # (replicas drawing the same noise would differ from it).
        np.testing.assert_allclose(
            result["loss"], result["single"], rtol=1e-4, err_msg=result["name"]
        )


@pytest.mark.parametrize("name", sorted(layer_zoo.LAYERS))
def test_xla_training_under_mixed_bfloat16(name):
    model = layer_zoo.build_model(name, dtype="mixed_bfloat16")
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=True)
    # Keras turns XLA off, with a warning only, when a layer does not
    # support it.
    assert model.jit_compile is True
    history = model.fit(*layer_zoo.training_data(), batch_size=8, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    # The zoo layer itself (index 2 was the pooling for an encoder, which
    # takes the token ids at index 1).
    layer = model.layers[1 if name in layer_zoo.ENCODERS else 2]
    assert type(layer) is type(layer_zoo.LAYERS[name]())
    assert layer.compute_dtype == "bfloat16"


SPLIT_AFTER_START = """
import json
import tensorflow as tf
from keras_attnvariants import distribute
first = len(distribute.split_cpu(2))
tf.constant(1.0)  # TensorFlow initializes its devices here.
again = len(distribute.split_cpu(2))
try:
    distribute.split_cpu(3)
    error = None
except RuntimeError as e:
    error = str(e)
print(json.dumps([first, again, error]))
"""


@on_tf
def test_split_cpu_after_tensorflow_started_names_the_fix():
    first, again, error = run_json_script(SPLIT_AFTER_START, timeout=300)
    assert first == again == 2
    # TensorFlow's own message ("Virtual devices cannot be modified after
    # being initialized") named neither split_cpu nor when to call it.
    assert error.startswith("split_cpu() must run before TensorFlow")
    assert "2 logical CPU device(s)" in error and "num_devices=3" in error


ONE_DEVICE_AFTER_START = """
import json
import tensorflow as tf
from keras_attnvariants import distribute
tf.constant(1.0)  # as in a notebook that ran an op first
one = len(distribute.split_cpu(1))
try:
    distribute.split_cpu(2)
    error = None
except RuntimeError as e:
    error = str(e)
print(json.dumps([one, error]))
"""


@on_tf
def test_split_cpu_asking_for_the_default_after_start_is_a_no_op():
    # `demo.run(cpu_replicas=1)` raised in such a process: "they are
    # already set up as 1 logical CPU device(s). Received: num_devices=1".
    one, error = run_json_script(ONE_DEVICE_AFTER_START, timeout=300)
    assert one == 1
    assert "1 logical CPU device(s)" in error and "num_devices=2" in error


GUMBEL_REPLICAS = """
import json
from keras_attnvariants import distribute
distribute.split_cpu(2)
import keras
import numpy as np
import tensorflow as tf
import keras_attnvariants as kav
from keras_attnvariants.testing import layer_zoo
from keras_attnvariants.testing.subprocesses import run_json_script

mirrored = distribute.pick_strategy(cpu_replicas=2)
single = distribute.pick_strategy()
x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")


def replica_outputs():
    keras.utils.set_random_seed(5)
    with mirrored.scope():
        layer = kav.GumbelDiscreteAttention(2, 4, seed=3)
        layer(x, x)
    step = tf.function(
        lambda: mirrored.run(lambda: layer(x, x, training=True))
    )
    return [np.asarray(o) for o in mirrored.experimental_local_results(step())]


def history(name, strategy):
    with strategy.scope():
        model = layer_zoo.build_model(name)
        model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    data = layer_zoo.training_data()
    return model.fit(
        *data, batch_size=8, epochs=2, shuffle=False, verbose=0,
        validation_data=data,
    ).history


def guidance_made_outside(strategy):
    # The term is made before the scope is entered (its step counter is
    # created when the attention layer builds, inside it).
    keras.utils.set_random_seed(0)
    term = kav.AttentionGuidanceRegularizer(
        {0: "next"}, alpha=1.0, decay_steps=4, name="g"
    )
    with strategy.scope():
        inputs = keras.Input((5, 8))
        hidden = kav.HybridAttention(
            2, 4, hybrid_init=0.0, attention_losses=[term]
        )(inputs, inputs)
        outputs = keras.layers.Dense(1)(
            keras.layers.GlobalAveragePooling1D()(hidden)
        )
        model = keras.Model(inputs, outputs)
        model.compile(keras.optimizers.SGD(0.1), "mse")
    rng = np.random.default_rng(1)
    data = (
        rng.random((8, 5, 8)).astype("float32"),
        rng.random((8, 1)).astype("float32"),
    )
    history = model.fit(
        *data, batch_size=8, epochs=3, shuffle=False, verbose=0
    ).history
    return {"history": history, "step": float(term.step.numpy())}


first, second = replica_outputs(), replica_outputs()
print(json.dumps({
    "outside_single": guidance_made_outside(single),
    "outside_mirrored": guidance_made_outside(mirrored),
    "replicas_differ": float(np.abs(first[0] - first[1]).max()),
    "rerun_differs": max(
        float(np.abs(a - b).max()) for a, b in zip(first, second)
    ),
    "gumbel_fit": [history("gumbel_discrete_attention", mirrored)
                   for _ in range(2)],
    "guidance_single": history("dnas_with_guidance", single),
    "guidance_mirrored": history("dnas_with_guidance", mirrored),
}))
"""


@on_tf
def test_mirrored_gumbel_noise_per_replica_and_metrics_per_term():
    result = run_json_script(GUMBEL_REPLICAS, timeout=900)
    # Same input on both replicas: each draws its own noise...
    assert result["replicas_differ"] > 1e-3
    # ...and the same seeds give the same noise again, and the same fit.
    assert result["rerun_differs"] == 0.0
    first, second = result["gumbel_fit"]
    assert first == second
    # Terms added by layers, their own metrics and compiled metrics log the
    # single-device values under MirroredStrategy (not a per-replica part
    # or a sum over replicas).
    single, mirrored = result["guidance_single"], result["guidance_mirrored"]
    assert set(single) == set(mirrored)
    assert {"loss", "guidance", "mae", "val_guidance"} <= set(single)
    assert single["guidance"][0] > 0.0
    for key in single:
        np.testing.assert_allclose(
            mirrored[key], single[key], rtol=1e-4, err_msg=key
        )
    # A guidance term made outside the scope: its step counter was made in
    # its constructor, a plain variable both replicas advanced (6 after 3
    # steps), so alpha_t decayed twice as fast with no error.
    single, mirrored = result["outside_single"], result["outside_mirrored"]
    assert single["step"] == mirrored["step"] == 3.0
    for key in single["history"]:
        np.testing.assert_allclose(
            mirrored["history"][key],
            single["history"][key],
            rtol=1e-4,
            err_msg=key,
        )


@on_tf
def test_pick_strategy_initializes_a_tpu_once(monkeypatch):
    import tensorflow as tf

    from keras_attnvariants import distribute

    # `model_scope()` calls `pick_strategy()` on every entry (the examples
    # enter it once per model): initializing the TPU system again wiped
    # the variables of the models built before.
    initialized = []
    monkeypatch.setattr(distribute, "_TPU_STRATEGIES", {})
    monkeypatch.setattr(
        tf.distribute.cluster_resolver,
        "TPUClusterResolver",
        lambda tpu=None: ("resolver", tpu),
    )
    monkeypatch.setattr(
        tf.config, "experimental_connect_to_cluster", lambda resolver: None
    )
    monkeypatch.setattr(
        tf.tpu.experimental, "initialize_tpu_system", initialized.append
    )
    monkeypatch.setattr(
        tf.distribute, "TPUStrategy", lambda resolver: ["strategy", resolver]
    )
    first = distribute.pick_strategy(tpu="my-tpu")
    again = distribute.pick_strategy(tpu="my-tpu")
    assert first is again
    assert initialized == [("resolver", "my-tpu")]
    other = distribute.pick_strategy(tpu="other-tpu")
    assert other is not first
    assert len(initialized) == 2


@on_tf
def test_pick_strategy_local_tpu_that_cannot_be_resolved_raises(monkeypatch):
    import tensorflow as tf

    from keras_attnvariants import distribute

    # A TPU device on this host whose "local" resolver fails: TensorFlow's
    # own error came through instead of the documented ValueError.
    def resolver(tpu=None):
        if tpu is None:
            raise ValueError("Please provide a TPU Name to connect to.")
        raise RuntimeError("libtpu not found")

    def physical_devices(kind=None):
        if kind != "TPU":
            return []
        return [tf.config.PhysicalDevice("/physical_device:TPU:0", "TPU")]

    monkeypatch.setattr(
        tf.distribute.cluster_resolver, "TPUClusterResolver", resolver
    )
    monkeypatch.setattr(tf.config, "list_physical_devices", physical_devices)
    with pytest.raises(ValueError, match="could not be resolved as 'local'"):
        distribute.pick_strategy()


# Pinned after a mutation review (2026-12-02): `pick_strategy`'s GPU and
# split-CPU branches (devices faked), the default strategy, a TPU lookup
# that finds no platform, the backend checks and the JAX `model_scope`.


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
