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
        "for m in ('keras_hub', 'scipy.stats')]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False]
