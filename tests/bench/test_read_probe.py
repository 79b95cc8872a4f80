"""bench/gpu/read_probe.py on this machine's MLX: a figure per size, each a median of real
reads and writes of arrays the device computed or the host wrote."""

from __future__ import annotations

from bench.gpu.read_probe import SIZES, probe


def test_the_read_probe_times_every_size_it_names():
    out = probe(repeats=3)
    assert out["repeats"] == 3 and list(out["sizes"]) == [str(n) for n in SIZES]
    for n, figures in out["sizes"].items():
        assert figures["bytes"] == 4 * int(n)
        assert figures["read_us"] > 0 and figures["item_us"] > 0 and figures["device_add_us"] > 0
