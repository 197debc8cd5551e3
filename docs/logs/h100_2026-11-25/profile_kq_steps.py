import os, sys, time, glob, shutil
os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, "benchmarks")
import numpy as np, jax, keras
import kq_alignment_overhead as kq
out = os.environ["OUT"]
args = kq.parse_args(["--layers", "6", "--hidden", "512", "--heads", "8", "--batch-size", "64", "--length", "128"])
rng = np.random.default_rng(0)
shape = (args.batch_size, args.length)
ids = rng.integers(1, args.vocabulary, shape).astype("int32")
lengths = rng.integers(args.length // 2, args.length + 1, args.batch_size)
padding = np.arange(args.length)[None] < lengths[:, None]
labels = rng.integers(0, 2, args.batch_size).astype("int32")
for name in sys.argv[1:]:
    model = kq.classifier(args, None if name == "none" else name)
    for _ in range(5):
        model.train_on_batch([ids, padding], labels)
    d = f"/tmp/prof_{name}"
    jax.profiler.start_trace(d)
    for _ in range(10):
        model.train_on_batch([ids, padding], labels)
    jax.profiler.stop_trace()
    p = sorted(glob.glob(d + "/plugins/profile/*/*.xplane.pb"))[-1]
    shutil.copy(p, f"{out}/{name}.xplane.pb")
    print(name, os.path.getsize(p))
