"""GPU kernel time per step, kernel by kernel, from `jax.profiler` traces:
`python kernel_times.py STEPS a.xplane.pb [b.xplane.pb ...]` (needs
TensorFlow's `xplane_pb2`). Prints, per file, the compute stream's kernel
time per step and its 14 longest kernels (microseconds per step, launches
per step). The parsing is `gpu_kernel_time.py`'s of the H100 run."""

import os
import sys

sys.path.insert(
    0,
    os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "h100_2026-11-25"
    ),
)

from gpu_kernel_time import kernel_times  # noqa: E402


def main(steps, paths):
    for path in paths:
        time_ms, count = kernel_times(path, steps)
        total = sum(time_ms.values()) * 1e3
        print(f"{os.path.basename(path)} total {total:.1f} us/step")
        for name, ms in time_ms.most_common(14):
            print(f"   {ms * 1e3:7.2f} us  x{count[name]:.0f}  {name[:90]}")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
