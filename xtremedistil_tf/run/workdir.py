"""One run, one work dir: each step's artifact lives in its own sub-directory with a `step.json`
recording the configuration (fingerprint) that made it.

A rerun skips a step whose artifact exists with the same fingerprint, so a killed run resumes
at the first unfinished step. An artifact made by another configuration is never overwritten
silently: the run stops and names the settings that differ (`--overwrite` replaces it, but only
once the new artifact is complete: until then the old one stays in place).

A step that reads input files (the data step) puts their content in its fingerprint: step.json
keeps each file's size, mtime and SHA-256, the size and mtime are the fast check on a rerun, and
the file is hashed again only when they differ, so an edited file is refused like a changed flag.
An input that is a stream (a FIFO, a process substitution) is read into a regular file first and
stamped with the hash of what was read (`read_streams`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

from xtremedistil_tf.errors import ConfigError, TrainingDiverged, WorkDirError
from xtremedistil_tf.io import WRITE_ERRORS, atomic_dir, atomic_write_json, file_sha256, read_json, say_if_blocking


# How TensorFlow's own writes (checkpoints, SavedModels) report those errnos: a tf.errors class
# (ResourceExhaustedError for ENOSPC and EDQUOT, OutOfRangeError for EFBIG, ...) whose message
# ends with the strerror text.
WRITE_ERROR_TEXTS = tuple(os.strerror(code) for code in sorted(WRITE_ERRORS))

log = logging.getLogger(__name__)


def write_error_reason(error: BaseException) -> Optional[str]:
    """'<strerror> (<file>)' when `error` means the work dir could not be written, from Python
    (OSError), from a Rust library (its "(os error N)") or from TensorFlow (an OpError naming the errno's
    text); None for any other error."""
    if isinstance(error, OSError):
        if error.errno not in WRITE_ERRORS:
            return None
        return f"{error.strerror or error}" + (f" ({error.filename})" if error.filename else "")
    rust = re.search(r"\(os error (\d+)\)", str(error))   # a Rust library's I/O error (safetensors, tokenizers)
    if rust and int(rust.group(1)) in WRITE_ERRORS:
        written = getattr(error, "filename", None)   # io.name_the_file: the file the step was writing
        return os.strerror(int(rust.group(1))) + (f" ({written})" if written else "")
    if type(error).__module__.startswith("tensorflow"):
        message = getattr(error, "message", str(error))
        text = next((t for t in WRITE_ERROR_TEXTS if t in message), None)
        if text is not None:
            where = re.search(r"(/[^\s;]+)[;:]?\s*" + re.escape(text), message)
            return text + (f" ({where.group(1)})" if where else "")
    return None


def step_error(name: str, error: BaseException, where) -> Optional[WorkDirError]:
    """The one-line error for an OSError that leaves step `name`, naming the step and a path (the
    error's own file, else `where`, the step's artifact); None for an error that is not a system
    OSError (e.g. transformers' OSError for a model it cannot find, which names what it means)."""
    reason = write_error_reason(error)
    if reason is not None:
        return WorkDirError(f"step {name} failed: {reason if getattr(error, 'filename', None) else f'{reason} ({where})'}")
    if isinstance(error, OSError) and error.errno is not None:
        return WorkDirError(f"step {name} failed: {error.filename or where}: {error.strerror or error}")
    return None


@contextlib.contextmanager
def naming_step(name: str, where) -> Iterator[None]:
    """Turn a system OSError raised inside into `step_error`'s one line (others pass as they are)."""
    try:
        yield
    except OSError as e:
        failed = step_error(name, e, where)
        if failed is None:
            raise
        raise failed from e


STEP_FILE = "step.json"


def fingerprint_hash(fingerprint: dict) -> str:
    blob = json.dumps(fingerprint, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


INPUTS = "inputs"   # the fingerprint key of a step's input files: {path: sha256}


def stamp_files(files: Dict[str, str], known: Optional[dict] = None) -> dict:
    """{path: {"flag", "size", "mtime_ns", "sha256"}} of each regular file in `files` ({path: the
    flag that named it}); a file whose size and mtime equal its stamp in `known` keeps that
    stamp's hash unread. Paths that are not regular files are left to the readers to report."""
    stamps = {}
    for path, flag in files.items():
        try:
            stat = os.stat(path)
        except OSError:
            continue
        if not os.path.isfile(path):
            continue
        old = (known or {}).get(path, {})
        same = old.get("size") == stat.st_size and old.get("mtime_ns") == stat.st_mtime_ns and old.get("sha256")
        stamps[path] = {"flag": flag, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                        "sha256": old["sha256"] if same else file_sha256(path)}
    return stamps


def is_stream(path) -> bool:
    """Whether `path` exists and is neither a regular file nor a directory: a FIFO, a shell's
    process substitution (/dev/fd/N), a device. It can be read once, and has no size or mtime
    that says whether its content changed."""
    return os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)


@contextlib.contextmanager
def read_streams(files: Dict[str, str], directory) -> Iterator[tuple]:
    """Read each input of `files` ({path: flag}) that is a stream (`is_stream`) into a regular
    file under `directory`, hashing what was read; yields ({path: its copy}, {path: stamp}), the
    stamps as stamp_files' without an mtime. `directory` is removed on any exit (a Ctrl-C or
    SIGTERM while a FIFO waits for its writer included)."""
    directory = Path(directory)
    shutil.rmtree(directory, ignore_errors=True)
    copies, stamps = {}, {}
    try:
        for index, (path, flag) in enumerate(sorted(files.items())):
            if not is_stream(path):
                continue
            directory.mkdir(parents=True, exist_ok=True)
            copy = directory / f"{index}-{Path(path).name}"
            say_if_blocking(path)
            digest, size = hashlib.sha256(), 0
            with open(path, "rb") as source, open(copy, "wb") as target:
                for block in iter(lambda: source.read(1 << 20), b""):
                    digest.update(block)
                    size += len(block)
                    target.write(block)
            copies[path] = str(copy.absolute())   # absolute: --data_dir is not put before it
            stamps[path] = {"flag": flag, "size": size, "sha256": digest.hexdigest(), "stream": True}
        yield copies, stamps
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def with_inputs(fingerprint: dict, stamps: dict) -> dict:
    """`fingerprint` plus the content of the step's input files (left out when there are none,
    so a run that reads no files keeps the fingerprint it had before files were fingerprinted)."""
    if not stamps:
        return fingerprint
    return {**fingerprint, INPUTS: {path: stamp["sha256"] for path, stamp in sorted(stamps.items())}}


def _changed_inputs(stored: dict, stored_stamps: dict, new: dict, new_stamps: dict) -> list:
    """One phrase per input file whose content differs from what the step read."""
    out = []
    for path in sorted(set(stored) | set(new)):
        if stored.get(path) == new.get(path):
            continue
        flag = (new_stamps.get(path) or stored_stamps.get(path) or {}).get("flag", "input file")
        if path not in new:
            out.append(f"{path} ({flag}) {_not_read_now(path)}")
        elif path not in stored:
            out.append(f"{path} ({flag}) was not read by the step in the work dir")
        else:
            was = stored_stamps.get(path, {}).get("size")
            sizes = f"{was} bytes then, {new_stamps[path]['size']} now" if was is not None else "content differs"
            out.append(f"{path} ({flag}) changed since the step read it ({sizes})")
    return out


def _not_read_now(path: str) -> str:
    """Why a file the step read is not among the inputs now: gone, unreadable, no longer a
    regular file, or (still there) no longer named by the flags."""
    if not os.path.lexists(path):
        return "is gone since the step read it"
    if not os.access(path, os.R_OK):
        return "cannot be read now (permissions)"
    if not os.path.isfile(path):
        return "is no longer a regular file"
    return "is no longer an input (the flags name other files now)"


def _differences(old: dict, new: dict, prefix: str = "") -> list:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} in the work dir, {b!r} now")
    return out


