import collections, re, sys
from tensorflow.tsl.profiler.protobuf import xplane_pb2
for path in sys.argv[2:]:
    xs = xplane_pb2.XSpace(); xs.ParseFromString(open(path, "rb").read())
    n = int(sys.argv[1])
    for plane in xs.planes:
        if "GPU" not in plane.name: continue
        md = {k: v.name for k, v in plane.event_metadata.items()}
        cat = collections.Counter(); cnt = collections.Counter()
        for line in plane.lines:
            if "Compute" not in line.name: continue
            for ev in line.events:
                name = md.get(ev.metadata_id, "?")
                if re.search(r"gemm|xmma|cutlass|cublas", name): c = "gemm"
                elif "transpose" in name: c = "transpose"
                elif "reduce" in name: c = "reduce"
                elif name.startswith("loop_") or name.startswith("fusion") or name.startswith("wrapped"): c = "elementwise"
                else: c = re.sub(r"[._]\d+.*", "", name)[:40]
                cat[c] += ev.duration_ps / 1e9; cnt[c] += 1
        print(path.split("/")[-1], f"{sum(cat.values())/n:.2f} ms", "  ".join(f"{c}:{ms/n:.2f}({cnt[c]/n:.0f})" for c, ms in cat.most_common(8)))
