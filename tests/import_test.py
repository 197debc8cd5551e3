import subprocess
import sys


def test_core_subpackages_do_not_import_keras_hub():
    code = (
        "import sys, keras_attnvariants, keras_attnvariants.ops, "
        "keras_attnvariants.layers, keras_attnvariants.losses; "
        "print('keras_hub' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False"
