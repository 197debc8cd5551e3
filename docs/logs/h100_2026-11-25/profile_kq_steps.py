"""GPU profile of KQ train steps: `python profile_kq_steps.py none gan ...`
from the repository root (KERAS_BACKEND=jax); writes `$OUT/<name>.xplane.pb`
for `gpu_kernel_time.py`. The 6-block MCAN-width model of
`benchmarks/kq_alignment_overhead.py`, batch 64 x 128: 5 warm-up steps,
then 10 steps under `jax.profiler`."""

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
    model = kq.classifier(args, None if name == "none" else name)
    for _ in range(5):
        model.train_on_batch(inputs, labels)
    trace = f"/tmp/prof_{name}"
    jax.profiler.start_trace(trace)
    for _ in range(10):
        model.train_on_batch(inputs, labels)
    jax.profiler.stop_trace()
    path = sorted(glob.glob(trace + "/plugins/profile/*/*.xplane.pb"))[-1]
    shutil.copy(path, f"{out}/{name}.xplane.pb")
    print(name, os.path.getsize(path))
