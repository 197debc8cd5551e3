"""Picking a `tf.distribute` strategy for the machine at hand.

`pick_strategy()` returns `TPUStrategy` when a TPU is reachable,
`MirroredStrategy` over the visible GPUs when there are several (or one),
and otherwise the default strategy. For several machines, build a
`tf.distribute.MultiWorkerMirroredStrategy()` yourself (it reads
`TF_CONFIG`) and open its `scope()` around model creation exactly as with
the strategies returned here; the layers and losses of this package need
nothing else.

On the JAX backend use `keras.distribution.DataParallel` instead (see
`data_parallel()`); on PyTorch use its own data-parallel tools.
`model_scope()` picks for the backend at hand: the examples build, compile
and fit their models inside it.
"""

import contextlib

import keras

from keras_attnvariants.validation import check_int

# Device types that TensorFlow lists on a host with a TPU attached.
LOCAL_TPU_DEVICES = ("TPU", "TPU_SYSTEM")


def _tensorflow():
    if keras.config.backend() != "tensorflow":
        raise ValueError(
            "tf.distribute strategies need the TensorFlow backend. "
            f"Received: KERAS_BACKEND={keras.config.backend()!r}"
        )
    import tensorflow as tf

    return tf


def split_cpu(num_devices):
    """Splits the host CPU into `num_devices` logical devices.

    Must run before TensorFlow initializes its devices (before any op,
    model or `pick_strategy()`); used to test multi-replica training on a
    CPU-only machine. Calling it again with the same number is a no-op,
    and so is asking for the number TensorFlow already set up (1 by
    default) after its devices started.

    Raises:
        ValueError: if `num_devices` is not an int >= 1.
        RuntimeError: if TensorFlow's devices are already initialized,
            unless they were split into this same number.
    """
    tf = _tensorflow()
    num_devices = check_int("num_devices", num_devices)
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu,
            [tf.config.LogicalDeviceConfiguration()] * num_devices,
        )
    except RuntimeError as error:
        # Already initialized as asked (e.g. 1 device, the default, in a
        # notebook that ran a TensorFlow op): nothing to change.
        current = tf.config.list_logical_devices("CPU")
        if len(current) == num_devices:
            return current
        # TensorFlow's message names neither this function nor the fix.
        raise RuntimeError(
            "split_cpu() must run before TensorFlow initializes its devices "
            "(before any op, model or pick_strategy()); they are already "
            f"set up as {len(tf.config.list_logical_devices('CPU'))} "
            f"logical CPU device(s). Received: num_devices={num_devices}"
        ) from error
    return tf.config.list_logical_devices("CPU")


# `pick_strategy`'s TPU strategies by `tpu` argument: each TPU system is
# initialized once per process.
_TPU_STRATEGIES = {}


