"""Damaged or missing model files, named in one line: what every loader of a saved artifact (a student, a
teacher, an export) wraps its loading in (`reading`).

Disks fill and copies get cut short; TensorFlow then fails deep in its readers ("Read less bytes than
requested", "not an sstable (bad magic number)", "No such file or directory" on a variables shard), and
transformers or numpy in theirs, none of them saying which file of the artifact is at fault. When a load
fails, `find_damage` looks at the directory's files, each by what its format guarantees (a missing file
the error names; an empty file; JSON that does not parse; a SavedModel protocol buffer that does not
parse or names assets that are gone; a variables index that is no table; a variables shard whose
tensors cannot be read back, TensorFlow checking each one's CRC; a safetensors file shorter than its
header says; an npz archive that is no zip), and the error becomes `DamagedArtifact`: the file, what is
wrong with it and what to do. A failure no damaged file explains is left as it is (a bug: a traceback).
Nothing is checked while loads succeed, so a healthy artifact costs nothing. `--verbose` shows the
original traceback (the DamagedArtifact is raised from it).
"""
from __future__ import annotations

import contextlib
import json
import re
import zipfile
from pathlib import Path
from typing import Iterator, Optional, Tuple

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from xtremedistil_tf import stop
from xtremedistil_tf.errors import DamagedArtifact, XtremeDistilError

# What to do, by what the artifact is: a work dir's teacher or student is made again by its step, an export by
# bin/export.
RETRAIN = "make it again: rerun bin/train with --overwrite (or in a new --work_dir)"
REEXPORT = "export it again: bin/export with --overwrite"


@contextlib.contextmanager
def reading(directory, remedy: str) -> Iterator[None]:
    """Load from `directory` inside; an error that a damaged or missing file of it explains becomes a
    DamagedArtifact naming the file, what is wrong and `remedy`. Errors of ours (already one line) and
    a stop signal's interrupt pass unchanged."""
    try:
        yield
    except XtremeDistilError:
        raise
    except Exception as error:
        if stop.received() is not None:
            raise
        found = find_damage(directory, error)
        if found is None:
            raise
        path, problem = found
        raise DamagedArtifact(f"{path}: {problem}; {remedy}") from error


def find_damage(directory, error: Optional[BaseException] = None) -> Optional[Tuple[Path, str]]:
    """(file, what is wrong with it) of the first damaged or missing file of `directory` (a file the
    `error` names that is not there, then the directory's own files in name order); None when all read."""
    directory = Path(directory)
    missing = _missing_named(directory, error)
    if missing is not None:
        return missing, "missing"
    if not directory.exists():
        return directory, "missing"
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        problem = _problem(path)
        if problem is not None:
            return problem
    return None


def _missing_named(directory: Path, error: Optional[BaseException]) -> Optional[Path]:
    """A path under `directory` that the error's message (or its OSError filename) names and that is not there."""
    if error is None:
        return None
    text = f"{getattr(error, 'filename', '') or ''} {getattr(error, 'message', '')} {error}"
    root = str(directory.absolute())
    for match in re.finditer(re.escape(root) + r"[^\s;:'\"\],)]*", text):
        path = Path(match.group(0).rstrip("."))
        if not path.exists():
            return path
    return None


def _problem(path: Path) -> Optional[Tuple[Path, str]]:
    """(the damaged file, what is wrong) for a file whose format says it is damaged, else None."""
    size = path.stat().st_size
    name = path.name
    if size == 0 and not name.startswith("."):
        return path, "empty (0 bytes)"
    try:
        if name.endswith(".json"):
            json.loads(path.read_text(encoding="utf-8"))
        elif name == "saved_model.pb":
            return _saved_model_problem(path)
        elif name.endswith(".index") and path.parent.name == "variables":
            return _variables_problem(path)
        elif name.endswith(".safetensors"):
            return _safetensors_problem(path, size)
        elif name.endswith(".npz"):
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            if bad is not None:
                return path, f"damaged (its member {bad} fails its CRC)"
    except (ValueError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        return path, f"damaged or cut short ({size} bytes: {_first_line(e)})"
    return None


def _saved_model_problem(path: Path) -> Optional[Tuple[Path, str]]:
    model = saved_model_pb2.SavedModel()
    try:
        model.ParseFromString(path.read_bytes())
    except Exception as e:  # noqa: BLE001  (protobuf's DecodeError, or a RuntimeWarning-turned error)
        return path, f"damaged or cut short (not a SavedModel protocol buffer: {_first_line(e)})"
    for graph in model.meta_graphs:
        for asset in graph.asset_file_def:
            asset_path = path.parent / "assets" / asset.filename
            if not asset_path.exists():
                return asset_path, "missing"
    return None


def _variables_problem(index: Path) -> Optional[Tuple[Path, str]]:
    """The variables index, or one of its data shards, whose tensors cannot be read back."""
    prefix = index.with_suffix("")
    try:
        reader = tf.train.load_checkpoint(str(prefix))
    except Exception as e:  # noqa: BLE001  (TF's reader errors: any means the index cannot be read)
        return _variables_shard(prefix, e) or (index, f"damaged or cut short ({_first_line(e)})")
    for key in sorted(reader.get_variable_to_dtype_map()):
        try:
            reader.get_tensor(key)
        except Exception as e:  # noqa: BLE001  (IndexError "Read less bytes than requested", DataLossError, ...)
            shard = _variables_shard(prefix, e)
            if shard is not None:
                return shard
            shards = sorted(prefix.parent.glob(prefix.name + ".data-*"))
            where = shards[0] if len(shards) == 1 else prefix.parent / (prefix.name + ".data-*")
            return where, f"damaged or cut short ({_first_line(e)})"
    return None


def _variables_shard(prefix: Path, error: BaseException) -> Optional[Tuple[Path, str]]:
    """A data shard of `prefix` that is missing (the reader names it), else None."""
    missing = _missing_named(prefix.parent, error)
    if missing is not None:
        return missing, "missing"
    for shard in _expected_shards(prefix):
        if not shard.exists():
            return shard, "missing"
    return None


def _expected_shards(prefix: Path):
    """The data shards the checkpoint's name pattern implies (<prefix>.data-0000i-of-0000N)."""
    found = sorted(prefix.parent.glob(prefix.name + ".data-*-of-*"))
    if not found:
        return [prefix.parent / f"{prefix.name}.data-00000-of-00001"]
    count = int(found[0].name.rsplit("-of-", 1)[1])
    return [prefix.parent / f"{prefix.name}.data-{i:05d}-of-{count:05d}" for i in range(count)]


def _safetensors_problem(path: Path, size: int) -> Optional[Tuple[Path, str]]:
    """A safetensors file is an 8-byte header length, a JSON header of each tensor's byte range, the bytes."""
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 0 or 8 + length > size:
            return path, f"damaged or cut short ({size} bytes: no complete safetensors header)"
        header = json.loads(f.read(length))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end > size:
        return path, f"cut short ({size} bytes; its header describes {8 + length + end})"
    return None


def _first_line(error: BaseException) -> str:
    text = getattr(error, "message", None) or str(error) or type(error).__name__
    return " ".join(text.split())[:200]
