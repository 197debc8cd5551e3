import json
import subprocess
import sys


def test_package_import_leaves_heavy_optional_modules_unloaded():
    # keras_hub: the core subpackages must work without it. scipy.stats:
    # 0.6-0.9 s of every process's import, only needed to rank tokens.
    code = (
        "import json, sys, keras_attnvariants, keras_attnvariants.ops, "
        "keras_attnvariants.layers, keras_attnvariants.losses; "
        "print(json.dumps([m in sys.modules "
        "for m in ('keras_hub', 'scipy.stats')] + "
        # The namespaces the README names after a plain import
        # (`keras_attnvariants.distribute.pick_strategy()` was an
        # AttributeError).
        "[callable(keras_attnvariants.distribute.pick_strategy), "
        "callable(keras_attnvariants.evaluation.expected_calibration_error)]"
        "))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    last = out.stdout.strip().splitlines()[-1]
    assert json.loads(last) == [False, False, True, True]
