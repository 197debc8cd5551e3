"""GPU profile of KQ train steps with and without the fused adversary
kernels: `python profile_kq_fused.py none gan gan+fused ct ct+fused` from the
repository root (KERAS_BACKEND=jax) writes `$OUT/<name>.xplane.pb` for
`docs/logs/h100_2026-11-25/gpu_kernel_time.py`. The 6-block MCAN-width
model of `benchmarks/kq_alignment_overhead.py`, batch 64 x 128: 5 warm-up
steps, then 5 steps under `jax.profiler`. `+fused` sets
KERAS_ATTNVARIANTS_FUSED_ADVERSARY=1 before that model's step is traced."""

import glob
import os
import shutil
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, "benchmarks")

import jax  # noqa: E402
import kq_alignment_overhead as kq  # noqa: E402

out = os.environ["OUT"]
args = kq.parse_args(
    "--layers 6 --hidden 512 --heads 8 --batch-size 64 --length 128".split()
)
inputs, labels = kq.padded_batch(args)
for name in sys.argv[1:]:
    method, _, fused = name.partition("+")
    os.environ["KERAS_ATTNVARIANTS_FUSED_ADVERSARY"] = "1" if fused else "0"
    model = kq.classifier(args, None if method == "none" else method)
    for _ in range(5):
        model.train_on_batch(inputs, labels)
    trace = f"/tmp/prof_{name}"
    jax.profiler.start_trace(trace)
    for _ in range(5):
        model.train_on_batch(inputs, labels)
    jax.profiler.stop_trace()
    path = sorted(glob.glob(trace + "/plugins/profile/*/*.xplane.pb"))[-1]
    shutil.copy(path, f"{out}/{name.replace('+', '_')}.xplane.pb")
    print(name, os.path.getsize(path), flush=True)
