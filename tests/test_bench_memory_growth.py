"""The memory-growth benchmark's arithmetic: each round's ratio of the K = 4 worker's growth to the single
worker's, medians over rounds, and the table the results page shows."""

from benchmarks.memory_growth import row, table

MIB = 2**20


def test_the_ratio_is_the_pipeline_workers_growth_over_the_single_workers():
    rounds = [
        {(12, 1): 2500 * MIB, (24, 1): 4100 * MIB, (12, 4): 1100 * MIB, (24, 4): 1500 * MIB},
        {(12, 1): 2500 * MIB, (24, 1): 4100 * MIB, (12, 4): 1100 * MIB, (24, 4): 1600 * MIB},
    ]
    r = row("this tree", rounds)
    assert r["ratio_range"] == [400 / 1600, 500 / 1600]
    assert r["ratio"] == (400 / 1600 + 500 / 1600) / 2
    assert r["growth_k1_bytes"] == 1600 * MIB and r["growth_k4_bytes"] == 450 * MIB
    text = table({"repeats": 2, "rows": [r]})
    assert "| this tree | 2500 | 4100 | 1100 | 1550 | 1600 | 450 | 0.28x (0.25-0.31) |" in text
