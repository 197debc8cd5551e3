"""The test order for pytest-xdist (tests/conftest.py) and its record."""

import importlib.util
import json
import os
import re
import types
import unittest

import conftest
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _durations_script():
    spec = importlib.util.spec_from_file_location(
        "durations", os.path.join(ROOT, ".ci", "durations.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Item:
    def __init__(self, nodeid, cls=None):
        self.nodeid = nodeid
        self.cls = cls
        self.marks = []

    def add_marker(self, mark):
        self.marks.append(mark)


class _SharedSetup:
    @classmethod
    def setUpClass(cls):
        pass


class _InheritedSetup(_SharedSetup):
    pass


class _PlainClass(unittest.TestCase):
    pass


def _config(xdist):
    manager = types.SimpleNamespace(hasplugin=lambda name: xdist)
    return types.SimpleNamespace(pluginmanager=manager)


def test_slow_tests_first_and_shared_setup_classes_kept_together(monkeypatch):
    monkeypatch.setattr(
        conftest,
        "_recorded_durations",
        lambda: {
            "a.py::test_quick": 1.0,
            "a.py::test_slow": 30.0,
            "b.py::_SharedSetup::test_two": 20.0,
            "c.py::_PlainClass::test_two": 25.0,
        },
    )
    items = [
        _Item("a.py::test_new"),
        _Item("a.py::test_quick"),
        _Item("b.py::_SharedSetup::test_one", _SharedSetup),
        _Item("a.py::test_slow"),
        _Item("c.py::_PlainClass::test_one", _PlainClass),
        _Item("b.py::_SharedSetup::test_two", _SharedSetup),
        _Item("c.py::_PlainClass::test_two", _PlainClass),
        _Item("d.py::_InheritedSetup::test_one", _InheritedSetup),
    ]
    conftest.pytest_collection_modifyitems(_config(xdist=True), items)
    assert [item.nodeid for item in items] == [
        "a.py::test_slow",
        "c.py::_PlainClass::test_two",
        # The class's 20 s, its tests together.
        "b.py::_SharedSetup::test_one",
        "b.py::_SharedSetup::test_two",
        "a.py::test_quick",
        # Unrecorded tests keep their collection order.
        "a.py::test_new",
        "c.py::_PlainClass::test_one",
        "d.py::_InheritedSetup::test_one",
    ]
    groups = {
        item.nodeid: [mark.kwargs.get("name", mark.args) for mark in item.marks]
        for item in items
    }
    assert groups["b.py::_SharedSetup::test_one"] == [("b.py::_SharedSetup",)]
    assert groups["b.py::_SharedSetup::test_two"] == [("b.py::_SharedSetup",)]
    assert groups["c.py::_PlainClass::test_two"] == []
    assert groups["a.py::test_slow"] == []
    assert groups["d.py::_InheritedSetup::test_one"] == [
        ("d.py::_InheritedSetup",)
    ]


def test_no_group_marks_without_xdist(monkeypatch):
    # The marker is xdist's: unregistered without it (an error here).
    monkeypatch.setattr(conftest, "_recorded_durations", dict)
    item = _Item("b.py::_SharedSetup::test_one", _SharedSetup)
    conftest.pytest_collection_modifyitems(_config(xdist=False), [item])
    assert item.marks == []


def test_recorded_tests_still_exist():
    # A renamed test would lose its place silently.
    with open(os.path.join(ROOT, "tests", "durations.json")) as f:
        recorded = json.load(f)
    assert set(recorded) == {"tensorflow", "jax", "torch"}
    min_seconds = _durations_script().MIN_SECONDS
    defined = {}
    missing = []
    for backend, tests in recorded.items():
        assert tests, backend
        for nodeid, seconds in tests.items():
            assert seconds >= min_seconds, nodeid
            path, *names = nodeid.split("::")
            # pytest's parameters: "[...]".
            name = re.sub(r"\[.*\]$", "", names[-1])
            if path not in defined:
                with open(os.path.join(ROOT, path)) as f:
                    defined[path] = re.findall(r"def (test\w*)\(", f.read())
            # absl's parameters append an index or "_name" to the method.
            if not any(name.startswith(test) for test in defined[path]):
                missing.append(f"{backend}: {nodeid}")
    assert not missing, missing


@pytest.mark.parametrize(
    "line, nodeid, seconds",
    [
        (
            "12.50s call     tests/a_test.py::test_x[p@q]",
            "tests/a_test.py::test_x[p@q]",
            12.5,
        ),
        (
            "3.00s setup    tests/b_test.py::C::test_y@tests/b_test.py::C",
            "tests/b_test.py::C::test_y",
            3.0,
        ),
    ],
)
def test_durations_script_reads_reports(line, nodeid, seconds):
    parsed = _durations_script().parse([line, "== 3 passed"])
    assert parsed == {nodeid: seconds}
