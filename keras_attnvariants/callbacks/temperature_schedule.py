"""`TemperatureSchedule`: anneals every `GumbelDiscreteAttention`."""

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

    then clipped from below at `floor`. The temperature is a non-trainable
    variable of each layer, so the change takes effect inside a compiled
    `fit` without retracing.

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
    ):
        super().__init__()
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
        self.schedule = schedule
        self.initial = float(initial)
        self.final = float(final)
        self.steps = steps
        self.rate = float(rate)
        self.floor = float(floor)
        self.unit = unit
        self.history = []
        # Batches run so far, over epochs and `fit` calls.
        self._batches_done = 0
        self._epoch_start = 0

    def value(self, step):
        """The temperature at `step` (an int >= 0)."""
        if self.schedule == "constant":
            value = self.initial
        elif self.schedule == "linear":
            fraction = min(step / self.steps, 1.0)
            value = self.initial + (self.final - self.initial) * fraction
        else:
            value = self.initial * math.pow(self.rate, step)
        return max(value, self.floor)

    def _apply(self, step):
        value = self.value(step)
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
        self._epoch_start = self._batches_done
        if self.unit == "epoch":
            self._apply(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        # `batch`: index in the epoch of the first batch of this execution
        # (`steps_per_execution` batches per call).
        if self.unit == "batch":
            self._apply(self._epoch_start + batch)

    def on_train_batch_end(self, batch, logs=None):
        # `batch`: index in the epoch of the last batch this execution ran.
        self._batches_done = self._epoch_start + batch + 1

    def get_config(self):
        return {
            "schedule": self.schedule,
            "initial": self.initial,
            "final": self.final,
            "steps": self.steps,
            "rate": self.rate,
            "floor": self.floor,
            "unit": self.unit,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
