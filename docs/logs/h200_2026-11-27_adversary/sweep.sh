#!/bin/bash
# Tile / warps sweep of the fused adversary kernels by GPU kernel time
# (same code as the benchmark run; settings read at import, so one process
# per setting). Run from the repository root on the GPU machine with
# `.whl` carried; traces go to $OUT as <method>_t<tile>w<warps>.xplane.pb.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for tw in 32:4 64:8 128:16 32:8; do
    t=${tw%:*} w=${tw#*:}
    KERAS_ATTNVARIANTS_ADVERSARY_TILE=$t KERAS_ATTNVARIANTS_ADVERSARY_WARPS=$w \
        timeout 60 python3 docs/logs/h200_2026-11-27_adversary/profile_kq_fused.py \
        gan+fused ct+fused 2>&1 | grep -v "^[IWE]0000" | tail -3
    for m in gan ct; do
        [ -f $OUT/${m}_fused.xplane.pb ] && mv $OUT/${m}_fused.xplane.pb $OUT/${m}_t${t}w${w}.xplane.pb
    done
    date +%T
done
