"""Converted-backbone findings of a keras-hub review (2026-12-01), each a
test that fails without its fix.

- `load_model(..., safe_mode=True)` imported any module a `.keras` file
  named for an unregistered `attention_class` or `base_class` (its
  import-time code ran), and the resolved `base_class` was not checked.
- A user-written term with a sublayer of its own lost its trained weights
  on a `.keras` reload: the rebuilt term was unbuilt, Keras skipped its
  weights without an error, and the first training step initialized them
  anew.
- `first_layers` of a backbone with LoRA dropped the adapters: the copy
  computed something else and trained only the query and value biases.
- Re-converting a converted backbone dropped the first conversion's
  attention kwargs (DNAS `iterations`, a `dropout` override, `seed`,
  `attention_path`) and attached terms, while HNAS's `u` carried over.
"""

import json
import os
import sys
import textwrap
import zipfile

import keras
import numpy as np
import pytest
from conversion_serialization_test import inputs
from conversion_serialization_test import numpy_outputs
from conversion_serialization_test import tiny_bert

import keras_attnvariants as kav
from keras_attnvariants.losses.attention_guidance import (
    AttentionGuidanceRegularizer,
)
from keras_attnvariants.testing.terms import ProjectedQueryTerm

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub (optional extra) is not installed"
)
from keras_attnvariants.backbones import convert_backbone  # noqa: E402
from keras_attnvariants.backbones import first_layers  # noqa: E402
from keras_attnvariants.backbones import self_attention_layers  # noqa: E402

# An unregistered user attention class in a module of its own; importing
# the module is what a `.keras` file must not make safe mode do.
USER_MODULE = "kav_review_user_attention"
USER_SOURCE = textwrap.dedent(
    """
    import keras

    class UserAttention(keras.layers.MultiHeadAttention):
        pass
    """
)


def _sequence(backbone):
    return numpy_outputs(backbone(inputs()))["sequence_output"]


def _class_reference_editor(argument, reference):
    """A `_rewrite_config` edit putting `reference` at `argument`
    (`"base_class"` or an `attention_config` entry)."""

    def edit(config):
        if argument == "base_class":
            config["base_class"] = dict(reference)
        else:
            config["attention_config"][argument] = dict(reference)

    return edit


