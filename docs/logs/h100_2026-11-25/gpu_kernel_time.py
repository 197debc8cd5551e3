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


def main(steps, paths):
    for path in paths:
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        for plane in space.planes:
            if "GPU" not in plane.name:
                continue
            names = {k: v.name for k, v in plane.event_metadata.items()}
            time_ms = collections.Counter()
            count = collections.Counter()
            for line in plane.lines:
                if "Compute" not in line.name:
                    continue
                for event in line.events:
                    k = kind(names.get(event.metadata_id, "?"))
                    time_ms[k] += event.duration_ps / 1e9
                    count[k] += 1
            parts = "  ".join(
                f"{k}:{ms / steps:.2f}({count[k] / steps:.0f})"
                for k, ms in time_ms.most_common(8)
            )
            total = sum(time_ms.values()) / steps
            print(f"{path.split('/')[-1]} {total:.2f} ms  {parts}")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
