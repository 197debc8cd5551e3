"""Running a test script in a fresh Python process."""

import os
import subprocess
import sys


def run_script(script, timeout=120, **env):
    """Runs `python -c script` and returns its `KEY value` lines as a dict.

    A fresh process is what a test needs when the script configures
    TensorFlow devices (logical CPUs for a MirroredStrategy), which can
    happen only before TensorFlow starts. Raises `AssertionError` with
    the end of stderr if the script fails.

    Args:
        script: Python source.
        timeout: seconds before `subprocess.TimeoutExpired`.
        **env: environment variables added to this process's.

    Returns:
        dict `KEY -> value` (strings) of the stdout lines with two words.
    """
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env),
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(result.stderr[-2000:])
    return dict(
        line.split()
        for line in result.stdout.splitlines()
        if len(line.split()) == 2
    )
