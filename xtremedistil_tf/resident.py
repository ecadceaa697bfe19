"""Resident memory of this process: now, and the peak over a stretch of work (Linux's /proc; None elsewhere).

The peak of one step of a run (`peak_of`) is the kernel's high-water mark (VmHWM) after it was reset to the
current resident size at the step's start (writing 5 to /proc/self/clear_refs, Linux 4.0 on): the step's own
peak, including whatever earlier steps of the same process still hold, which is what a machine must have.
Standard library only.
"""
import contextlib
import os
from typing import Iterator, Optional

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"


def _status_mib(field: str) -> Optional[float]:
    try:
        with open(STATUS, encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024   # kB
    except OSError:
        pass
    return None


def rss_mib() -> Optional[float]:
    """This process's resident set size now (VmRSS), MiB."""
    return _status_mib("VmRSS")


def peak_mib() -> Optional[float]:
    """This process's peak resident set size since it started or since the last `reset_peak` (VmHWM), MiB."""
    return _status_mib("VmHWM")


def counter_slack_mib() -> float:
    """How far two readings of VmRSS / VmHWM may disagree although no page moved, MiB.

    Since Linux 6.2 the kernel keeps a process's three RSS counters (file, anon, shmem) as per-CPU counters and
    /proc reads their approximate sum: each may be off by up to `max(32, 2 * cpus)` pages per CPU. So a VmRSS read
    once a model is built can exceed the VmHWM read later by a fraction of a MiB (seen: 0.18 MiB on 2 cores). Two
    approximate readings, three counters each: twice that bound.
    """
    cpus = os.cpu_count() or 1
    return 2 * 3 * cpus * max(32, 2 * cpus) * 4096 / 2**20


def reset_peak() -> bool:
    """Set the peak to the current resident size; False where the kernel does not allow it."""
    try:
        with open(CLEAR_REFS, "w", encoding="ascii") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


class Peak:
    """What `peak_of` measured: `mib` (None where /proc is missing), `since_start` (True where the peak could not
    be reset, so it is the process's since it started)."""
    mib: Optional[float] = None
    since_start: bool = False


@contextlib.contextmanager
def peak_of() -> Iterator[Peak]:
    """The peak resident size of the block, set on the yielded Peak when the block ends (or raises)."""
    peak = Peak()
    peak.since_start = not reset_peak()
    try:
        yield peak
    finally:
        peak.mib = peak_mib()
