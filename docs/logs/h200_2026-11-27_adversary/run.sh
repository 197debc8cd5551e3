#!/bin/bash
# The device run of 2026-11-27 (fused adversary kernels, after the
# platform wrapper), run from the repository root on the GPU machine, with
# `.whl` (keras 3.15.1, namex, optree) carried; logs go to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
set -o pipefail
# 1. The kernels against the generic path (values and gradients), then the
#    KQ alignment tests with the fused path switched on.
KERAS_ATTNVARIANTS_FUSED_ADVERSARY=1 timeout 170 python3 -m pytest -q -n 8 \
    --timeout 150 -rfEs --tb=short -p no:cacheprovider \
    tests/ops/fused_adversary_test.py tests/losses/kq_alignment_test.py \
    2>&1 | tail -40 | cut -c1-400 | tee $OUT/gpu_tests.log
# 2. GAN and CT overhead at the paper's width and depth: the generic path,
#    then the fused kernels in two tile configurations.
B="benchmarks/kq_alignment_overhead.py --methods gan ct --layers 6 --hidden 512 --heads 8 --batch-size 64 --length 128 --repeats ${REPEATS:-7} --steps 10"
run() { timeout 130 python3 $B --output $OUT/$1.md 2>&1 | grep -v "^[IWE]0000" | tail -9; }
KERAS_ATTNVARIANTS_FUSED_ADVERSARY=0 run kq_generic
KERAS_ATTNVARIANTS_FUSED_ADVERSARY=1 run kq_fused_t128w8
KERAS_ATTNVARIANTS_FUSED_ADVERSARY=1 KERAS_ATTNVARIANTS_ADVERSARY_TILE=64 \
    KERAS_ATTNVARIANTS_ADVERSARY_WARPS=4 run kq_fused_t64w4
