"""Every public name is documented in the README."""

import inspect
import os

import keras_attnvariants as kav
from keras_attnvariants import distribute
from keras_attnvariants import evaluation
from keras_attnvariants.datasets import offline

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def public_names(module):
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
    )


def defined_names(module):
    """Public classes and functions defined in `module` itself."""
    return [
        name
        for name in public_names(module)
        if getattr(vars(module)[name], "__module__", None) == module.__name__
    ]


def test_every_public_class_and_function_is_in_the_readme():
    text = open(README, encoding="utf-8").read()
    names = public_names(kav)
    # Packages: everything they export.
    for sub in (
        kav.ops,
        kav.losses,
        kav.layers,
        kav.callbacks,
        kav.datasets,
        kav.backbones,
        kav.analysis,
    ):
        names += public_names(sub)
    # Modules: what they define (not what they import).
    for module in (evaluation, distribute, offline):
        names += defined_names(module)
    assert len(names) > 20
    missing = sorted({n for n in names if f"`{n}" not in text})
    assert not missing, f"undocumented in README.md: {missing}"


def test_every_layer_and_loss_has_a_section():
    # The README has one section per layer and loss: a heading naming it.
    headings = [
        line
        for line in open(README, encoding="utf-8").read().splitlines()
        if line.startswith("#")
    ]
    for cls in (
        kav.DoublyNormalizedAttention,
        kav.HybridAttention,
        kav.GumbelDiscreteAttention,
        kav.TwoStreamEncoder,
        kav.AttentionGuidanceRegularizer,
        kav.KQAlignment,
    ):
        assert any(cls.__name__ in line for line in headings), cls.__name__
