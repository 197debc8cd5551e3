"""Benchmark methodology bugs found in review, each with the test that
failed before its fix (tiny shapes, seconds on a 2-core CPU)."""

import pytest

# The loader of the first benchmark review (pytest puts `tests/` on the
# path): imports a script, leaving `os.environ` and `sys.path` as they were.
from review_benchmarks_test import _load  # noqa: E402


def test_dropout_cost_is_measured_against_the_same_layer_without_dropout():
    # The "softmax" rows are `HybridAttention(hybrid_init=0.0)`: MHA's
    # weights, but computed as a hybrid (both normalizations and the mix),
    # about 1.15x of keras MHA's train step without any dropout. The script
    # had no row of that layer without dropout, so the dropout's cost could
    # only be read against keras MHA without dropout (the README's "adds 8%
    # / 12%"), which counted the hybrid layer's own overhead as dropout's.
    script = _load("dropout_step")
    with_dropout = script.make_layer(script.FOLDED, 2, 4, 0.1)
    without = script.make_layer(script.NO_DROPOUT, 2, 4, 0.1)
    assert script.NO_DROPOUT in script.LABELS
    assert type(without) is type(with_dropout)
    assert without.hybrid_init == with_dropout.hybrid_init == 0.0
    assert without._dropout == 0.0 and with_dropout._dropout == 0.1
    for label in (script.FOLDED, script.MATERIALIZED, script.KERAS_DROPOUT):
        assert script.COST_BASELINES[label] == script.NO_DROPOUT
    assert script.COST_BASELINES[script.REFERENCE] == script.MHA_NO_DROPOUT

    # Same-repeat ratios against the same layer: the folded dropout costs
    # 2% here, though the row is 1.12x of keras MHA without dropout.
    mha = [1.0, 2.0, 1.0]
    times = {
        script.REFERENCE: [10.0, 20.0, 10.0],
        script.MHA_NO_DROPOUT: mha,
        script.NO_DROPOUT: [1.1 * t for t in mha],
        script.FOLDED: [1.122 * t for t in mha],
        script.MATERIALIZED: [1.21 * t for t in mha],
        script.KERAS_DROPOUT: [11.0 * t for t in mha],
    }
    costs = script.dropout_costs(times)
    assert costs[script.FOLDED] == pytest.approx(1.02)
    assert costs[script.MATERIALIZED] == pytest.approx(1.1)
    assert costs[script.KERAS_DROPOUT] == pytest.approx(10.0)
    assert costs[script.REFERENCE] == pytest.approx(10.0)
    table = script.cost_table({128: costs})
    assert f"| {script.FOLDED} / {script.NO_DROPOUT} | 1.02x |" in table, table


def test_kq_header_states_the_machine_before_the_timing(monkeypatch, capsys):
    # The header's load average and date were read after the timing and
    # the FLOP counts (whose CPU compiles load the host), so the script's
    # own work showed as the machine's load ("run 2 came under more outside
    # load") and the date was the end's. Like the other scripts, it now
    # states the machine before timing and the load after it, labelled.
    script = _load("kq_alignment_overhead")
    timed = []
    time_alternating = script.time_alternating

    def spy(*args, **kwargs):
        timed.append(True)
        return time_alternating(*args, **kwargs)

    monkeypatch.setattr(script, "time_alternating", spy)
    monkeypatch.setattr(
        script,
        "machine_summary",
        lambda: "MACHINE-AFTER" if timed else "MACHINE-BEFORE",
    )
    monkeypatch.setattr(
        script, "load_average_1min", lambda: 9.0 if timed else 0.5
    )
    script.main(
        [
            "--quick",
            "--methods",
            "mmd",
            "--hidden",
            "8",
            "--heads",
            "2",
            "--length",
            "4",
            "--batch-size",
            "2",
            "--repeats",
            "1",
            "--steps",
            "1",
        ]
    )
    header = capsys.readouterr().out.splitlines()[0]
    assert "MACHINE-BEFORE" in header and "MACHINE-AFTER" not in header
    assert "1-min load average after 9.00" in header
