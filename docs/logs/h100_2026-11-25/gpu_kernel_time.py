"""GPU kernel time per step by kernel kind, from `jax.profiler` traces:
`python gpu_kernel_time.py STEPS a.xplane.pb [b.xplane.pb ...]` (needs
TensorFlow's `xplane_pb2`). Prints, per file, the total kernel time per step
of the compute stream and its split into matmul / reduce / elementwise /
transpose / other kernels (kernel count per step in parentheses)."""

import collections
import re
import sys

from tensorflow.tsl.profiler.protobuf import xplane_pb2


def kind(name):
    if re.search(r"gemm|xmma|cutlass|cublas", name):
        return "matmul"
    if "transpose" in name:
        return "transpose"
    if "reduce" in name:
        return "reduce"
    if name.startswith(("loop_", "fusion", "wrapped")):
        return "elementwise"
    return re.sub(r"[._]\d+.*", "", name)[:40]


def kernel_times(path, steps):
    """`(time_ms, count)` per kernel name of the compute stream of one
    trace, per step (two Counters; empty if the trace has no GPU)."""
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    time_ms = collections.Counter()
    count = collections.Counter()
    for plane in space.planes:
        if "GPU" not in plane.name:
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if "Compute" not in line.name:
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "?")
                time_ms[name] += event.duration_ps / 1e9 / steps
                count[name] += 1 / steps
    return time_ms, count


def main(steps, paths):
    for path in paths:
        by_name, launches = kernel_times(path, steps)
        time_ms = collections.Counter()
        count = collections.Counter()
        for name, ms in by_name.items():
            time_ms[kind(name)] += ms
            count[kind(name)] += launches[name]
        parts = "  ".join(
            f"{k}:{ms:.2f}({count[k]:.0f})" for k, ms in time_ms.most_common(8)
        )
        total = sum(time_ms.values())
        print(f"{path.split('/')[-1]} {total:.2f} ms  {parts}")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
