"""One run, one work dir: each step's artifact lives in its own sub-directory with a `step.json`
recording the configuration (fingerprint) that made it.

A rerun skips a step whose artifact exists with the same fingerprint, so a killed run resumes
at the first unfinished step. An artifact made by another configuration is never overwritten
silently: the run stops and names the settings that differ (`--overwrite` replaces it).
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Callable, Optional

from xtremedistil_tf.errors import ConfigError, WorkDirError
from xtremedistil_tf.io import atomic_dir, atomic_write_json, read_json

# errno values that mean the work dir could not be written (disk or quota full, read-only, no permission).
WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}

log = logging.getLogger(__name__)
STEP_FILE = "step.json"


def fingerprint_hash(fingerprint: dict) -> str:
    blob = json.dumps(fingerprint, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


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
    def __init__(self, root, overwrite: bool = False):
        self.root = Path(root)
        self.overwrite = overwrite
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.root / name

    def is_done(self, name: str, fingerprint: dict) -> bool:
        """True if step `name` finished with this fingerprint; raises if another config made it."""
        step_file = self.path(name) / STEP_FILE
        if not step_file.exists():
            return False
        stored = read_json(step_file)
        if stored.get("hash") == fingerprint_hash(fingerprint):
            return True
        if self.overwrite:
            shutil.rmtree(self.path(name))
            return False
        diffs = _differences(stored.get("fingerprint", {}), json.loads(json.dumps(fingerprint, default=str)))
        raise ConfigError(
            f"{self.path(name)} was made by another configuration ({'; '.join(diffs[:6]) or 'unknown'}); "
            "use a new --work_dir, or pass --overwrite to replace it and every later step")

    def run_step(self, name: str, fingerprint: dict, build: Callable[[Path], Optional[dict]]) -> Path:
        """Build step `name` into a temporary dir and rename it into place, unless already done.

        `build(tmp_dir)` writes the artifact; its returned dict (if any) is stored in step.json.
        """
        if self.is_done(name, fingerprint):
            log.info("step %s: done already (%s), skipped", name, self.path(name))
            return self.path(name)
        log.info("step %s: running", name)
        try:
            with atomic_dir(self.path(name)) as tmp:
                info = build(tmp) or {}
                atomic_write_json(tmp / STEP_FILE, {"hash": fingerprint_hash(fingerprint),
                                                    "fingerprint": fingerprint, "info": info})
        except OSError as e:  # a full disk, a read-only dir: atomic_dir has removed the half-written step
            if e.errno not in WRITE_ERRORS:
                raise  # e.g. transformers' OSError for a model it cannot find: not the work dir's fault
            where = f" ({e.filename})" if e.filename else ""
            raise WorkDirError(f"step {name} failed: {e.strerror or e}{where}; nothing of it was kept in "
                               f"{self.path(name)} (rerun the same command once fixed)") from e
        return self.path(name)

    def mark_done(self, name: str, fingerprint: dict, info: Optional[dict] = None) -> None:
        """For steps that manage their own resumable output in place (the teacher-output cache)."""
        atomic_write_json(self.path(name) / STEP_FILE, {"hash": fingerprint_hash(fingerprint),
                                                        "fingerprint": fingerprint, "info": info or {}})

    def step_info(self, name: str) -> dict:
        return read_json(self.path(name) / STEP_FILE).get("info", {})
