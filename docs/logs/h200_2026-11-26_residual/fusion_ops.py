"""The HLO instructions inside named GPU kernels (fusions) of a
`jax.profiler` trace: `python fusion_ops.py trace.xplane.pb NAME [NAME ...]`
(needs TensorFlow's `xplane_pb2` and `hlo_pb2`). A kernel name from
`kernel_times.py` is its fusion's name with `_` for the last `.`
(`triton_softmax_1` is `triton_softmax.1`). Searches the train-step
modules of the trace (`jit_step`, the one with the attention softmax) and
prints, per fusion, its operands and its instructions with their shapes
and JAX source op, so a kernel can be told forward or backward and its
reads and writes counted."""

import sys

from tensorflow.compiler.xla.service import hlo_pb2
from tensorflow.tsl.profiler.protobuf import xplane_pb2

SKIP = ("constant", "bitcast")


def step_modules(path):
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    plane = next(p for p in space.planes if p.name == "/host:metadata")
    for event in plane.event_metadata.values():
        if not event.name.startswith("jit_step"):
            continue
        proto = hlo_pb2.HloProto()
        proto.ParseFromString(event.stats[0].bytes_value)
        yield event.name, proto.hlo_module


def main(path, names):
    for module_name, module in step_modules(path):
        comps = {c.id: c for c in module.computations}
        entry = comps[module.entry_computation_id]
        if not any(
            i.name.startswith(("triton_softmax", "fusion.39"))
            or "reduce_subtract" in i.name
            for i in entry.instructions
        ):
            continue
        found = [i for i in entry.instructions if i.name in names]
        if not found:
            continue
        print("MODULE", module_name)
        by_id = {i.id: i for c in comps.values() for i in c.instructions}
        for fusion in found:
            operands = [by_id[o].name for o in fusion.operand_ids]
            print("=====", fusion.name, operands)
            for cid in fusion.called_computation_ids:
                for ins in comps[cid].instructions:
                    if ins.opcode in SKIP:
                        continue
                    print(
                        "   ",
                        ins.name,
                        ins.opcode,
                        [by_id[o].name for o in ins.operand_ids],
                        list(ins.shape.dimensions),
                        ins.metadata.op_name[-50:],
                    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
