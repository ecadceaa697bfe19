"""Atomic writes: an artifact appears complete under its final name or not at all.

A run killed mid-write leaves only a `.tmp` sibling, which the next write replaces. A rename is
made durable by syncing its directory too (`fsync_dir`), so after a power loss the name never
points at missing data.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import sys
import zlib
from pathlib import Path
from typing import Iterator, List, Sequence

from xtremedistil_tf import stop
from xtremedistil_tf.errors import ConfigError

# errno values that mean a file could not be written (disk or quota full, read-only, no permission).
WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


@contextlib.contextmanager
def atomic_dir(directory) -> Iterator[Path]:
    """Yield a temporary sibling dir to fill; on success it replaces `directory` in one rename.

    A build that a stop signal reached (Ctrl-C, SIGTERM: stop.py) is never committed, even if it
    returned (the interrupt may have been turned into another error and swallowed on the way); the
    clean-up and the renames are not cut short by a signal (`stop.deferred`)."""
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        stop.raise_if_interrupted()
    except BaseException as error:
        with stop.deferred():
            name_the_file(error, last_written(tmp))
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    with stop.deferred():
        if final.exists():
            # Directories cannot be swapped atomically; move the old one aside first so that a
            # kill between the two renames leaves the old artifact recoverable, never a mix.
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)


def name_the_file(error: BaseException, path) -> None:
    """A write error that names no file (a full disk inside a library's write: numpy's, zipfile's, json's,
    safetensors') gets `path`, the file the write was filling, as its `filename`, so that the one-line error says
    which file could not be written (run.workdir.write_error_reason)."""
    if path is None or getattr(error, "filename", None):
        return
    if isinstance(error, OSError) and error.errno not in WRITE_ERRORS:   # e.g. a read: not about what was written
        return
    try:
        error.filename = str(path)   # an OSError's own field; other errors (a Rust library's I/O error) get one
    except (AttributeError, TypeError):
        pass


def last_written(directory):
    """The file or directory under `directory` written last (a file a library removed when its write failed leaves
    its directory's mtime as the last write); None if it is empty."""
    return max(Path(directory).rglob("*"), key=lambda p: p.lstat().st_mtime_ns, default=None)


def atomic_write_text(path, text: str, own_tmp: bool = False) -> None:
    """`own_tmp`: the temporary file is named for this process (`<name>.<pid>-<random>.tmp`), so
    processes that may write the same file at once (workers sharing a cache dir) never write
    into one temporary file; the last rename wins. A failed or interrupted write leaves no
    temporary file."""
    with atomic_output(path, own_tmp) as f:
        f.write(text)


def fsync_file(path) -> None:
    """Flush a file to disk so a rename after a power loss never points at missing data."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path) -> None:
    """Persist a rename in `path` (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_blocks(path):
    """A file's bytes in blocks of 1 MiB."""
    with open(path, "rb") as f:
        yield from iter(lambda: f.read(1 << 20), b"")


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    for block in read_blocks(path):
        digest.update(block)
    return digest.hexdigest()


def file_crc32(path) -> int:
    """zlib's CRC-32 of a file: a quarter of SHA-256's time (about 1 s per GB here); it finds damage, not tampering."""
    crc = 0
    for block in read_blocks(path):
        crc = zlib.crc32(block, crc)
    return crc


def finite_json(obj):
    """`obj` with every NaN or infinite float replaced by None: JSON has no NaN (Python's
    json module would write a bare `NaN`, which other JSON readers refuse)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite_json(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(value) for value in obj]
    return obj


def atomic_write_json(path, obj, own_tmp: bool = False) -> None:
    """Write `obj` as JSON; a NaN or infinite float is written as null (`finite_json`), never as
    the bare NaN/Infinity that is not JSON. `own_tmp`: as for atomic_write_text."""
    atomic_write_text(path, json.dumps(finite_json(obj), indent=2, sort_keys=True, ensure_ascii=False,
                                       allow_nan=False) + "\n", own_tmp)


def dir_size(path, skip: Sequence[str] = ()) -> int:
    """Bytes of the files under `path`, leaving out those under a directory named in `skip`."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not set(skip) & set(p.parts))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    """The lines of a markdown table: the header, its rule, a line per row of (already formatted) cells."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def read_json(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def say_if_blocking(path) -> None:
    """Print "reading <path>" on stderr when reading `path` may wait for a writer (a FIFO, a
    device: anything but a regular file or a directory), so a command that blocks says on what;
    a FIFO (a named pipe, a shell's process substitution) adds "(waiting for a writer)"."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        fifo = " (waiting for a writer)" if path.is_fifo() else ""
        print(f"reading {path}{fifo}", file=sys.stderr, flush=True)


# Free space an output file needs at the least: less than this and a write of any size is bound to fail.
MIN_FREE_BYTES = 1 << 20


def check_output_file(path, flag: str) -> Path:
    """Refuse at once, before any work, a file that a command will write (atomically: `<path>.tmp` and then a
    rename) where it cannot be written: a directory, a path under a regular file, a directory the process cannot
    create files in (tried with a file created and removed at once, which root's permissions and a read-only mount
    both answer truly), or a file system with less than MIN_FREE_BYTES free. `flag` names it in the error line
    ("--output=x.txt"). Missing directories above it are left to the write, which creates them."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} is a directory; expected the path of a file to write")
    existing = next(p for p in path.absolute().parents if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"{flag}: {existing} is a file, not a directory; expected a path in a writable directory")
    probe = existing / f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.check"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as error:
        raise ConfigError(f"{flag}: {existing} cannot be written ({error.strerror}); expected a writable "
                          "directory") from None
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(f"{flag}: {existing} has {free:,} bytes free; expected at least {MIN_FREE_BYTES:,}")
    return path


@contextlib.contextmanager
def atomic_output(path, own_tmp: bool = False) -> Iterator:
    """A text file to write or stream into (UTF-8) that appears under `path` complete, or not at all: written as
    `<path>.tmp` (`own_tmp`: as atomic_write_text names it), synced and renamed when the block ends without an
    error; a failed or interrupted write leaves `path` as it was and no temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp" if own_tmp else path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        with stop.deferred():
            os.replace(tmp, path)
    except BaseException as error:
        name_the_file(error, path)
        with stop.deferred():
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
