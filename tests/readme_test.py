"""Every public name is documented in the README."""

import inspect
import os

import keras_attnvariants as kav

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def public_names(module):
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
    )


def test_every_public_class_and_function_is_in_the_readme():
    text = open(README, encoding="utf-8").read()
    names = public_names(kav)
    for sub in (kav.ops, kav.losses, kav.layers, kav.callbacks, kav.datasets):
        names += public_names(sub)
    assert len(names) > 20
    missing = sorted({n for n in names if f"`{n}" not in text})
    assert not missing, f"undocumented in README.md: {missing}"
