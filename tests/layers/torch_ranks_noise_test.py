"""Gumbel noise and attention dropout differ between PyTorch ranks.

Under `torch.distributed` (e.g. `DistributedDataParallel`) every rank
seeds alike and indexes its local batch from 0, so without the rank in the
noise key every rank drew the same samples. Two real processes in a gloo
group on this host; runs under any `KERAS_BACKEND` (the workers use
PyTorch).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["KERAS_BACKEND"] = "torch"
    import numpy as np
    import torch.distributed as dist
    rank, init_file, out_dir, grouped = (
        int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    )
    if grouped:
        dist.init_process_group(
            "gloo", init_method="file://" + init_file, rank=rank,
            world_size=2,
        )
    import keras
    from keras import ops
    keras.utils.set_random_seed(0)  # same initial weights on both ranks
    from keras_attnvariants.layers.gumbel_discrete_attention import (
        GumbelDiscreteAttention,
    )
    from keras_attnvariants.layers.hybrid_attention import HybridAttention
    x = np.random.default_rng(0).normal(size=(1, 6, 4)).astype("float32")
    gumbel = GumbelDiscreteAttention(num_heads=2, key_dim=3, seed=1)
    dropped = HybridAttention(
        num_heads=2, key_dim=3, hybrid_init=0.0, dropout=0.5, seed=1
    )
    _, weights = gumbel(x, x, return_attention_scores=True, training=True)
    output = dropped(x, x, training=True)
    result = {
        "weights": ops.convert_to_numpy(weights).tolist(),
        "output": ops.convert_to_numpy(output).tolist(),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if grouped:
        dist.barrier()
        dist.destroy_process_group()
    """
)


def _run_ranks(tmp_path, grouped):
    env = dict(os.environ, KERAS_BACKEND="torch", TF_CPP_MIN_LOG_LEVEL="3")
    init_file = tmp_path / f"init_{int(grouped)}"
    out_dir = tmp_path / f"out_{int(grouped)}"
    out_dir.mkdir()
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(rank),
                str(init_file),
                str(out_dir),
                "1" if grouped else "0",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        for worker in workers:
            _, err = worker.communicate(timeout=180)
            assert worker.returncode == 0, err[-2000:]
    finally:
        # A rank that failed leaves the other one waiting in the group's
        # rendezvous (gloo's default timeout is 30 minutes): end it.
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return [
        json.loads((out_dir / f"rank{rank}.json").read_text())
        for rank in range(2)
    ]


def _max_diff(a, b):
    import numpy as np

    return float(np.abs(np.array(a) - np.array(b)).max())


@pytest.mark.slow
def test_ranks_draw_different_noise_and_dropout(tmp_path):
    first, second = _run_ranks(tmp_path, grouped=True)
    assert _max_diff(first["weights"], second["weights"]) > 1e-3
    assert _max_diff(first["output"], second["output"]) > 1e-3
    # Outside a process group the two processes are two identical seeded
    # runs: same samples, same masks (the difference above is the rank).
    alone = _run_ranks(tmp_path, grouped=False)
    assert _max_diff(alone[0]["weights"], alone[1]["weights"]) == 0.0
    assert _max_diff(alone[0]["output"], alone[1]["output"]) == 0.0
