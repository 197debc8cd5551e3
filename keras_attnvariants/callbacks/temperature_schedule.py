"""`TemperatureSchedule`: anneals every `GumbelDiscreteAttention`."""

import inspect
import math

import keras

from keras_attnvariants.layers.gumbel_discrete_attention import (
    GumbelDiscreteAttention,
)
from keras_attnvariants.layers.two_stream_block import TwoStreamBlock
from keras_attnvariants.validation import check_float
from keras_attnvariants.validation import check_int

# Layers with a Gumbel temperature variable and `set_temperature`.
GUMBEL_LAYERS = (GumbelDiscreteAttention, TwoStreamBlock)

SCHEDULES = ("constant", "linear", "exponential")
# Natural log of the largest float32: the exponential schedule is computed
# in log space and capped here, so heating (rate > 1) never overflows.
LOG_FLOAT32_MAX = math.log(3.4028234663852886e38)
UNITS = ("epoch", "batch")


def gumbel_layers(model):
    """Every Gumbel layer inside `model` (`GUMBEL_LAYERS`), nested too.

    Walks the layer attributes (and lists / tuples / dicts of layers) with
    public Python only; shared layers are returned once.
    """
    found, seen, stack = [], set(), [model]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
            continue
        if isinstance(item, dict):
            stack.extend(item.values())
            continue
        if not isinstance(item, keras.layers.Layer) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, GUMBEL_LAYERS):
            found.append(item)
        stack.extend(vars(item).values())
        if isinstance(item, keras.Model):
            stack.extend(item.layers)
    return found


