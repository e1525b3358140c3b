"""profiling: the measuring helpers the studies and the arena use."""

import pytest
import torch

from attnlab.profiling import loglog_slope, peak_bytes


def test_peak_bytes_sees_a_known_allocation():
    def alloc():
        a = torch.empty(1000, 1000)  # 4,000,000 bytes, freed at return
        b = torch.empty(500, 1000)  # 2,000,000 bytes alive at the same time
        return a.numel() + b.numel()

    peak = peak_bytes(alloc)
    if peak is None:
        pytest.skip("this torch build exposes no allocation events")
    assert 6_000_000 <= peak < 6_100_000


def test_loglog_slope_recovers_power_laws_and_needs_two_points():
    assert loglog_slope([(n, 3.0 * n**2) for n in (256, 1024, 4096)]) == pytest.approx(2.0, abs=1e-12)
    assert loglog_slope([(n, 0.5 * n) for n in (256, 1024)]) == pytest.approx(1.0, abs=1e-12)
    assert loglog_slope([(256, 1.0), (1024, None)]) is None
