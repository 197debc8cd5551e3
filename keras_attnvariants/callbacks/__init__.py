"""Training callbacks: temperature schedules."""

from keras_attnvariants.callbacks.temperature_schedule import (
    TemperatureSchedule as TemperatureSchedule,
)
