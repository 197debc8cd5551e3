"""Running a test script in a fresh Python process."""

import json
import os
import subprocess
import sys


def run_script(script, timeout=300, **env):
    """Runs `python -c script` and returns its `KEY value` lines as a dict.

    A fresh process is what a test needs when the script configures
    TensorFlow devices (logical CPUs for a MirroredStrategy), which can
    happen only before TensorFlow starts. Raises `AssertionError` with
    the end of stderr if the script fails.

    Args:
        script: Python source.
        timeout: seconds before `subprocess.TimeoutExpired`: a guard
            against a hang, generous because the suite runs two tests at
            a time (`pytest -n 2`) on a 2-core machine.
        **env: environment variables added to this process's.

    Returns:
        dict `KEY -> value` (strings) of the stdout lines with two words.
    """
    return dict(
        line.split()
        for line in _stdout(script, timeout, env).splitlines()
        if len(line.split()) == 2
    )


def run_json_script(script, timeout=300, **env):
    """Runs `python -c script` and returns its last stdout line, as JSON.

    Like `run_script`, for scripts that print their results with
    `print(json.dumps(...))` as their last line.
    """
    return json.loads(_stdout(script, timeout, env).strip().splitlines()[-1])


def _stdout(script, timeout, env):
    """stdout of `python -c script` with `env` added; `AssertionError`
    with the end of stderr if it fails."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(result.stderr[-3000:])
    return result.stdout