def pick_strategy(tpu=None, cpu_replicas=None):
    """The best `tf.distribute.Strategy` for this machine.

    Args:
        tpu: optional TPU name or address (a string) for
            `TPUClusterResolver`, or `"local"` for a TPU attached to this
            host. `None` tries the TPU configured by the environment
            (`TPU_NAME`, ...), then a TPU attached to this host (a TPU VM,
            where no name is set), and falls back to the devices below
            when there is none. A TPU that is named but not found, or
            found but not initialized, raises `ValueError`. A TPU is
            initialized once per process (initializing again would wipe
            the variables of the models built on it): later calls with
            the same `tpu` return the same `TPUStrategy`.
        cpu_replicas: optional int. Without accelerators, use a
            `MirroredStrategy` over this many logical CPU devices (they must
            have been created with `split_cpu`), an int >= 1; `None` means
            the default strategy. Compile with `jit_compile=False` there:
            XLA cannot run a MirroredStrategy over logical CPU devices
            (the compiled step of replica 1 runs on CPU:0 and fails with
            "Trying to access resource ... located in device CPU:1"; a
            plain `keras.layers.Dense` model fails the same way, a known
            XLA issue). Keras's default `jit_compile="auto"` already turns
            XLA off under `tf.distribute`.

    Returns:
        A `tf.distribute.Strategy`.
    """
    tf = _tensorflow()
    if tpu is not None and not isinstance(tpu, str):
        # TensorFlow's resolver failed with an AttributeError on these.
        raise ValueError(
            "`tpu` must be a TPU name or address (a string) or None. "
            f"Received: tpu={tpu!r}"
        )
    if cpu_replicas is not None:
        cpu_replicas = check_int("cpu_replicas", cpu_replicas)
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    # OSError: off Google Cloud a TPU name is looked up on the metadata
    # server, which fails with `urllib.error.URLError`.
    except (
        ValueError,
        RuntimeError,
        OSError,
        tf.errors.NotFoundError,
    ) as error:
        if tpu is not None:
            # Asked for by name: training on the CPU instead would hide it.
            raise ValueError(
                f"`tpu` names a TPU that could not be found: {error}. "
                f"Received: tpu={tpu!r}"
            ) from error
        resolver = None
        if any(map(tf.config.list_physical_devices, LOCAL_TPU_DEVICES)):
            # A TPU VM sets no TPU name (the lookup above fails with
            # "Please provide a TPU Name"); its TPU is attached to this
            # host and reached as "local".
            try:
                resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                    tpu="local"
                )
            except (ValueError, RuntimeError, tf.errors.OpError) as local:
                raise ValueError(
                    "A TPU is attached to this host but could not be "
                    f"resolved as 'local': {local}. Received: tpu={tpu!r}"
                ) from local
    if resolver is not None:
        # Initializing a TPU system wipes its memory, and with it the
        # variables of every model built on it before: the examples enter
        # `model_scope()` once per model, so a TPU is set up once per
        # process and its strategy reused.
        cached = _TPU_STRATEGIES.get(tpu)
        if cached is not None:
            return cached
        # A TPU was found (named, or configured by the environment): one
        # that then fails to connect or initialize raises too, instead of
        # training on the CPU of a half-connected runtime.
        try:
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            # "A TPU was found" read wrong for a name asked for (`"local"`
            # on a host without one): the resolver exists either way.
            raise ValueError(
                f"The TPU {tpu or 'configured by the environment'!r} could "
                f"not be connected or initialized: {error}. Received: "
                f"tpu={tpu!r}"
            ) from error
        strategy = tf.distribute.TPUStrategy(resolver)
        _TPU_STRATEGIES[tpu] = strategy
        return strategy
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    if cpu_replicas:
        cpus = tf.config.list_logical_devices("CPU")[:cpu_replicas]
        if len(cpus) < cpu_replicas:
            raise ValueError(
                f"`cpu_replicas` must be at most the {len(cpus)} logical CPU "
                "device(s) that exist; call `split_cpu(cpu_replicas)` "
                "before TensorFlow initializes its devices to make more. "
                f"Received: cpu_replicas={cpu_replicas}"
            )
        return tf.distribute.MirroredStrategy([d.name for d in cpus])
    return tf.distribute.get_strategy()


def data_parallel():
    """`keras.distribution.DataParallel` over all devices (JAX backend)."""
    if keras.config.backend() != "jax":
        raise ValueError(
            "keras.distribution needs the JAX backend. "
            f"Received: KERAS_BACKEND={keras.config.backend()!r}"
        )
    return keras.distribution.DataParallel(
        devices=keras.distribution.list_devices()
    )


@contextlib.contextmanager
def model_scope(tpu=None, cpu_replicas=None):
    """Where to build, compile and fit a model, for any backend.

    - TensorFlow: the scope of `pick_strategy(tpu, cpu_replicas)` (a TPU,
      the GPUs, or the default strategy); yields the strategy.
    - JAX: with several devices, the `data_parallel()` distribution (the
      global batch is split over the devices, so every batch must divide
      by their number, the last one of `fit`, `evaluate` and `predict`
      included: a dataset whose size does not fails with a sharding
      error); with one, nothing. Yields the distribution or `None`.
    - PyTorch: nothing (use its own data-parallel tools); yields `None`.

    Example:

    >>> from keras_attnvariants import distribute
    >>> with distribute.model_scope():
    ...     model = keras.Sequential([keras.layers.Dense(1)])
    ...     model.compile("sgd", "mse")
    """
    backend = keras.config.backend()
    if backend != "tensorflow" and (tpu, cpu_replicas) != (None, None):
        raise ValueError(
            "`tpu` and `cpu_replicas` pick a tf.distribute strategy and need "
            f"the TensorFlow backend. Received: tpu={tpu!r}, "
            f"cpu_replicas={cpu_replicas!r} with "
            f"KERAS_BACKEND={backend!r}"
        )
    if backend == "tensorflow":
        strategy = pick_strategy(tpu=tpu, cpu_replicas=cpu_replicas)
        with strategy.scope():
            yield strategy
    elif backend == "jax" and len(keras.distribution.list_devices()) > 1:
        distribution = data_parallel()
        with distribution.scope():
            yield distribution
    else:
        yield None
