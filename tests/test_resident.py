"""resident.py: the peak resident memory of a block of work, reset at its start."""
import numpy as np
import pytest

from xtremedistil_tf import resident

pytestmark = pytest.mark.skipif(resident.rss_mib() is None, reason="no /proc/self/status (not Linux)")


def _touch(mib: int) -> None:
    block = np.ones(mib * 2**20, dtype=np.uint8)   # written, so resident
    assert int(block[::4096].sum()) == mib * 256


def test_peak_of_a_block_is_its_own_after_a_larger_one():
    with resident.peak_of() as large:
        _touch(300)
    with resident.peak_of() as small:
        _touch(40)
    after = resident.rss_mib()
    if small.since_start:
        pytest.skip("this kernel does not let a process reset its peak (/proc/self/clear_refs)")
    # The large block's peak holds its 300 MiB; the small one's does not hold them again: it was reset at its start.
    assert large.mib >= after + 290
    assert after + 35 <= small.mib <= after + 120
    assert not large.since_start


def test_peak_is_none_without_proc(monkeypatch):
    monkeypatch.setattr(resident, "STATUS", "/nonexistent/status")
    monkeypatch.setattr(resident, "CLEAR_REFS", "/nonexistent/clear_refs")
    with resident.peak_of() as peak:
        pass
    assert peak.mib is None and peak.since_start and resident.rss_mib() is None


def test_counter_slack_follows_the_kernels_per_cpu_batch(monkeypatch):
    # 2 CPUs: batch 32 pages, 3 counters, 2 readings: 2 * 3 * 2 * 32 pages of 4 KiB = 1.5 MiB.
    monkeypatch.setattr(resident.os, "cpu_count", lambda: 2)
    assert resident.counter_slack_mib() == 1.5
    # 64 CPUs: the batch grows to 2 * 64 = 128 pages.
    monkeypatch.setattr(resident.os, "cpu_count", lambda: 64)
    assert resident.counter_slack_mib() == 2 * 3 * 64 * 128 * 4096 / 2**20