def _rewrite_config(source, target, edit):
    """Copies the `.keras` file `source` to `target`, with `edit` applied
    to the backbone's config (a dict, changed in place)."""
    with zipfile.ZipFile(source) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(files["config.json"])
    edit(config["config"])
    files["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return target


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The module `USER_MODULE`, importable from `tmp_path`; removed from
    `sys.modules` again at the end."""
    (tmp_path / f"{USER_MODULE}.py").write_text(USER_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, USER_MODULE, raising=False)
    yield
    sys.modules.pop(USER_MODULE, None)


def test_safe_mode_imports_no_module_a_file_names(tmp_path, user_module):
    saved = os.path.join(tmp_path, "dnas.keras")
    convert_backbone(tiny_bert(), kav.DoublyNormalizedAttention).save(saved)
    reference = {
        "registered_name": "nobody>UserAttention",
        "module": USER_MODULE,
        "class_name": "UserAttention",
    }
    for argument in ("attention_class", "base_class"):
        path = _rewrite_config(
            saved,
            str(tmp_path / f"{argument}.keras"),
            _class_reference_editor(argument, reference),
        )
        with pytest.raises(
            ValueError,
            match=f"Refusing to import the module '{USER_MODULE}' named by "
            f"`{argument}`.*safe_mode=False",
        ):
            keras.saving.load_model(path, safe_mode=True)
        assert USER_MODULE not in sys.modules
    # Keras's own `deserialize_keras_object` is in safe mode by default.
    config = keras.saving.serialize_keras_object(
        convert_backbone(tiny_bert(), kav.DoublyNormalizedAttention)
    )
    config["config"]["attention_config"]["attention_class"] = reference
    with pytest.raises(ValueError, match="Refusing to import"):
        keras.saving.deserialize_keras_object(config)
    assert USER_MODULE not in sys.modules


def test_unregistered_user_class_loads_with_safe_mode_false(
    tmp_path, user_module
):
    import kav_review_user_attention

    converted = convert_backbone(
        tiny_bert(), kav_review_user_attention.UserAttention
    )
    expected = _sequence(converted)
    path = os.path.join(tmp_path, "user.keras")
    converted.save(path)
    # Rebuilt in this process, where the module is imported: as before.
    clone = type(converted).from_config(converted.get_config())
    assert type(self_attention_layers(clone)[0]).__name__ == "UserAttention"
    # A fresh process has not imported it: safe mode refuses, ...
    del sys.modules[USER_MODULE]
    with pytest.raises(ValueError, match="Refusing to import"):
        keras.saving.load_model(path)
    assert USER_MODULE not in sys.modules
    # ... `safe_mode=False` imports it.
    reloaded = keras.saving.load_model(path, safe_mode=False)
    layers = self_attention_layers(reloaded)
    assert all(type(x).__name__ == "UserAttention" for x in layers)
    np.testing.assert_allclose(_sequence(reloaded), expected, atol=1e-6)


def test_resolved_classes_must_be_attention_and_backbone(tmp_path):
    saved = os.path.join(tmp_path, "dnas.keras")
    convert_backbone(tiny_bert(), kav.DoublyNormalizedAttention).save(saved)
    dense = {
        "registered_name": "Dense",
        "module": "keras.src.layers.core.dense",
        "class_name": "Dense",
    }
    for argument, base in (
        ("attention_class", "keras.layers.MultiHeadAttention"),
        ("base_class", "keras_hub.models.Backbone"),
    ):
        path = _rewrite_config(
            saved,
            str(tmp_path / f"{argument}.keras"),
            _class_reference_editor(argument, dense),
        )
        for safe_mode in (True, False):
            with pytest.raises(
                ValueError,
                match=f"`{argument}` of a converted backbone must name a "
                f"subclass of `{base}`. Received: {argument}=.*Dense",
            ):
                keras.saving.load_model(path, safe_mode=safe_mode)


def _term_kernel(backbone):
    term = self_attention_layers(backbone)[0].attention_losses[0]
    assert term.built and len(term.weights) == 2
    return keras.ops.convert_to_numpy(term.projection.kernel)


def test_user_term_with_a_sublayer_keeps_its_weights(tmp_path):
    term = ProjectedQueryTerm(name="probe")
    converted = convert_backbone(
        tiny_bert(), kav.HybridAttention, attention_losses=[term]
    )
    # Built by the conversion, under the first converted layer's path.
    assert sorted(v.path for v in term.weights) == [
        "transformer_layer_0/self_attention_layer/probe/projection/bias",
        "transformer_layer_0/self_attention_layer/probe/projection/kernel",
    ]
    # Trained values: not those of a fresh initialization.
    term.projection.kernel.assign(np.linspace(-1.0, 1.0, 4).reshape(4, 1))
    expected = _term_kernel(converted)
    path = os.path.join(tmp_path, "term.keras")
    converted.save(path)
    reloaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(_term_kernel(reloaded), expected)
    # Rebuilt from the config, it takes the weights (there were fewer).
    clone = type(converted).from_config(converted.get_config())
    clone.set_weights(converted.get_weights())
    np.testing.assert_array_equal(_term_kernel(clone), expected)


def test_frozen_user_term_with_a_sublayer_stays_frozen(tmp_path):
    frozen = ProjectedQueryTerm(name="probe", trainable=False)
    converted = convert_backbone(
        tiny_bert(), kav.HybridAttention, attention_losses=[frozen]
    )
    path = os.path.join(tmp_path, "frozen.keras")
    converted.save(path)
    for backbone in (
        converted,
        type(converted).from_config(converted.get_config()),
        keras.saving.load_model(path),
    ):
        term = self_attention_layers(backbone)[0].attention_losses[0]
        assert not term.trainable and len(term.weights) == 2
        assert not [v for v in backbone.trainable_weights if "probe" in v.path]


def _lora_bert():
    backbone = tiny_bert()
    backbone.enable_lora(rank=2)
    for layer in self_attention_layers(backbone):
        for dense in (layer._query_dense, layer._value_dense):
            # Trained adapters: B starts at 0.
            shape = dense.lora_kernel_b.shape
            dense.lora_kernel_b.assign(
                np.random.default_rng(0).normal(size=shape).astype("float32")
            )
    return backbone


def _trainable(backbone):
    return sorted(v.path for v in backbone.trainable_weights)


def test_first_layers_keeps_lora():
    original = _lora_bert()
    converted = convert_backbone(original, kav.HybridAttention, hybrid_init=0)
    data = inputs()
    valid = data["padding_mask"].astype(bool)
    for backbone in (original, converted):
        full = first_layers(backbone, backbone.num_layers)
        np.testing.assert_allclose(
            _sequence(full)[valid], _sequence(backbone)[valid], atol=1e-6
        )
        # The adapters train, the kernels under them stay frozen.
        assert _trainable(full) == _trainable(backbone)
        assert any("lora_kernel_a" in p for p in _trainable(full))
        one = first_layers(backbone, 1)
        assert [
            layer._query_dense.lora_enabled
            for layer in self_attention_layers(one)
        ] == [True]
        assert _trainable(one) == [
            p for p in _trainable(backbone) if "transformer_layer_1" not in p
        ]


def test_reconversion_keeps_the_first_conversions_arguments():
    original = tiny_bert()  # dropout 0.1
    sinkhorn = convert_backbone(
        original,
        kav.DoublyNormalizedAttention,
        iterations=5,
        dropout=0.0,
        seed=3,
        attention_path="explicit",
    )
    guidance = AttentionGuidanceRegularizer({0: "next"}, alpha=1.0)
    guided = convert_backbone(
        sinkhorn, kav.DoublyNormalizedAttention, attention_losses=[guidance]
    )
    for i, layer in enumerate(self_attention_layers(guided)):
        assert layer.iterations == 5
        assert layer.get_config()["dropout"] == 0.0
        assert layer.seed == 3 + i
        assert layer.attention_path == "explicit"
        assert layer.attention_losses == [guidance]
    np.testing.assert_allclose(
        _sequence(guided), _sequence(sinkhorn), atol=1e-6
    )
    # The new arguments win; the config holds the merged ones.
    fewer = convert_backbone(
        guided, kav.DoublyNormalizedAttention, iterations=2
    )
    layer = self_attention_layers(fewer)[0]
    assert (layer.iterations, layer.seed) == (2, 3)
    stored = fewer.get_config()["attention_config"]["attention_kwargs"]
    assert (stored["iterations"], stored["seed"]) == (2, 3)
    # The terms carry over as copies, with their state ...
    guidance.step.assign(7)
    again = convert_backbone(guided, kav.DoublyNormalizedAttention)
    (copy,) = self_attention_layers(again)[0].attention_losses
    assert copy is not guidance and copy.name == guidance.name
    assert int(keras.ops.convert_to_numpy(copy.step)) == 7
    # ... and `attention_losses=[]` removes them.
    bare = convert_backbone(
        guided, kav.DoublyNormalizedAttention, attention_losses=[]
    )
    assert self_attention_layers(bare)[0].attention_losses == []
    assert self_attention_layers(bare)[0].iterations == 5


def test_reconversion_with_another_class_keeps_what_it_takes():
    guidance = AttentionGuidanceRegularizer({0: "next"}, alpha=1.0)
    hnas = convert_backbone(
        tiny_bert(),
        kav.HybridAttention,
        hybrid_init=0.5,
        iterations=3,
        dropout=0.0,
        attention_losses=[guidance],
    )
    # Resetting u keeps the rest (the README's recipe for softmax).
    reset = convert_backbone(hnas, kav.HybridAttention, hybrid_init=0.0)
    layer = self_attention_layers(reset)[0]
    assert [t.name for t in layer.attention_losses] == [guidance.name]
    assert layer.iterations == 3
    np.testing.assert_array_equal(layer.hybrid_weights, 0.0)
    # DNAS takes `iterations`, not `hybrid_init`.
    dnas = convert_backbone(hnas, kav.DoublyNormalizedAttention)
    layer = self_attention_layers(dnas)[0]
    assert type(layer) is kav.DoublyNormalizedAttention
    assert layer.iterations == 3 and len(layer.attention_losses) == 1
    stored = dnas.get_config()["attention_config"]["attention_kwargs"]
    assert "hybrid_init" not in stored
    # keras MHA takes `dropout`, neither `iterations` nor terms.
    mha = convert_backbone(hnas, keras.layers.MultiHeadAttention)
    layer = self_attention_layers(mha)[0]
    assert type(layer) is keras.layers.MultiHeadAttention
    assert layer.get_config()["dropout"] == 0.0
    stored = mha.get_config()["attention_config"]["attention_kwargs"]
    assert sorted(stored) == ["dropout"]
