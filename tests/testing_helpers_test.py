"""Self-tests of `keras_attnvariants.testing`: each helper fails on a wrong
input, and each reference matches values computed by hand (not by the
layers it checks, which could share its error)."""

import keras
import numpy as np
from keras import ops

from keras_attnvariants.testing import autodiff_reference
from keras_attnvariants.testing import numpy_reference as ref
from keras_attnvariants.testing.gradients import gradients
from keras_attnvariants.testing.gradients import hessian_vector_products
from keras_attnvariants.testing.subprocesses import run_json_script
from keras_attnvariants.testing.subprocesses import run_script
from keras_attnvariants.testing.test_case import TestCase


class _ConfigMissesUnits(keras.layers.Layer):
    def __init__(self, units=2, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def get_config(self):
        return super().get_config()  # forgets `units`


class _ConfigHasUnits(_ConfigMissesUnits):
    def get_config(self):
        return {**super().get_config(), "units": self.units}


class _LeaksFloat32(keras.layers.Layer):
    def call(self, x):
        return ops.cast(x, "float32")


class _NonFinite(keras.layers.Layer):
    def call(self, x):
        return ops.log(x)  # NaN at the one negative input only


class _Scale(keras.layers.Layer):
    def __init__(self, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def call(self, x):
        return x * self.scale


@keras.saving.register_keras_serializable(package="testing_helpers_test")
class _ScaleDropsConfig(_Scale):
    def get_config(self):
        return super().get_config()  # reloads with scale=1


@keras.saving.register_keras_serializable(package="testing_helpers_test")
class _ScaleKeepsConfig(_Scale):
    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


class TestCaseHelpersTest(TestCase):
    def test_config_check_fails_on_a_missing_init_arg(self):
        self.assert_config_covers_init_args(_ConfigHasUnits())
        with self.assertRaisesRegex(AssertionError, "units"):
            self.assert_config_covers_init_args(_ConfigMissesUnits())

    def test_mixed_precision_check_fails_on_a_leak_and_on_nan(self):
        x = np.ones((2, 3), "float32")
        self.assert_mixed_precision_outputs(
            keras.layers.Dense, {"units": 2}, [x]
        )
        with self.assertRaisesRegex(AssertionError, "leaks"):
            self.assert_mixed_precision_outputs(_LeaksFloat32, {}, [x])
        with self.assertRaisesRegex(AssertionError, "non-finite"):
            x[0, 0] = -1.0
            self.assert_mixed_precision_outputs(_NonFinite, {}, [x])

    def test_training_step_fails_on_a_weight_without_gradient(self):
        rng = np.random.default_rng(0)
        data = [rng.normal(size=(4, 3)).astype("float32") for _ in range(2)]

        def both_train(inputs):
            return keras.layers.Dense(1)(inputs[0]) + keras.layers.Dense(1)(
                inputs[1]
            )

        def one_stopped(inputs):
            return keras.layers.Dense(1)(inputs[0]) + ops.stop_gradient(
                keras.layers.Dense(1)(inputs[1])
            )

        self.run_multi_input_training_step(both_train, data)
        with self.assertRaisesRegex(AssertionError, "did not train"):
            self.run_multi_input_training_step(one_stopped, data)

    def test_save_load_parity_fails_when_a_setting_is_lost(self):
        x = np.full((2, 3), 1.0, "float32")

        def model(layer_cls, scale):
            inputs = keras.Input((3,))
            return keras.Model(inputs, layer_cls(scale)(inputs))

        self.assert_keras_save_load_parity(model(_ScaleKeepsConfig, 1.001), x)
        with self.assertRaises(AssertionError):
            # The reload differs by 1e-3 of 1: well above atol=1e-6.
            self.assert_keras_save_load_parity(
                model(_ScaleDropsConfig, 1.001), x
            )


class NumpyReferenceTest(TestCase):
    def test_softmax_by_hand(self):
        scores = np.log(np.array([[1.0, 3.0], [2.0, 2.0]]))
        mask = np.array([[True, True], [False, False]])
        want = np.array([[0.25, 0.75], [0.0, 0.0]])
        self.assertAllClose(ref.softmax_attention(scores, mask), want)
        self.assertAllClose(
            ref.softmax_attention(scores),
            [[0.25, 0.75], [0.5, 0.5]],
        )

    def test_doubly_normalized_by_hand(self):
        # exp(s) = [[1, 3], [1, 1]]: columns normalized (over queries)
        # [[1/2, 3/4], [1/2, 1/4]], then rows: [[2/5, 3/5], [2/3, 1/3]].
        scores = np.log(np.array([[1.0, 3.0], [1.0, 1.0]]))
        want = np.array([[2 / 5, 3 / 5], [2 / 3, 1 / 3]])
        self.assertAllClose(ref.doubly_normalized_attention(scores), want)
        # A second iteration: the same two steps applied to `want`.
        col = want / want.sum(0, keepdims=True)
        two = col / col.sum(1, keepdims=True)
        self.assertAllClose(
            ref.doubly_normalized_attention(scores, None, 2), two
        )
        # Key 1 without a valid query, query 1 keeps key 0 only.
        mask = np.array([[True, False], [True, True]])
        # exp: [[1, 0], [1, 1]] -> cols [[1/2, 0], [1/2, 1]] -> rows.
        want = np.array([[1.0, 0.0], [1 / 3, 2 / 3]])
        self.assertAllClose(ref.doubly_normalized_attention(scores, mask), want)
        mask = np.array([[False, False], [True, True]])
        # Query 0 has no key: a zero row; query 1: cols [[0,0],[1,1]].
        want = np.array([[0.0, 0.0], [0.5, 0.5]])
        self.assertAllClose(ref.doubly_normalized_attention(scores, mask), want)

    def test_hybrid_mixes_dnas_and_softmax(self):
        scores = np.log(np.array([[1.0, 3.0], [1.0, 1.0]]))
        dnas = np.array([[2 / 5, 3 / 5], [2 / 3, 1 / 3]])
        unas = np.array([[1 / 4, 3 / 4], [1 / 2, 1 / 2]])
        self.assertAllClose(
            ref.hybrid_attention(scores, 0.25), 0.25 * dnas + 0.75 * unas
        )

    def test_multi_head_attention_matches_keras(self):
        rng = np.random.default_rng(0)
        query = rng.normal(size=(2, 3, 4)).astype("float32")
        value = rng.normal(size=(2, 5, 4)).astype("float32")
        mask = rng.random((2, 3, 5)) < 0.7
        mask[..., 0] = True
        layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
        out, weights = layer(
            query, value, attention_mask=mask, return_attention_scores=True
        )
        want_out, want_w = ref.multi_head_attention(
            layer, query, value, ref.softmax_attention, mask
        )
        self.assertAllClose(weights, want_w, atol=1e-5)
        self.assertAllClose(out, want_out, atol=1e-5)

    def test_fmix32_matches_murmur3(self):
        def fmix32(h):
            h ^= h >> 16
            h = (h * 0x85EBCA6B) & 0xFFFFFFFF
            h ^= h >> 13
            h = (h * 0xC2B2AE35) & 0xFFFFFFFF
            return h ^ (h >> 16)

        words = [0, 1, 2, 0xDEADBEEF, 0xFFFFFFFF, 123456789]
        got = ref.fmix32(np.array(words, np.uint32))
        self.assertEqual(got.dtype, np.uint32)
        self.assertEqual([int(g) for g in got], [fmix32(w) for w in words])
        self.assertEqual(fmix32(1), 0x514E28B7)

    def test_positional_uniform_by_python_ints(self):
        def fmix32(h):
            h ^= h >> 16
            h = (h * 0x85EBCA6B) & 0xFFFFFFFF
            h ^= h >> 13
            h = (h * 0xC2B2AE35) & 0xFFFFFFFF
            return h ^ (h >> 16)

        def coord(i, axis):
            return fmix32((i * 0x9E3779B9 + axis + 1) & 0xFFFFFFFF)

        key, shape = 2**33 + 5, (2, 3, 4)
        got = ref.positional_uniform(key, shape)
        self.assertEqual(got.shape, shape)
        k = key % 2**32
        for index in np.ndindex(*shape):
            a, b = fmix32(k ^ 0x243F6A88), fmix32(k ^ 0x85A308D3)
            for axis, i in enumerate(index[:-1]):
                a, b = fmix32(a ^ coord(i, axis)), fmix32(b ^ coord(i, axis))
            last = coord(index[-1], len(shape) - 1)
            h = fmix32(a ^ ((last * (b | 1)) & 0xFFFFFFFF))
            self.assertEqual(got[index], ((h >> 8) + 0.5) / 2**24)
        # Uniform enough: rows and columns differ (24-bit values: a birthday
        # repeat or two among 4096), mean near 1/2, strictly inside (0, 1).
        many = ref.positional_uniform(7, (64, 64))
        self.assertGreater(len(np.unique(many)), many.size - 8)
        self.assertTrue(0 < many.min() and many.max() < 1)
        self.assertAllClose(many.mean(), 0.5, atol=0.02)


class AutodiffReferenceTest(TestCase):
    def test_edge_mask_has_its_edges(self):
        mask = autodiff_reference.edge_mask(np.random.default_rng(0))
        self.assertEqual(mask.shape, (2, 1, 5, 7))
        self.assertTrue((~mask.any(-1)).any())  # a query with no key
        self.assertTrue((~mask.any(-2)).any())  # a key with no query
        self.assertTrue(mask.any() and (~mask).any())

    def test_forward_matches_numpy_reference(self):
        rng = np.random.default_rng(1)
        scores = rng.normal(size=(2, 1, 5, 7)).astype("float32") * 2
        mask = autodiff_reference.edge_mask(rng)
        for got, want in [
            (
                autodiff_reference.autodiff_softmax(scores, mask),
                ref.softmax_attention(scores, mask),
            ),
            (
                autodiff_reference.autodiff_dnas(scores, mask),
                ref.doubly_normalized_attention(scores, mask),
            ),
            (
                autodiff_reference.autodiff_hybrid(scores, 0.3, mask),
                ref.hybrid_attention(scores, 0.3, mask),
            ),
        ]:
            self.assertAllClose(got, want, atol=1e-5)


class GradientsTest(TestCase):
    def test_gradients_by_hand(self):
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(2, 3, 4)).astype("float32")
        upstream = rng.normal(size=(3, 4)).astype("float32")
        gx, gy = gradients(lambda a, b: a * ops.sin(b), upstream, x, y)
        self.assertAllClose(gx, upstream * np.sin(y), atol=1e-6)
        self.assertAllClose(gy, upstream * x * np.cos(y), atol=1e-6)

    def test_hessian_vector_products_by_hand(self):
        # L = sum(u x^2 y): grad_x = 2uxy, grad_y = u x^2, so
        # d/dx <grad, d> = 2u(y dx + x dy), d/dy = 2ux dx.
        rng = np.random.default_rng(1)
        x, y, dx, dy, u = rng.normal(size=(5, 3, 4)).astype("float32")
        hx, hy = hessian_vector_products(
            lambda a, b: a * a * b, u, [dx, dy], x, y
        )
        self.assertAllClose(hx, 2 * u * (y * dx + x * dy), atol=1e-5)
        self.assertAllClose(hy, 2 * u * x * dx, atol=1e-5)


class SubprocessesTest(TestCase):
    def test_run_script_parses_and_passes_env(self):
        got = run_script(
            "import os\nprint('A 1')\nprint('three words here')\n"
            "print('V', os.environ['HELPER_TEST_VAR'])",
            HELPER_TEST_VAR="x",
        )
        self.assertEqual(got, {"A": "1", "V": "x"})

    def test_run_script_fails_on_a_failing_worker(self):
        with self.assertRaisesRegex(AssertionError, "worker broke"):
            run_script("print('A 1')\nraise RuntimeError('worker broke')")
        with self.assertRaises(AssertionError):
            run_script("import sys\nprint('A 1')\nsys.exit(3)")
        with self.assertRaises(AssertionError):
            run_json_script("import sys\nprint('{}')\nsys.exit(1)")

    def test_run_json_script_reads_the_last_line(self):
        got = run_json_script("print('noise')\nprint('{\"a\": [1, 2]}')")
        self.assertEqual(got, {"a": [1, 2]})


REPLICA_PARITY_SCRIPT = """
from keras_attnvariants import distribute
distribute.split_cpu(2)
from keras_attnvariants.testing import replica_parity
seen = []
train = replica_parity.train
def spy(name, strategy, data, epochs=3):
    seen.append(strategy.num_replicas_in_sync)
    return train(name, strategy, data, epochs)
replica_parity.train = spy
replica_parity.main(
    ["doubly_normalized_attention", "gumbel_discrete_attention"], 17, 1
)
print("REPLICAS", ",".join(map(str, seen)))
"""


class ReplicaParityTest(TestCase):
    def test_single_run_is_on_one_replica(self):
        # The parity check of `distribute_test` compares the mirrored run
        # with this "single" one: a single run over 2 replicas too would
        # make it compare mirrored with mirrored. The sampling model
        # (not deterministic) runs mirrored only.
        got = run_script(REPLICA_PARITY_SCRIPT, KERAS_BACKEND="tensorflow")
        self.assertEqual(got["REPLICAS"], "1,2,2")
