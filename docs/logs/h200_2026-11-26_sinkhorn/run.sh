#!/bin/bash
# The device run of 2026-11-26 (fused Sinkhorn kernel): run from the
# repository root on the GPU machine, with `.whl` (keras 3.15.1, namex,
# optree) carried; writes its logs to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
set -o pipefail
# 1. The kernel against the generic path (values and gradients), then the
#    Sinkhorn and KQ alignment tests with it in place.
timeout 240 python3 -m pytest -q -n 8 --timeout 200 -rfEs \
    tests/ops/fused_sinkhorn_test.py tests/ops/transport_test.py \
    tests/losses/kq_alignment_test.py 2>&1 | tail -30 | tee $OUT/gpu_tests.log
# 2. OT overhead at the paper's width and depth, fused then generic.
B="benchmarks/kq_alignment_overhead.py --methods ot --layers 6 --hidden 512 --heads 8 --batch-size 64 --length 128 --repeats ${REPEATS:-9} --steps 10"
timeout 200 python3 $B --output $OUT/kq_ot_fused.md 2>&1 | grep -v "^[IWE]0000" | tail -15
KERAS_ATTNVARIANTS_FUSED_SINKHORN=0 timeout 200 python3 $B \
    --output $OUT/kq_ot_generic.md 2>&1 | grep -v "^[IWE]0000" | tail -15
