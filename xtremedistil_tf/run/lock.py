"""One run per work dir: an exclusive fcntl lock on <work_dir>/.lock for as long as the run lasts.

The kernel drops the lock when its process dies, however it dies, so a killed run leaves a
.lock file that blocks nobody; the file holds the holder's pid only to name it in the error.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

from xtremedistil_tf.errors import ConfigError

LOCK_FILE = ".lock"


@contextlib.contextmanager
def work_dir_lock(work_dir, shared: bool = False, name: str = LOCK_FILE) -> Iterator[Path]:
    """Hold the lock of `work_dir` (created if need be); ConfigError at once if another process holds it.
    `shared`: a lock that other shared holders may hold too, but no exclusive one (the teacher-output
    workers of --transfer_only share the work dir; a full run waits for none of them). `name`: another
    lock file (one per worker, so that a worker's command does not run twice at once)."""
    path = Path(work_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise ConfigError(f"--work_dir={work_dir} is in use by another run (process {holder} holds {path}); "
                              "wait for it to finish or stop it, or use another --work_dir") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:   # a full disk from the start: name the file, not only the errno
            raise ConfigError(f"--work_dir={work_dir} cannot be written: {path}: {e.strerror or e}") from None
        yield path
    finally:
        os.close(fd)   # releases the lock; the file stays (removing it would race with a waiting run)


@contextlib.contextmanager
def reading_lock(work_dir, doing: str) -> Iterator[None]:
    """While a command reads a run's artifacts (bin/export `doing` "exporting"): a shared lock on the work dir's
    existing lock file, so that no bin/train starts in it meanwhile; a ConfigError at once, naming the run's
    process, while one runs there. Nothing is created: a work dir without a lock file had no run to wait for."""
    path = Path(work_dir) / LOCK_FILE if work_dir else None
    if path is None or not path.is_file():
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise ConfigError(f"--work_dir={work_dir} is in use by a run (process {holder} holds {path}): wait for "
                              f"it to finish before {doing} (bin/train --overwrite would destroy the run in "
                              "progress)") from None
        yield
    finally:
        os.close(fd)