class WorkDir:
    def __init__(self, root, overwrite: bool = False, elsewhere: Optional[Dict[str, Path]] = None):
        self.root = Path(root)
        self.overwrite = overwrite
        self.replaced: list = []   # steps whose earlier artifact this run replaced (--overwrite)
        # Steps kept outside root ({name: dir}): a multi-worker run's other workers read and write the
        # chief's teacher-output caches.
        self.elsewhere = {name: Path(path) for name, path in (elsewhere or {}).items()}
        # Steps run_step may not build, each with the command that builds it (--transfer_only: data, teacher, rewrite).
        self.must_be_done: Dict[str, str] = {}
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.elsewhere.get(name, self.root / name)

    def stored(self, name: str) -> dict:
        """Step `name`'s step.json ({} when the step has not finished)."""
        step_file = self.path(name) / STEP_FILE
        return read_json(step_file) if step_file.exists() else {}

    def input_stamps(self, name: str, files: Dict[str, str]) -> dict:
        """stamp_files of step `name`'s input files, against the stamps its step.json keeps."""
        return stamp_files(files, self.stored(name).get(INPUTS))

    def is_done(self, name: str, fingerprint: dict, stamps: Optional[dict] = None,
                hint: Optional[Callable[[list], str]] = None) -> bool:
        """True if step `name` finished with this fingerprint; raises if another config made it (`hint`:
        the differences named -> more words for that refusal).

        With --overwrite a step of another config is not done, but its artifact stays in place
        until the new one is complete (run_step swaps it in)."""
        stored = self.stored(name)
        if not stored:
            return False
        if stored.get("hash") == fingerprint_hash(fingerprint):
            if stamps and stamps != stored.get(INPUTS):   # touched, same content: refresh the fast check
                atomic_write_json(self.path(name) / STEP_FILE, {**stored, INPUTS: stamps})
            return True
        legacy = {k: v for k, v in fingerprint.items() if k != INPUTS}
        if INPUTS not in stored.get("fingerprint", {}) and stored.get("hash") == fingerprint_hash(legacy):
            log.warning("step %s: made before input files were fingerprinted; their content is not checked "
                        "(--overwrite redoes it)", name)
            return True
        if self.overwrite:
            return False
        old = stored.get("fingerprint", {})
        changed = _changed_inputs(old.get(INPUTS, {}), stored.get(INPUTS, {}), fingerprint.get(INPUTS, {}),
                                  stamps or {})
        diffs = changed + _differences({k: v for k, v in old.items() if k != INPUTS},
                                       json.loads(json.dumps(legacy, default=str)))
        what = "was made from other input files" if changed else "was made by another configuration"
        # A work dir made before --word_split read the data's own tokens: --word_split=none reads them again.
        split = ("; --word_split=none keeps the data's own tokens, as it was made" if any(
            d.startswith("data.word_split: None") for d in diffs) else "")
        raise ConfigError(
            f"{self.path(name)} {what} ({'; '.join(diffs[:6]) or 'unknown'}); "
            f"use a new --work_dir, or pass --overwrite to replace it and every later step{split}"
            f"{hint(diffs) if hint else ''}")

    def run_step(self, name: str, fingerprint: dict, build: Callable[[Path], Optional[dict]],
                 stamps: Optional[dict] = None, hint: Optional[Callable[[list], str]] = None) -> Path:
        """Build step `name` into a temporary dir and rename it into place, unless already done.

        `build(tmp_dir)` writes the artifact; its returned dict (if any) is stored in step.json.
        `stamps` (stamp_files of the step's input files) are kept there for the next run's fast check.
        """
        if self.is_done(name, fingerprint, stamps, hint):
            log.info("step %s: done already (%s), skipped", name, self.path(name))
            return self.path(name)
        if name in self.must_be_done:
            raise ConfigError(f"step {name} is not done in {self.root} with these settings; run it first "
                              f"({self.must_be_done[name]})")
        log.info("step %s: running", name)
        existed = self.path(name).exists()
        try:
            with atomic_dir(self.path(name)) as tmp:
                info = build(tmp) or {}
                record = {"hash": fingerprint_hash(fingerprint), "fingerprint": fingerprint, "info": info}
                if stamps:
                    record[INPUTS] = stamps
                atomic_write_json(tmp / STEP_FILE, record)
        except TrainingDiverged as e:   # the engine knows the model; the step is this one
            e.step = e.step or name
            raise
        except Exception as e:  # a full disk, a read-only dir: atomic_dir has removed the half-written step
            reason = write_error_reason(e)
            if reason is None:
                failed = step_error(name, e, self.path(name))   # e.g. an input that cannot be read
                if failed is None:
                    raise  # e.g. transformers' OSError for a model it cannot find: not the work dir's fault
                raise failed from e
            raise WorkDirError(f"step {name} failed: {reason}; nothing of it was kept in "
                               f"{self.path(name)} (rerun the same command once fixed)") from e
        if existed:
            self.replaced.append(name)
        return self.path(name)

    def mark_done(self, name: str, fingerprint: dict, info: Optional[dict] = None) -> None:
        """For steps that manage their own resumable output in place (the teacher-output cache)."""
        if self.stored(name).get("hash") not in (None, fingerprint_hash(fingerprint)):
            self.replaced.append(name)
        atomic_write_json(self.path(name) / STEP_FILE, {"hash": fingerprint_hash(fingerprint),
                                                        "fingerprint": fingerprint, "info": info or {}})

    def refingerprint(self, name: str, fingerprint: dict) -> None:
        """Record finished step `name` under `fingerprint` (its artifact and info as they are): for a step whose
        fingerprint came to leave out a setting that never changed what it makes."""
        stored = self.stored(name)
        atomic_write_json(self.path(name) / STEP_FILE,
                          {**stored, "hash": fingerprint_hash(fingerprint), "fingerprint": fingerprint})

    def add_info(self, name: str, info: dict) -> None:
        """Merge `info` into the recorded info of finished step `name`; its fingerprint stays as it is."""
        stored = self.stored(name)
        atomic_write_json(self.path(name) / STEP_FILE, {**stored, "info": {**stored["info"], **info}})

    def step_info(self, name: str) -> dict:
        return read_json(self.path(name) / STEP_FILE).get("info", {})
