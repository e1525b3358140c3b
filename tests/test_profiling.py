"""profiling: the measuring helpers the studies and the arena use."""

import pytest
import torch

from attnlab.profiling import allocator_env, loglog_slope, measure_in_child, peak_bytes


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


def test_the_keep_allocator_stops_the_page_faults_of_refreshed_large_blocks():
    """The cause of the superlinear times at 16K-32K: glibc unmaps a freed block above its mmap
    threshold, so the next block of that size is faulted in again; ``keep`` reuses it."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the allocator setting is glibc's")
    faults = {a: measure_in_child("tests.fault_probe", {"mib": 64, "steps": 4}, a, env=allocator_env(a)) for a in ("system", "keep")}
    pages = 64 * 2**20 // 4096
    assert faults["system"] >= pages // 2  # every step touches fresh pages (16K of them per 64 MiB)
    assert faults["keep"] < pages // 20  # the freed block is reused: (almost) no page is faulted again
    with pytest.raises(ValueError, match="unknown allocator 'tcmalloc'; expected one of keep, system"):
        allocator_env("tcmalloc")


def test_round_robin_reads_the_clock_after_a_gpu_has_caught_up(monkeypatch):
    """On a GPU each call is timed between two synchronisations (the GPU runs behind the host);
    on the CPU (or no device named) nothing waits."""
    import attnlab.profiling as profiling

    synced, calls = [], []
    monkeypatch.setattr(profiling, "_sync", lambda device: synced.append((device, len(calls))))
    times = profiling.round_robin({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 2, 0.0, device="cuda")
    assert len(times["a"]) == len(times["b"]) == 3 and len(calls) == 6  # a warm-up and two timed rounds
    assert synced == [("cuda", k + after) for k in range(6) for after in (0, 1)]  # before and after every call
    synced.clear()
    for device in ("cpu", None, torch.device("cpu")):
        profiling.round_robin({"a": lambda: None}, 1, 0.0, device=device)
    assert synced == []
