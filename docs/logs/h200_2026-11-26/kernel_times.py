"""GPU kernel time per step, kernel by kernel, from `jax.profiler` traces:
`python kernel_times.py STEPS a.xplane.pb [b.xplane.pb ...]` (needs
TensorFlow's `xplane_pb2`). Prints, per file, the compute stream's kernel
time per step and its 14 longest kernels (microseconds per step, launches
per step)."""

import collections
import sys

from tensorflow.tsl.profiler.protobuf import xplane_pb2


def main(steps, paths):
    for path in paths:
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        for plane in space.planes:
            if "GPU" not in plane.name:
                continue
            names = {k: v.name for k, v in plane.event_metadata.items()}
            time_us = collections.Counter()
            count = collections.Counter()
            for line in plane.lines:
                if "Compute" not in line.name:
                    continue
                for event in line.events:
                    name = names.get(event.metadata_id, "?")
                    time_us[name] += event.duration_ps / 1e6 / steps
                    count[name] += 1
            total = sum(time_us.values())
            print(f"{path.split('/')[-1]} total {total:.1f} us/step")
            for name, us in time_us.most_common(14):
                print(f"   {us:7.2f} us  x{count[name] // steps}  {name[:90]}")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
