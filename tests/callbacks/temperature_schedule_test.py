import keras
import numpy as np
import pytest
from keras import ops

from keras_attnvariants.callbacks.temperature_schedule import (
    TemperatureSchedule,
)
from keras_attnvariants.callbacks.temperature_schedule import gumbel_layers
from keras_attnvariants.layers.gumbel_discrete_attention import (
    GumbelDiscreteAttention,
)
from keras_attnvariants.testing.test_case import TestCase


class Wrapper(keras.layers.Layer):
    """A custom layer holding a nested attention layer in a list."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.blocks = [GumbelDiscreteAttention(num_heads=1, key_dim=2)]

    def call(self, x):
        return self.blocks[0](x, x)


def small_model(steps_per_execution=1):
    inputs = keras.Input((4, 3))
    top = GumbelDiscreteAttention(num_heads=1, key_dim=2, seed=0)
    x = top(inputs, inputs)
    x = Wrapper()(x)
    model = keras.Model(inputs, x)
    model.compile(
        optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution
    )
    return model


runs_several_steps_per_execution = pytest.mark.skipif(
    keras.backend.backend() == "torch",
    reason="the torch trainer has steps_per_execution=1 only",
)


class TemperatureScheduleTest(TestCase):
    def test_schedule_values(self):
        const = TemperatureSchedule("constant", initial=0.7)
        self.assertEqual([const.value(t) for t in (0, 5)], [0.7, 0.7])
        lin = TemperatureSchedule(
            "linear", initial=1.0, final=0.2, steps=4, floor=0.3
        )
        self.assertAllClose(
            [lin.value(t) for t in range(6)], [1.0, 0.8, 0.6, 0.4, 0.3, 0.3]
        )
        exp = TemperatureSchedule(
            "exponential", initial=2.0, rate=0.5, floor=0.3
        )
        self.assertAllClose(
            [exp.value(t) for t in range(5)], [2.0, 1.0, 0.5, 0.3, 0.3]
        )

    def test_finds_nested_layers_once(self):
        model = small_model()
        self.assertEqual(len(gumbel_layers(model)), 2)

    def test_anneals_every_layer_during_fit(self):
        model = small_model()
        x = np.random.default_rng(0).normal(size=(2, 4, 3)).astype("float32")
        schedule = TemperatureSchedule(
            "exponential", initial=1.0, rate=0.5, floor=0.2, unit="batch"
        )
        model.fit(x, x, batch_size=1, epochs=2, verbose=0, callbacks=[schedule])
        self.assertAllClose(schedule.history, [1.0, 0.5, 0.25, 0.2])
        for layer in gumbel_layers(model):
            self.assertAllClose(ops.convert_to_numpy(layer.temperature), 0.2)

    def test_invalid_arguments_raise(self):
        with self.assertRaisesRegex(ValueError, "schedule"):
            TemperatureSchedule("cosine")
        with self.assertRaisesRegex(ValueError, "floor"):
            TemperatureSchedule(floor=0.0)
        with self.assertRaisesRegex(ValueError, "initial"):
            TemperatureSchedule(initial=-1.0)
        with self.assertRaisesRegex(ValueError, "steps"):
            TemperatureSchedule(steps=0)
        with self.assertRaisesRegex(ValueError, "unit"):
            TemperatureSchedule(unit="step")

    @runs_several_steps_per_execution
    def test_batch_unit_counts_batches_with_steps_per_execution(self):
        # One `train_batch_begin` per execution of 2 batches: the schedule
        # must still advance by 2 (steps 0, 2, 4, 6 of 8 batches).
        model = small_model(steps_per_execution=2)
        x = np.random.default_rng(0).normal(size=(4, 4, 3)).astype("float32")
        schedule = TemperatureSchedule(
            "exponential", initial=1.0, rate=0.5, floor=0.01, unit="batch"
        )
        model.fit(x, x, batch_size=1, epochs=2, verbose=0, callbacks=[schedule])
        self.assertAllClose(schedule.history, [1.0, 0.25, 0.0625, 0.015625])

    @runs_several_steps_per_execution
    def test_short_last_execution_counts_its_own_batches(self):
        # 8 batches an epoch at 3 an execution: Keras reports the short
        # last execution as ending at batch 8, and each epoch added one.
        model = small_model(steps_per_execution=3)
        x = np.random.default_rng(0).normal(size=(8, 4, 3)).astype("float32")

        def linear():
            return TemperatureSchedule(
                "linear",
                initial=1.0,
                final=0.2,
                steps=40,
                floor=0.1,
                unit="batch",
            )

        def batches(schedule):
            return [round((1.0 - v) / 0.02) for v in schedule.history]

        schedule = linear()
        model.fit(x, x, batch_size=1, epochs=3, verbose=0, callbacks=[schedule])
        self.assertEqual(batches(schedule), [0, 3, 6, 8, 11, 14, 16, 19, 22])
        # A new callback resuming at epoch 2 starts where this one did.
        resumed = linear()
        model.fit(
            x,
            x,
            batch_size=1,
            epochs=3,
            initial_epoch=2,
            verbose=0,
            callbacks=[resumed],
        )
        self.assertEqual(batches(resumed), batches(schedule)[6:])

    def test_model_without_gumbel_layer_raises(self):
        inputs = keras.Input((3,))
        model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="sgd", loss="mse")
        x = np.zeros((2, 3), "float32")
        schedule = TemperatureSchedule()
        with self.assertRaisesRegex(ValueError, "no Gumbel layer"):
            model.fit(x, x[:, :1], verbose=0, callbacks=[schedule])

    def test_serialization_round_trip(self):
        schedule = TemperatureSchedule(
            "linear", initial=2.0, final=0.5, steps=3, unit="batch"
        )
        restored = keras.saving.deserialize_keras_object(
            keras.saving.serialize_keras_object(schedule)
        )
        self.assertIsInstance(restored, TemperatureSchedule)
        self.assertEqual(restored.get_config(), schedule.get_config())

    def test_numpy_scalars_accepted_and_infinity_rejected(self):
        schedule = TemperatureSchedule(
            "linear", initial=np.float32(0.5), steps=np.int64(3)
        )
        self.assertEqual(schedule.get_config()["steps"], 3)
        self.assertIs(type(schedule.get_config()["steps"]), int)
        for name in ("initial", "final", "rate", "floor"):
            with self.assertRaisesRegex(ValueError, f"{name}=inf"):
                TemperatureSchedule(**{name: float("inf")})
        with pytest.raises(ValueError, match="steps"):
            TemperatureSchedule(steps=2.0)

    def test_heating_schedule_stays_finite_and_respects_ceiling(self):
        # `math.pow(1.5, 2000)` raised OverflowError mid-training.
        heat = TemperatureSchedule("exponential", initial=1.0, rate=1.5)
        self.assertTrue(np.isfinite(np.float32(heat.value(2000))))
        self.assertAllClose(heat.value(3), 3.375)
        capped = TemperatureSchedule(
            "exponential", initial=1.0, rate=1.5, ceiling=2.0
        )
        self.assertEqual(
            [capped.value(t) for t in (0, 1, 2, 50)], [1.0, 1.5, 2.0, 2.0]
        )
        linear = TemperatureSchedule(
            "linear", initial=0.5, final=4.0, steps=2, ceiling=3.0
        )
        self.assertEqual(linear.value(2), 3.0)
        self.assertEqual(capped.get_config()["ceiling"], 2.0)
        with self.assertRaisesRegex(ValueError, "ceiling=0.05"):
            TemperatureSchedule(floor=0.1, ceiling=0.05)
        with self.assertRaisesRegex(ValueError, "ceiling=inf"):
            TemperatureSchedule(ceiling=float("inf"))

    def test_new_callback_resumes_batch_count_at_initial_epoch(self):
        # A fresh callback at `fit(initial_epoch=1)` restarted at batch 0.
        x = np.random.default_rng(0).normal(size=(2, 4, 3)).astype("float32")
        kwargs = dict(initial=1.0, rate=0.5, floor=0.01, unit="batch")
        model = small_model()
        first = TemperatureSchedule("exponential", **kwargs)
        model.fit(x, x, batch_size=1, epochs=1, verbose=0, callbacks=[first])
        resumed = TemperatureSchedule("exponential", **kwargs)
        model.fit(
            x,
            x,
            batch_size=1,
            epochs=2,
            initial_epoch=1,
            verbose=0,
            callbacks=[resumed],
        )
        self.assertAllClose(
            first.history + resumed.history, [1.0, 0.5, 0.25, 0.125]
        )
        # The same callback given to a second `fit` carries on counting.
        model.fit(x, x, batch_size=1, epochs=1, verbose=0, callbacks=[first])
        self.assertAllClose(first.history[2:], [0.25, 0.125])

    def test_leaves_jax_async_callback_dispatch_on(self):
        # Overriding `on_train_batch_end` without `async_safe` turned off
        # Keras's asynchronous dispatch of training steps (JAX, torch).
        model = small_model()
        without = keras.callbacks.CallbackList([], model=model)
        with_schedule = keras.callbacks.CallbackList(
            [TemperatureSchedule()], model=model
        )
        self.assertEqual(with_schedule._async_train, without._async_train)


class ScheduleContractsTest(TestCase):
    # Contracts a mutation sweep found untested.
    def test_default_epoch_unit_anneals_once_per_epoch_in_fit(self):
        model = small_model()
        x = np.random.default_rng(1).normal(size=(2, 4, 3)).astype("float32")
        schedule = TemperatureSchedule(
            "exponential", initial=1.0, rate=0.5, floor=0.1
        )
        model.fit(x, x, batch_size=1, epochs=3, verbose=0, callbacks=[schedule])
        self.assertAllClose(schedule.history, [1.0, 0.5, 0.25])
        for layer in gumbel_layers(model):
            self.assertAllClose(ops.convert_to_numpy(layer.temperature), 0.25)

    def test_linear_schedule_stays_at_final_after_its_steps(self):
        # Above the floor: the floor hid a ramp that went on past `final`.
        cool = TemperatureSchedule(
            "linear", initial=1.0, final=0.5, steps=2, floor=0.1
        )
        self.assertAllClose(
            [cool.value(t) for t in range(6)], [1.0, 0.75, 0.5, 0.5, 0.5, 0.5]
        )
        heat = TemperatureSchedule("linear", initial=0.5, final=1.0, steps=2)
        self.assertAllClose(heat.value(100), 1.0)

    def test_heating_from_an_initial_above_one_stays_finite(self):
        # The cap on the exponent accounts for `initial`.
        heat = TemperatureSchedule("exponential", initial=2.0, rate=10.0)
        self.assertTrue(np.isfinite(np.float32(heat.value(1000))))

    def test_ceiling_equal_to_floor_is_a_constant(self):
        pinned = TemperatureSchedule(
            "exponential", initial=2.0, rate=0.5, floor=0.5, ceiling=0.5
        )
        self.assertEqual([pinned.value(t) for t in (0, 1, 9)], [0.5] * 3)

    def test_batch_count_never_moves_back_when_hooks_finish_late(self):
        # Keras may run `on_train_batch_end` on a worker thread; a late
        # call for an earlier batch must not lower the count.
        schedule = TemperatureSchedule(
            "exponential", initial=1.0, rate=0.5, floor=1e-3, unit="batch"
        )
        schedule.set_params({"steps": None})
        schedule.on_epoch_begin(0)
        schedule.on_train_batch_end(5)
        schedule.on_train_batch_end(2)
        self.assertEqual(schedule._batches_done, 6)
        schedule.on_epoch_begin(1)
        self.assertEqual(schedule._epoch_start, 6)