@keras.saving.register_keras_serializable(package="keras_attnvariants")
class TemperatureSchedule(keras.callbacks.Callback):
    """Sets the temperature of every Gumbel layer in a model.

    Gumbel layers: `GumbelDiscreteAttention` and `TwoStreamBlock` (also
    inside a `TwoStreamEncoder`).

    At step `t` (epochs or batches, see `unit`) the temperature is

    - `"constant"`: `initial`;
    - `"linear"`: `initial + (final - initial) * min(t / steps, 1)`;
    - `"exponential"`: `initial * rate ** t`;

    then clipped to `[floor, ceiling]`. The temperature is a non-trainable
    variable of each layer, so the change takes effect inside a compiled
    `fit` without retracing.

    With `unit="batch"` the count runs on over epochs and `fit` calls of
    the same callback. A new callback given to `fit(initial_epoch=k)`
    (resuming a run) starts at batch `k * steps_per_epoch` when Keras
    knows the number of steps per epoch, as `unit="epoch"` starts at
    epoch `k`.

    Args:
        schedule: one of `"constant"`, `"linear"`, `"exponential"`.
            Defaults to `"exponential"`.
        initial: finite float > 0. Temperature at step 0. Defaults to
            `1.0`.
        final: finite float > 0. End value of `"linear"`. Defaults to
            `0.5`.
        steps: int >= 1. Length of the `"linear"` ramp. Defaults to `10`.
        rate: finite float > 0. Factor per step of `"exponential"` (below
            1 cools, above 1 heats). Defaults to `0.9`.
        floor: finite float > 0. Lower bound. Defaults to `0.1`.
        ceiling: finite float >= `floor`, or `None`. Upper bound, e.g. for
            a heating schedule. `None`: no bound (the exponential schedule
            still stops at the largest float32). Defaults to `None`.
        unit: `"epoch"` or `"batch"` (every batch counts, also with
            `steps_per_execution > 1`, where the temperature changes once
            per execution). Defaults to `"epoch"`.

    Raises `ValueError` at the start of `fit` when the model holds no
    Gumbel layer.

    Example:

    >>> schedule = TemperatureSchedule("linear", initial=1.0, final=0.2,
    ...                                steps=4, floor=0.3)
    >>> [round(schedule.value(t), 2) for t in range(6)]
    [1.0, 0.8, 0.6, 0.4, 0.3, 0.3]
    """

    def __init__(
        self,
        schedule="exponential",
        initial=1.0,
        final=0.5,
        steps=10,
        rate=0.9,
        floor=0.1,
        unit="epoch",
        ceiling=None,
    ):
        super().__init__()
        # Only `on_train_batch_end` runs asynchronously, and it only counts
        # batches: Keras may keep dispatching training steps meanwhile (the
        # JAX backend does, unless a callback overrides the hook without
        # this flag).
        self.async_safe = True
        if schedule not in SCHEDULES:
            raise ValueError(
                f"`schedule` must be one of {SCHEDULES}. "
                f"Received: schedule={schedule!r}"
            )
        if unit not in UNITS:
            raise ValueError(
                f"`unit` must be one of {UNITS}. Received: unit={unit!r}"
            )
        for name, value in (
            ("initial", initial),
            ("final", final),
            ("rate", rate),
            ("floor", floor),
        ):
            check_float(name, value)
        steps = check_int("steps", steps)
        if ceiling is not None:
            ceiling = check_float("ceiling", ceiling)
            if ceiling < floor:
                raise ValueError(
                    "`ceiling` must be >= `floor` or None. "
                    f"Received: ceiling={ceiling!r} with floor={floor!r}"
                )
        self.schedule = schedule
        self.initial = float(initial)
        self.final = float(final)
        self.steps = steps
        self.rate = float(rate)
        self.floor = float(floor)
        self.unit = unit
        self.ceiling = ceiling
        self.history = []
        # Batches run so far, over epochs and `fit` calls.
        self._batches_done = 0
        self._epoch_start = 0

    def value(self, step):
        """The temperature at `step` (an int >= 0)."""
        step = check_int("step", step, low=0)
        if self.schedule == "constant":
            value = self.initial
        elif self.schedule == "linear":
            fraction = min(step / self.steps, 1.0)
            value = self.initial + (self.final - self.initial) * fraction
        else:
            # `initial` times exp(...) rather than exp(log(initial) + ...):
            # exactly `initial` at step 0.
            log_factor = step * math.log(self.rate)
            cap = LOG_FLOAT32_MAX - math.log(self.initial)
            value = self.initial * math.exp(min(log_factor, cap))
        value = max(value, self.floor)
        if self.ceiling is not None:
            value = min(value, self.ceiling)
        return value

    def _apply(self, step):
        value = self.value(step)
        # `self.model` syncs a JAX `fit`'s state into the variables first
        # (Keras's `Callback.model`), so the trainer reads the new value.
        for layer in gumbel_layers(self.model):
            layer.set_temperature(value)
        self.history.append(value)

    def on_train_begin(self, logs=None):
        if not gumbel_layers(self.model):
            raise ValueError(
                "`TemperatureSchedule` found no Gumbel layer "
                f"({', '.join(c.__name__ for c in GUMBEL_LAYERS)}) in the "
                f"model. Received: model={self.model.name!r}"
            )

    def on_epoch_begin(self, epoch, logs=None):
        # Batches before this epoch: those this callback counted, or, for a
        # new callback resuming at `initial_epoch`, the epochs skipped.
        steps_per_epoch = (self.params or {}).get("steps")
        skipped = epoch * steps_per_epoch if steps_per_epoch else 0
        self._epoch_start = max(self._batches_done, skipped)
        if self.unit == "epoch":
            self._apply(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        # `batch`: index in the epoch of the first batch of this execution
        # (`steps_per_execution` batches per call).
        if self.unit == "batch":
            self._apply(self._epoch_start + batch)

    def on_train_batch_end(self, batch, logs=None):
        # `batch`: index in the epoch of the last batch this execution ran.
        # Keras may run this hook on a worker thread (`async_safe`); `max`
        # keeps the count right whatever order the calls finish in, and
        # `on_epoch_end` waits for them all before the next epoch begins.
        # Keras reports an epoch's short last execution as a full one (8
        # batches at 3 an execution end at "batch 8"): capped at the epoch's
        # length where it is known, or every epoch added a batch to the
        # count, and a run resumed at `initial_epoch` annealed differently.
        ran = batch + 1
        steps_per_epoch = (self.params or {}).get("steps")
        if steps_per_epoch:
            ran = min(ran, steps_per_epoch)
        self._batches_done = max(self._batches_done, self._epoch_start + ran)

    def get_config(self):
        return {
            "schedule": self.schedule,
            "initial": self.initial,
            "final": self.final,
            "steps": self.steps,
            "rate": self.rate,
            "floor": self.floor,
            "unit": self.unit,
            "ceiling": self.ceiling,
        }

    @classmethod
    def from_config(cls, config):
        """Rebuilds the schedule; `ValueError` for a key `__init__` does
        not take (rather than its `TypeError`), listing the accepted ones."""
        parameters = inspect.signature(cls.__init__).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            accepted = [name for name in parameters if name != "self"]
            unknown = sorted(set(config) - set(accepted))
            if unknown:
                raise ValueError(
                    f"`config` must hold only the keys {accepted}. "
                    f"Received: config with unknown keys {unknown}"
                )
        return cls(**config)
