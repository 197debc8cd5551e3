"""Review of `distribute.pick_strategy`: TPU VMs and bad `tpu` values."""

import keras
import pytest

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="tf.distribute needs the TensorFlow backend",
)


@pytest.fixture(autouse=True)
def _no_cached_tpu(monkeypatch):
    """Each test starts without a TPU strategy cached by an earlier one."""
    from keras_attnvariants import distribute

    monkeypatch.setattr(distribute, "_TPU_STRATEGIES", {})


@pytest.mark.parametrize("value", [123, 1.5, True, b"my-tpu"])
def test_pick_strategy_rejects_a_tpu_that_is_not_a_name(value):
    from keras_attnvariants import distribute

    # Not a name: TensorFlow's resolver failed with an AttributeError
    # ('int' object has no attribute 'startswith').
    with pytest.raises(ValueError, match="Received: tpu="):
        distribute.pick_strategy(tpu=value)


@pytest.mark.parametrize("device_type", ["TPU", "TPU_SYSTEM"])
def test_pick_strategy_finds_a_directly_attached_tpu(monkeypatch, device_type):
    import tensorflow as tf

    from keras_attnvariants import distribute

    # On a TPU VM (Cloud TPU VM, Colab "TPU v2") no TPU name is set:
    # `TPUClusterResolver()` raises "Please provide a TPU Name to connect
    # to.", and the TPU, attached to this host, is reached with
    # `tpu="local"`. The default strategy was picked instead, silently.
    asked = []

    def resolver(tpu=None):
        asked.append(tpu)
        if tpu != "local":
            raise ValueError("Please provide a TPU Name to connect to.")
        return "local resolver"

    def physical_devices(kind=None):
        if kind != device_type:
            return []
        return [tf.config.PhysicalDevice(f"/physical_device:{kind}:0", kind)]

    connected = []
    monkeypatch.setattr(
        tf.distribute.cluster_resolver, "TPUClusterResolver", resolver
    )
    monkeypatch.setattr(tf.config, "list_physical_devices", physical_devices)
    monkeypatch.setattr(
        tf.config, "experimental_connect_to_cluster", connected.append
    )
    monkeypatch.setattr(
        tf.tpu.experimental, "initialize_tpu_system", connected.append
    )
    monkeypatch.setattr(
        tf.distribute, "TPUStrategy", lambda r: ("TPUStrategy", r)
    )
    assert distribute.pick_strategy() == ("TPUStrategy", "local resolver")
    assert asked == [None, "local"]
    assert connected == ["local resolver", "local resolver"]


def test_pick_strategy_without_any_tpu_does_not_try_a_local_one(monkeypatch):
    import tensorflow as tf

    from keras_attnvariants import distribute

    asked = []

    def resolver(tpu=None):
        asked.append(tpu)
        raise ValueError("Please provide a TPU Name to connect to.")

    monkeypatch.setattr(
        tf.distribute.cluster_resolver, "TPUClusterResolver", resolver
    )
    assert distribute.pick_strategy().num_replicas_in_sync == 1
    assert asked == [None]


def test_pick_strategy_names_a_tpu_that_fails_to_initialize(monkeypatch):
    import tensorflow as tf

    from keras_attnvariants import distribute

    def fail(resolver):
        raise tf.errors.NotFoundError(None, None, "TPUs not found")

    monkeypatch.setattr(
        tf.distribute.cluster_resolver,
        "TPUClusterResolver",
        lambda tpu=None: "resolver",
    )
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", fail)
    # It said "A TPU was found" for a name asked for on a host without one.
    with pytest.raises(
        ValueError,
        match=r"^The TPU 'local' could not be connected or initialized: "
        r".*TPUs not found.*Received: tpu='local'",
    ):
        distribute.pick_strategy(tpu="local")
