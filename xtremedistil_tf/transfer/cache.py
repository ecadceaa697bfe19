"""Sharded on-disk cache of per-example arrays (teacher outputs over a transfer set).

The teacher runs once over the transfer set; its outputs (ids, mask, logits, hidden
states, k-best paths, ...) are written here as TFRecord shards and streamed back with
``tf.data`` so the set never has to fit in RAM. This module knows nothing about BERT:
it stores whatever ``compute_batch`` returns.

Layout of ``out_dir`` (see docs/cache.md):

* ``shard-SSSSS-of-NNNNN.tfrecord``: examples ``[s*shard_size, min((s+1)*shard_size, n))``.
  One ``tf.train.Example`` per example, one bytes feature per key holding the raw
  little-endian C-order array (plus ``key/scale`` or ``key/index`` and ``key/rest`` for an
  int8 or top-k key). A ragged key (one with a sequence axis) is stored at the example's real
  length (from ``attention_mask``), not padded. Written to ``<name>.tmp`` and renamed with
  ``os.replace`` when complete, so a shard file that exists is always whole.
* ``cache_state.json``: written before the first shard; fingerprint, spec and feature
  shapes of the run in progress, so a rerun can tell whether the shards are its own.
* ``manifest.json``: written last, atomically; its presence means the cache is complete.

Several workers can write one cache together (``worker_part``, or ``part=`` of
``write_sharded``): worker w of W writes the shards s with s % W == w into the shared directory,
and whichever finds every shard there writes the manifest (see ``write_sharded``).

Why raw bytes + shapes in the manifest rather than ``tf.io.serialize_tensor``: reading
back is ``tf.io.decode_raw`` (a memcpy) plus a reshape to a shape known when the graph
is built (all but the sequence axis of a ragged key), so every tensor gets a static shape for free; ``parse_tensor`` would decode a
TensorProto per value and return an unknown shape, and it cannot skip the proto header.
(Parsing records in batches with ``tf.io.parse_example`` then unbatching measured no faster
here: reading the records dominates, so the simpler per-example parse is used.)
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Optional

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf import stop
from xtremedistil_tf.damage import reading
from xtremedistil_tf.io import atomic_write_json, file_crc32, fsync_dir, fsync_file

MANIFEST = "manifest.json"
STATE = "cache_state.json"
FORMAT = "xtremedistil_tf.sharded_cache"
# 2: ragged keys at their real length, int8 and top-k encodings (issue 30). 1: every window padded.
FORMAT_VERSION = 2
_SHARD_RE = re.compile(r"^shard-(\d{5})-of-(\d{5})\.tfrecord$")
# Types tf.io.decode_raw can produce, so anything written can be read back.
_STORABLE = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
             "float16", "float32", "float64"}

# Encodings a float key can be stored with besides a plain cast (``encodings=``, docs/cache.md):
INT8 = "int8"      # symmetric int8, one float32 scale max|x|/127 per row (every axis but the last)
TOPK = "top"       # "top<K>": the K largest values of the last axis, their indices and the rest's log-sum-exp
SCALE, INDEX, REST = "/scale", "/index", "/rest"   # the extra bytes features of an encoded key
# compute_batch(rows): {key: array with one row per index of `rows` (int64, ascending within a shard unless
# `lengths` groups them by length)}.
ComputeBatch = Callable[[np.ndarray], Mapping[str, np.ndarray]]
log = logging.getLogger(__name__)
POLL_SECONDS = 0.5      # how often a worker looks again while it waits for the others
WAIT_LOG_SECONDS = 60   # how often it says what it waits for


class Part(NamedTuple):
    """The share of a cache one of several workers writes: the shards s with s % count == index."""
    index: int = 0
    count: int = 1

    def owns(self, shard: int) -> bool:
        return shard % self.count == self.index


class _DefaultPart(threading.local):
    part = Part()   # what write_sharded writes when not told: worker_part sets it, for its thread only


_DEFAULT = _DefaultPart()


def _check_part(part) -> Part:
    index, count = (int(v) for v in part)
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"worker {index} of {count}: expected 0 <= index < count")
    return Part(index, count)


@contextlib.contextmanager
def worker_part(index: int, count: int) -> Iterator[Part]:
    """Inside, every ``write_sharded`` call of this thread (so every writer of transfer/, which take
    no worker arguments) writes only worker ``index`` of ``count``'s shards, then waits for the others."""
    part = _check_part((index, count))
    previous, _DEFAULT.part = _DEFAULT.part, part
    try:
        yield part
    finally:
        _DEFAULT.part = previous


def shard_name(index: int, num_shards: int) -> str:
    """File name of shard ``index`` (0-based) of ``num_shards``."""
    return f"shard-{index:05d}-of-{num_shards:05d}.tfrecord"


def _normalize_json(value: dict) -> dict:
    """JSON round trip, so tuples vs lists or int keys compare equal to what was stored."""
    try:
        return json.loads(json.dumps(value, sort_keys=True))
    except TypeError as exc:
        raise ConfigError(f"cache fingerprint must be JSON-serializable: {exc}") from exc


def _describe_diff(old: dict, new: dict) -> str:
    """One line per key whose values differ (missing on one side counts): ``key: on disk X, requested Y``."""
    old_value, new_value = (lambda k: old.get(k, "<missing>")), (lambda k: new.get(k, "<missing>"))
    return "\n".join(f"  {key}: on disk {json.dumps(old_value(key))[:200]}, requested {json.dumps(new_value(key))[:200]}"
                     for key in sorted(set(old) | set(new)) if old_value(key) != new_value(key))


def _identity(fingerprint: dict, spec: dict) -> dict:
    """What must match for existing shards to be reused: the caller's fingerprint plus the
    layout (shard boundaries and stored dtypes change the bytes of every shard)."""
    return {"fingerprint": fingerprint, "spec": spec}


def _check_same_run(out_dir: Path, stored: dict, requested: dict, source: str) -> None:
    """Raise ConfigError naming the differing keys if ``stored`` is another run's identity."""
    if stored == requested:
        return
    old = {**{f"fingerprint.{k}": v for k, v in stored.get("fingerprint", {}).items()},
           **{f"spec.{k}": v for k, v in stored.get("spec", {}).items()}}
    new = {**{f"fingerprint.{k}": v for k, v in requested["fingerprint"].items()},
           **{f"spec.{k}": v for k, v in requested["spec"].items()}}
    raise ConfigError(
        f"{out_dir} holds a teacher-output cache from a different configuration "
        f"(per {source}); differing keys:\n{_describe_diff(old, new)}\n"
        "Use another directory, or pass overwrite=True (--overwrite for bin/train) to delete that cache's files.")


def _final_name(name: str) -> str:
    """The name a temporary file gets when committed: ``<final>.tmp`` (a shard) or
    ``<final>.<pid>-<hex>.tmp`` (the JSON files, each writer's own: atomic_write_json's own_tmp)."""
    if not name.endswith(".tmp"):
        return name
    name = name[:-4]
    return name if _SHARD_RE.match(name) or name in (MANIFEST, STATE) else name.rsplit(".", 1)[0]


def _cache_files(out_dir: Path) -> list[Path]:
    """Files this module owns in ``out_dir`` (shards, tmp files, state, manifest)."""
    owned = []
    for p in out_dir.iterdir():
        name = _final_name(p.name)
        if _SHARD_RE.match(name) or name in (MANIFEST, STATE):
            owned.append(p)
    return owned


def _read_if_exists(path: Path) -> Optional[dict]:
    """The JSON at ``path``, or None if there is none (another worker may remove it at any time)."""
    try:
        return _read_json(path)
    except FileNotFoundError:
        return None


def _read_json(path: Path) -> dict:
    """A JSON file of the cache (manifest, state; FileNotFoundError if there is none); a damaged one is named in one
    line with what to do."""
    data = path.read_bytes()
    with reading(path.parent, f"delete {path.parent} and rerun the same command (the teacher outputs are computed "
                              "again)"):
        return json.loads(data.decode("utf-8"))


def _stored_identity(out_dir: Path) -> Optional[dict]:
    """The identity of the cache in ``out_dir`` (its manifest's, else its state file's); None if neither."""
    manifest = _read_if_exists(out_dir / MANIFEST)
    if manifest is not None:
        return _identity(manifest.get("fingerprint", {}), manifest.get("spec", {}))
    state = _read_if_exists(out_dir / STATE)
    return None if state is None else state["identity"]


def _has_shards(out_dir: Path) -> bool:
    """Whether a shard file (committed or temporary) is in ``out_dir``."""
    return any(_SHARD_RE.match(_final_name(p.name)) for p in out_dir.iterdir())


def _waiter(message: Callable[[], str]) -> Callable[[], None]:
    """A sleep of POLL_SECONDS that logs ``message()`` every WAIT_LOG_SECONDS of waiting."""
    start = last = time.monotonic()

    def wait() -> None:
        nonlocal last
        if time.monotonic() - last >= WAIT_LOG_SECONDS:
            last = time.monotonic()
            log.info("%s (waiting %.0f s)", message(), last - start)
        time.sleep(POLL_SECONDS)

    return wait


def _clear(out_dir: Path) -> None:
    """Delete this module's files only; anything else the user keeps there stays."""
    for p in _cache_files(out_dir):
        p.unlink()


def _prepare_dir(out_dir: Path, identity: dict, overwrite: bool, part: Part = Part()) -> Optional[dict]:
    """Make ``out_dir`` ready for this run; return its manifest if already complete.

    Raises ConfigError if the files there belong to another fingerprint or spec. Of several
    workers, only worker 0 deletes another run's files (``overwrite``) or reopens a damaged cache;
    the others wait for it (``_join``), so no worker deletes what another is writing. Each removes
    the stale temporary files of its own shards only.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if part.index > 0:
        manifest = _join(out_dir, identity, overwrite, part)
    else:
        if overwrite and (part.count == 1 or _stored_identity(out_dir) != identity):
            _clear(out_dir)
        manifest = _open(out_dir, identity)
    for path in _cache_files(out_dir):
        # A .tmp is a shard or JSON a killed writer never committed: never valid data.
        shard = _SHARD_RE.match(_final_name(path.name))
        if path.name.endswith(".tmp") and (part.count == 1 or (shard and part.owns(int(shard.group(1))))):
            path.unlink(missing_ok=True)
    return manifest


def _unknown_shards(out_dir: Path, identity: dict) -> ConfigError:
    return ConfigError(
        f"{out_dir} holds shard files but no {STATE} or {MANIFEST}, so their fingerprint is "
        f"unknown (requested fingerprint: {json.dumps(identity['fingerprint'])[:300]}). "
        "Use another directory, or pass overwrite=True to delete them.")


def _open(out_dir: Path, identity: dict) -> Optional[dict]:
    """_prepare_dir's checks and repairs (one process, or worker 0 of several)."""
    manifest = _read_if_exists(out_dir / MANIFEST)
    if manifest is not None:
        _check_format(out_dir, manifest)
        _check_same_run(out_dir, _identity(manifest.get("fingerprint", {}), manifest.get("spec", {})),
                        identity, MANIFEST)
        if not _damaged_shards(out_dir, manifest):
            return manifest
        _reopen(out_dir, manifest, identity)
        return None
    state = _read_if_exists(out_dir / STATE)
    if state is not None:
        _check_same_run(out_dir, state["identity"], identity, STATE)
    elif any(_SHARD_RE.match(p.name) for p in out_dir.iterdir()):
        if (out_dir / MANIFEST).exists():   # the other workers completed the cache just now
            return _open(out_dir, identity)
        raise _unknown_shards(out_dir, identity)
    return None


def _join(out_dir: Path, identity: dict, overwrite: bool, part: Part) -> Optional[dict]:
    """_prepare_dir of a worker other than 0: wait until ``out_dir`` holds this run's cache (complete:
    its manifest; partial: its state file; nothing at all: start it), leaving deletions and repairs
    to worker 0. Another run's cache raises ConfigError as for one process, unless ``overwrite``
    (worker 0 then clears it)."""
    wait = _waiter(lambda: f"worker {part.index} of {part.count}: {out_dir} holds another run's cache or a "
                           "damaged one; waiting for worker 0 to clear or repair it")
    while True:
        manifest = _read_if_exists(out_dir / MANIFEST)
        state = _read_if_exists(out_dir / STATE) if manifest is None else None
        if manifest is not None:
            if not overwrite:   # with --overwrite, worker 0 clears a cache of another format: wait for it
                _check_format(out_dir, manifest)
            stored, source = _identity(manifest.get("fingerprint", {}), manifest.get("spec", {})), MANIFEST
            if stored == identity and not _damaged_shards(out_dir, manifest):
                return manifest
        elif state is not None:
            stored, source = state["identity"], STATE
            if stored == identity:
                return None
        elif not _has_shards(out_dir):
            atomic_write_json(out_dir / STATE, {"identity": identity, "features": None}, own_tmp=True)
            return None
        elif overwrite or (out_dir / MANIFEST).exists() or (out_dir / STATE).exists():
            stored = None   # cleared, completed or started by worker 0 since the reads above: look again
        else:
            raise _unknown_shards(out_dir, identity)
        if stored not in (None, identity) and not overwrite:
            _check_same_run(out_dir, stored, identity, source)
        wait()


def shard_problem(path: Path, record: dict) -> Optional[str]:
    """What is wrong with a complete cache's shard against its manifest entry (missing, another size, or,
    where the manifest records one, another CRC-32: bytes changed in place); None when it is whole."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != record["bytes"]:
        return f"cut short or damaged ({size:,} bytes; manifest.json records {record['bytes']:,})"
    if "crc32" in record and file_crc32(path) != record["crc32"]:
        return "damaged (its CRC-32 differs from the one manifest.json records)"
    return None


def damaged_shards(out_dir: str | os.PathLike, manifest: Optional[dict] = None) -> list[tuple[Path, str]]:
    """(shard, what is wrong) for each shard of the complete cache in ``out_dir`` that is not as its manifest
    recorded it (`shard_problem`); reads every shard once."""
    out_dir = Path(out_dir)
    manifest = load_manifest(out_dir) if manifest is None else manifest
    found = [(out_dir / s["file"], shard_problem(out_dir / s["file"], s)) for s in manifest["shards"]]
    return [(path, problem) for path, problem in found if problem is not None]


def _damaged_shards(out_dir: Path, manifest: dict) -> list[Path]:
    return [path for path, _ in damaged_shards(out_dir, manifest)]


def _reopen(out_dir: Path, manifest: dict, identity: dict) -> None:
    """Turn a complete cache with damaged shards back into a partial run of the same
    fingerprint, so the writer recomputes just those shards."""
    for path in _damaged_shards(out_dir, manifest):   # first: a worker waiting for the state never sees them
        path.unlink(missing_ok=True)
    atomic_write_json(out_dir / STATE, {"identity": identity, "features": manifest["features"]}, own_tmp=True)
    (out_dir / MANIFEST).unlink()


@dataclass(frozen=True)
class Layout:
    """How each key is stored (write_sharded's arguments past the fingerprint; part of the spec).

    dtypes: key -> stored dtype of a plain cast. encodings: key -> "int8" or "top<K>" (a float key).
    ragged: key -> the sequence axis of one example (its length is the real length, from `length_key`).
    pad_values: key -> the value past the real length (0 if not named), checked when written and
    put back when a batch is padded (`padded_batch`)."""

    dtypes: dict = field(default_factory=dict)
    encodings: dict = field(default_factory=dict)
    ragged: dict = field(default_factory=dict)
    pad_values: dict = field(default_factory=dict)
    length_key: str = "attention_mask"

    def check(self) -> None:
        bad = {k: v for k, v in self.dtypes.items() if v not in _STORABLE}
        if bad:
            raise ConfigError(f"unsupported dtypes {bad}; storable dtypes: {sorted(_STORABLE)}")
        for key, encoding in self.encodings.items():
            if encoding != INT8 and _top_k_of(encoding) is None:
                raise ConfigError(f"cannot encode {key!r} as {encoding!r}; expected {INT8!r} or 'top<K>' (K >= 1)")
            if key in self.dtypes:
                raise ConfigError(f"{key!r} has both a dtype ({self.dtypes[key]}) and an encoding ({encoding})")
        for key, axis in self.ragged.items():
            if not isinstance(axis, int) or axis < 0:
                raise ConfigError(f"ragged axis of {key!r} must be a non-negative int, got {axis!r}")

    def spec(self) -> dict:
        """The part of the cache's spec (identity) this layout adds."""
        out = asdict(self)
        if not self.ragged:
            del out["length_key"]
        return out


def _top_k_of(encoding: str) -> Optional[int]:
    """K of a "top<K>" encoding (None if it is not one)."""
    match = re.fullmatch(TOPK + r"([1-9]\d*)", str(encoding))
    return int(match.group(1)) if match else None


def index_dtype(num_classes: int) -> str:
    """Stored dtype of top-k indices: the narrowest unsigned type that holds every class id."""
    return "uint8" if num_classes <= 256 else "uint16" if num_classes <= 65536 else "int32"


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8, scale float32): symmetric, one scale per row (every axis but the last), scale =
    max|x_row| / 127, q = round(x / scale). |x - q * scale| <= scale / 2 per element; a row of zeros
    gets scale 0 and q 0."""
    x = np.asarray(x, dtype=np.float32)
    scale = (np.abs(x).max(axis=-1) / np.float32(127)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))[..., None]
    q = np.clip(np.rint(x / safe), -127, 127).astype(np.int8)
    return q, scale


def dequantize_int8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """float32 of `quantize_int8`'s output (what `read_sharded` returns)."""
    return q.astype(np.float32) * np.asarray(scale, dtype=np.float32)[..., None]


def top_k(x: np.ndarray, k: int, dtype: str = "uint8") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values float32 [..., k], indices [..., k], rest float32 [...]): the k largest values of the
    last axis (largest first; ties by lower index), their indices, and the log-sum-exp of the others."""
    x = np.asarray(x, dtype=np.float32)
    index = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    values = np.take_along_axis(x, index, axis=-1)
    chosen = np.zeros(x.shape, dtype=bool)
    np.put_along_axis(chosen, index, True, axis=-1)
    others = np.where(chosen, -np.inf, x.astype(np.float64))
    top = others.max(axis=-1, keepdims=True)
    rest = top[..., 0] + np.log(np.exp(others - top).sum(axis=-1))
    return values, index.astype(dtype), rest.astype(np.float32)


def from_top_k(values: np.ndarray, index: np.ndarray, rest: np.ndarray, num_classes: int) -> np.ndarray:
    """Full logits [..., num_classes] from `top_k` (what `read_sharded` returns): the top k as stored,
    every other class `rest - log(num_classes - k)`, so the softmax keeps the top k's probabilities
    and the total mass of the rest exactly (spread evenly over the rest), and the argmax."""
    k = values.shape[-1]
    fill = (np.asarray(rest, np.float32) - np.float32(np.log(num_classes - k)))[..., None]
    out = np.repeat(fill, num_classes, axis=-1).astype(np.float32)
    np.put_along_axis(out, np.asarray(index, np.int64), values, axis=-1)
    return out


def _feature_spec(batch: Mapping[str, np.ndarray], rows: int, layout: Layout) -> dict:
    """{key: {"dtype", "shape", ...}} of one example, from a computed batch: a ragged key's shape has
    None (null) at its sequence axis, plus "ragged_axis" and "pad"; an encoded key, "encoding"."""
    unused = sorted((set(layout.dtypes) | set(layout.encodings) | set(layout.ragged)) - set(batch))
    if unused:
        # Most likely a typo that would silently store a key at full precision.
        raise ConfigError(f"dtypes, encodings or ragged name {unused}, which compute_batch does not return "
                          f"(it returns {sorted(batch)})")
    if layout.ragged and layout.length_key not in batch:
        raise ConfigError(f"ragged keys need {layout.length_key!r} (the real lengths); compute_batch returns "
                          f"{sorted(batch)}")
    spec = {}
    for key, arr in batch.items():
        arr = np.asarray(arr)
        if arr.ndim == 0 or arr.shape[0] != rows:
            raise ConfigError(f"compute_batch returned {key!r} with shape {arr.shape}; "
                              f"expected leading dimension {rows} (one row per example)")
        dtype = layout.dtypes.get(key, arr.dtype.name)
        if dtype not in _STORABLE:
            raise ConfigError(f"cannot store {key!r} as {dtype}; storable dtypes: {sorted(_STORABLE)}")
        entry = {"dtype": dtype, "shape": list(arr.shape[1:])}
        if key in layout.ragged:
            axis = layout.ragged[key]
            if axis >= arr.ndim - 1 or arr.shape[axis + 1] != np.shape(batch[layout.length_key])[1]:
                raise ConfigError(f"ragged axis {axis} of {key!r} (per-example shape {arr.shape[1:]}) is not "
                                  f"the sequence axis of {layout.length_key!r} {np.shape(batch[layout.length_key])[1:]}")
            entry["shape"][axis] = None
            entry.update(ragged_axis=axis, pad=np.asarray(layout.pad_values.get(key, 0)).item())
        encoding = layout.encodings.get(key)
        if encoding is not None:
            if arr.dtype.kind != "f" or arr.ndim < 2 or layout.ragged.get(key) == arr.ndim - 2:
                raise ConfigError(f"{encoding} encodes rows of floats along the last axis; {key!r} is "
                                  f"{arr.dtype} of per-example shape {arr.shape[1:]}"
                                  + (" whose last axis is its sequence axis" if key in layout.ragged else ""))
            k, classes = _top_k_of(encoding), arr.shape[-1]
            if encoding == INT8:
                entry.update(dtype="int8", encoding=INT8, scale_dtype="float32")
            elif k < classes:   # else every value is kept: stored as float32 as it is
                entry.update(dtype="float32", encoding="topk", k=k, index_dtype=index_dtype(classes))
            else:
                entry["dtype"] = "float32"
        spec[key] = entry
    return spec


def _rows_text(rows: np.ndarray) -> str:
    return f"rows {rows[0]}..{rows[-1]}" if len(rows) else "no rows"


def _check_batch(batch: Mapping[str, np.ndarray], rows: np.ndarray, features: dict) -> None:
    """Every batch must have the keys and per-example shapes of the first one (any length along
    a ragged key's sequence axis)."""
    if set(batch) != set(features):
        raise ConfigError(f"compute_batch({_rows_text(rows)}) returned keys {sorted(batch)}; "
                          f"earlier batches had {sorted(features)}")
    for key, arr in batch.items():
        expected = (len(rows), *features[key]["shape"])
        shape = tuple(np.shape(arr))
        if len(shape) != len(expected) or any(e is not None and e != d for e, d in zip(expected, shape)):
            raise ConfigError(f"compute_batch({_rows_text(rows)}) returned {key!r} with shape "
                              f"{shape}; expected {expected} (pad to a fixed length)")


def _to_storage(key: str, arr: np.ndarray, dtype: str) -> np.ndarray:
    """Cast to the stored little-endian dtype, refusing casts that corrupt values
    (float overflow to inf, integers that wrap)."""
    src = np.asarray(arr)
    with np.errstate(over="ignore", invalid="ignore"):  # checked below, with a clearer message
        out = np.ascontiguousarray(src.astype(np.dtype(dtype).newbyteorder("<"), copy=False))
    if out.dtype.kind == "f" and src.dtype.kind in "fiub":
        if np.any(np.isfinite(src) & ~np.isfinite(out)):
            raise ConfigError(f"storing {key!r} as {dtype} overflows (|x| > {np.finfo(out.dtype).max}); "
                              "keep it float32 in dtypes")
    elif out.dtype.kind in "iub" and not np.array_equal(out.astype(src.dtype), src):
        raise ConfigError(f"storing {key!r} as {dtype} changes its values; choose a wider dtype")
    return out


def real_lengths(mask: np.ndarray) -> np.ndarray:
    """[B] each row's real length: one past its last nonzero mask position (0 for an empty row)."""
    mask = np.asarray(mask) != 0
    width = mask.shape[1]
    return np.where(mask.any(axis=1), width - np.argmax(mask[:, ::-1], axis=1), 0).astype(np.int64)


def _check_tail(key: str, arr: np.ndarray, lengths: np.ndarray, axis: int, pad, rows: np.ndarray) -> None:
    """Ragged storage drops what lies past each row's length: it must be the pad value."""
    width = arr.shape[axis + 1]
    beyond = np.arange(width)[None, :] >= lengths[:, None]
    beyond = beyond.reshape((arr.shape[0],) + (1,) * axis + (width,) + (1,) * (arr.ndim - axis - 2))
    bad = np.nonzero(np.any((arr != pad) & beyond, axis=tuple(range(1, arr.ndim))))[0]
    if bad.size:
        raise ConfigError(f"example {int(rows[bad[0]])}: {key!r} holds values other than {pad} past its real "
                          "length (attention_mask), which ragged storage would drop; zero the padding "
                          "(or name its value in pad_values)")


def _encode(batch: Mapping[str, np.ndarray], features: dict, length_key: str, rows: np.ndarray
            ) -> tuple[dict, dict, Optional[np.ndarray]]:
    """(stored arrays by feature name, their ragged axes, each row's length) of one computed batch."""
    ragged = {k: f["ragged_axis"] for k, f in features.items() if "ragged_axis" in f}
    lengths = real_lengths(batch[length_key]) if ragged else None
    stored, axes = {}, {}
    for key, arr in batch.items():
        f = features[key]
        if key in ragged:
            _check_tail(key, np.asarray(arr), lengths, ragged[key], f["pad"], rows)
        if f.get("encoding") == INT8:
            parts = dict(zip((key, key + SCALE), quantize_int8(arr)))
        elif f.get("encoding") == "topk":
            parts = dict(zip((key, key + INDEX, key + REST), top_k(arr, f["k"], f["index_dtype"])))
        else:
            parts = {key: _to_storage(key, arr, f["dtype"])}
        for name, value in parts.items():
            stored[name] = np.ascontiguousarray(value.astype(value.dtype.newbyteorder("<"), copy=False))
            if key in ragged:
                axes[name] = ragged[key]
    return stored, axes, lengths


def _serialize(stored: Mapping[str, np.ndarray], row: int, axes: Mapping[str, int] = (),
               lengths: Optional[np.ndarray] = None) -> bytes:
    """One example as a tf.train.Example of raw bytes (a ragged feature cut to the row's length);
    deterministic so reruns are byte-equal."""
    def cut(name: str, arr: np.ndarray) -> np.ndarray:
        if name not in axes:
            return arr
        return np.ascontiguousarray(arr[(slice(None),) * axes[name] + (slice(0, int(lengths[row])),)])

    feature = {name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[cut(name, arr[row]).tobytes()]))
               for name, arr in stored.items()}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(
        deterministic=True)


def encode_examples(batch: Mapping[str, np.ndarray], rows: np.ndarray, features: dict,
                    length_key: str = "attention_mask") -> list[bytes]:
    """The serialized records of examples `rows` computed as `batch`, in the order of `rows`."""
    _check_batch(batch, rows, features)
    stored, axes, lengths = _encode(batch, features, length_key, rows)
    return [_serialize(stored, row, axes, lengths) for row in range(len(rows))]


def shard_batches(start: int, end: int, batch_size: int, lengths: Optional[np.ndarray] = None) -> Iterable[np.ndarray]:
    """The examples [start, end) in batches of batch_size (never crossing a shard boundary): in
    order, or, given every example's `lengths`, sorted by length first (stable), so that a batch holds
    windows of similar length and trimming it to its longest wastes little."""
    rows = np.arange(start, end, dtype=np.int64)
    if lengths is not None:
        rows = rows[np.argsort(np.asarray(lengths)[start:end], kind="stable")]
    for b in range(0, len(rows), batch_size):
        yield rows[b:b + batch_size]


def _write_shard(out_dir: Path, index: int, num_shards: int, start: int, end: int,
                 compute_batch: ComputeBatch, batch_size: int, layout: Layout,
                 state: dict, bar: Any, lengths: Optional[np.ndarray] = None) -> None:
    """Compute examples [start, end) batch by batch into a .tmp file, then commit it.

    The first shard a run ever writes fixes the feature spec; it is saved in the state file
    before that shard is renamed, so any existing shard implies a known spec.
    """
    final = out_dir / shard_name(index, num_shards)
    tmp = final.with_name(final.name + ".tmp")
    try:
        _fill_shard(tmp, start, end, compute_batch, batch_size, layout, state, bar, lengths)
        on_disk = _read_json(out_dir / STATE).get("features")
        if on_disk is None:
            atomic_write_json(out_dir / STATE, state, own_tmp=True)
        elif on_disk != _normalize_json(state["features"]):   # another worker's shards hold other arrays
            raise ConfigError(f"{final.name}: its examples hold {json.dumps(state['features'])[:300]} but the shards "
                              f"already in {out_dir} hold {json.dumps(on_disk)[:300]}; the workers must compute the "
                              "same arrays (same teacher, data and settings)")
        with stop.deferred():
            os.replace(tmp, final)
    except BaseException:   # a failed or interrupted shard leaves no .tmp behind
        with stop.deferred():
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(out_dir)


def _fill_shard(tmp: Path, start: int, end: int, compute_batch: ComputeBatch, batch_size: int, layout: Layout,
                state: dict, bar: Any, lengths: Optional[np.ndarray] = None) -> None:
    """Write examples [start, end) into `tmp` in index order, whatever order they were computed in, and
    sync it. Computed out of order (`lengths`), the shard's records are held until all are done."""
    records: dict[int, bytes] = {}
    with tf.io.TFRecordWriter(str(tmp)) as writer:
        for rows in shard_batches(start, end, batch_size, lengths):
            batch = dict(compute_batch(rows))
            if state.get("features") is None:
                state["features"] = _feature_spec(batch, len(rows), layout)
            encoded = encode_examples(batch, rows, state["features"], layout.length_key)
            if lengths is None:
                for record in encoded:
                    writer.write(record)
            else:
                records.update(zip(rows.tolist(), encoded))
            bar.update(len(rows))
        for row in sorted(records):
            writer.write(records[row])
    fsync_file(tmp)


def _shard_bounds(num_examples: int, shard_size: int) -> list[tuple[int, int]]:
    """[start, end) of every shard."""
    return [(s, min(s + shard_size, num_examples)) for s in range(0, num_examples, shard_size)]


def write_sharded(out_dir: str | os.PathLike, num_examples: int, compute_batch: ComputeBatch, *,
                  shard_size: int = 1000, batch_size: int = 32, fingerprint: dict,
                  dtypes: Optional[dict[str, str]] = None, progress: bool = True,
                  overwrite: bool = False, part: Optional[tuple[int, int]] = None,
                  encodings: Optional[dict[str, str]] = None, ragged: Optional[dict[str, int]] = None,
                  pad_values: Optional[dict] = None, length_key: str = "attention_mask",
                  lengths: Optional[np.ndarray] = None) -> dict:
    """Compute and cache ``num_examples`` examples as TFRecord shards; return the manifest.

    ``compute_batch(rows)`` returns {key: array} with one row per example index of ``rows`` (an
    int64 array of at most ``batch_size`` indices of one shard) and the same trailing shape for every
    call (pad sequences to a fixed length); it must be deterministic in the example index so a resumed
    run matches an uninterrupted one. ``lengths`` (one per example): each shard's examples are computed
    in batches of similar length (sorted by length within the shard) and still stored in index order,
    so a compute_batch that trims a batch to its longest example does less padding work.
    ``fingerprint`` (JSON-serializable) identifies what is being cached (teacher, data,
    max_seq_length, layer, ...): a complete cache with the same fingerprint is returned
    without computing anything; a partial one is resumed, recomputing only missing shards.
    ``dtypes`` overrides the stored dtype per key (e.g. ``{"hidden": "float16"}``); ``encodings``
    stores a float key as ``"int8"`` (one scale per row) or ``"top<K>"`` (the K largest of its
    last axis, their indices and the rest's log-sum-exp); ``ragged`` names each key with a
    sequence axis ({key: axis of one example}): it is stored at the example's real length (one
    past the last nonzero of ``length_key``), and what it held past that must be its
    ``pad_values`` entry (default 0), which ``padded_batch`` puts back (docs/cache.md).
    A directory holding another fingerprint's cache raises ConfigError unless
    ``overwrite=True``, which deletes this module's files there (and only those).
    ``num_examples == 0`` raises ConfigError: an empty transfer set is an upstream bug.

    ``part=(index, count)`` (default: the enclosing ``worker_part``, else (0, 1)): this process is
    worker ``index`` of ``count`` writing one cache into a directory they share. It computes the
    shards s with s % count == index that are not there yet, then waits until every shard is; the
    first worker to see them all writes the manifest (any of them may finish last, and one waiting
    for a killed worker writes it once that worker's rerun is done), and every worker returns it.
    A worker's rerun after a kill recomputes only its own missing shards. The shards do not depend on
    ``count``: one process and several write the same bytes. Not safe for two processes with the
    same ``index`` (or one without ``part`` and a worker) on one directory at once.
    """
    if num_examples <= 0:
        raise ConfigError(f"nothing to cache in {out_dir}: num_examples={num_examples} "
                          "(the transfer set is empty)")
    if shard_size <= 0 or batch_size <= 0:
        raise ConfigError(f"shard_size and batch_size must be positive, got {shard_size}, {batch_size}")
    if lengths is not None and np.shape(lengths) != (num_examples,):
        raise ConfigError(f"lengths has shape {np.shape(lengths)}; expected one per example, ({num_examples},)")
    layout = Layout(dict(dtypes or {}), dict(encodings or {}), dict(ragged or {}),
                    {k: np.asarray(v).item() for k, v in (pad_values or {}).items()}, length_key)
    layout.check()
    out_dir = Path(out_dir)
    spec = {"num_examples": num_examples, "shard_size": shard_size, **layout.spec()}
    identity = _normalize_json(_identity(fingerprint, spec))
    part = _check_part(_DEFAULT.part if part is None else part)
    manifest = _prepare_dir(out_dir, identity, overwrite, part)
    if manifest is not None:
        return manifest

    state = _read_if_exists(out_dir / STATE)
    if state is None:
        state = {"identity": identity, "features": None}
        if not (out_dir / MANIFEST).exists():   # (else the other workers completed the cache just now)
            atomic_write_json(out_dir / STATE, state, own_tmp=True)

    bounds = _shard_bounds(num_examples, shard_size)
    mine = [i for i in range(len(bounds)) if part.owns(i)]
    missing = [i for i in mine if not (out_dir / shard_name(i, len(bounds))).exists()]
    total = sum(bounds[i][1] - bounds[i][0] for i in mine)
    done = total - sum(bounds[i][1] - bounds[i][0] for i in missing)
    worker = f" (worker {part.index} of {part.count})" if part.count > 1 else ""
    with tqdm(total=total, initial=done, unit="ex", desc=f"caching to {out_dir.name}{worker}",
              disable=not progress) as bar:
        for i in missing:
            _write_shard(out_dir, i, len(bounds), *bounds[i], compute_batch, batch_size,
                         layout, state, bar, lengths)
    if part.count == 1:
        return _write_manifest(out_dir, identity, state["features"], bounds)
    return _complete(out_dir, identity, state, bounds, part)


def _complete(out_dir: Path, identity: dict, state: dict, bounds: list[tuple[int, int]], part: Part) -> dict:
    """Wait until every shard is in ``out_dir``; return the manifest, written by this worker if
    no other has yet (two writing it at once write the same file)."""
    absent: list[int] = []
    wait = _waiter(lambda: f"worker {part.index} of {part.count}: {len(absent)} shards of {out_dir} are not "
                           f"written yet (those of workers {sorted({i % part.count for i in absent})}); a worker "
                           "that was killed resumes when its command is run again")
    while True:
        manifest = _read_if_exists(out_dir / MANIFEST)
        if manifest is not None:
            return manifest
        absent = [i for i in range(len(bounds)) if not (out_dir / shard_name(i, len(bounds))).exists()]
        # Features: this worker's own, else those its peers recorded (a worker may write no shard).
        features = state["features"] or (_read_if_exists(out_dir / STATE) or {}).get("features")
        if not absent and features is not None:
            return _write_manifest(out_dir, identity, features, bounds)
        wait()


def _write_manifest(out_dir: Path, identity: dict, features: dict,
                    bounds: list[tuple[int, int]]) -> dict:
    """Describe the complete cache; written last so its presence means 'complete'. Workers that
    write it at once write the same content, each through its own temporary file."""
    shards = []
    for i, (start, end) in enumerate(bounds):
        name = shard_name(i, len(bounds))
        shards.append({"file": name, "num_examples": end - start,
                       "bytes": (out_dir / name).stat().st_size, "crc32": file_crc32(out_dir / name)})
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "encoding": "one tf.train.Example per example; one bytes feature per key holding the "
                    "raw little-endian C-order array of that example (a ragged key cut to the example's "
                    "real length; an int8 key with key/scale, a top-k key with key/index and key/rest)",
        "fingerprint": identity["fingerprint"], "spec": identity["spec"],
        "num_examples": identity["spec"]["num_examples"],
        "shard_size": identity["spec"]["shard_size"],
        "num_shards": len(bounds), "features": features, "shards": shards,
        "total_bytes": sum(s["bytes"] for s in shards),
    }
    atomic_write_json(out_dir / MANIFEST, manifest, own_tmp=True)
    (out_dir / STATE).unlink(missing_ok=True)
    return manifest


def load_manifest(out_dir: str | os.PathLike) -> dict:
    """The manifest of a complete cache; ConfigError if the cache is missing or incomplete."""
    out_dir = Path(out_dir)
    path = out_dir / MANIFEST
    if not path.exists():
        partial = out_dir.is_dir() and any(_SHARD_RE.match(p.name) for p in out_dir.iterdir())
        why = "incomplete (shards but no manifest: the writer was interrupted)" if partial else "missing"
        raise ConfigError(f"teacher-output cache in {out_dir} is {why}; rerun the writer "
                          "(write_sharded with the same fingerprint resumes where it stopped)")
    manifest = _read_json(path)
    _check_format(out_dir, manifest)
    return manifest


def check_format(out_dir: str | os.PathLike) -> None:
    """ConfigError in one line if `out_dir` holds a complete cache of a format this version cannot read."""
    path = Path(out_dir) / MANIFEST
    if path.is_file():
        _check_format(Path(out_dir), _read_json(path))


def _check_format(out_dir: Path, manifest: dict) -> None:
    """Refuse a manifest this version cannot read, in one line saying what to do."""
    if manifest.get("format") != FORMAT:
        raise ConfigError(f"{out_dir / MANIFEST} is not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ConfigError(
            f"{out_dir} holds a teacher-output cache of format v{version}"
            + (" (every window padded to --max_seq_length)" if version == 1 else "")
            + f"; this version reads v{FORMAT_VERSION} (windows at their real length) only: regenerate it "
            "(bin/train --overwrite redoes the transfer step and every later step, or use a new --work_dir; "
            "write_sharded(..., overwrite=True) from Python)")


def cache_complete(out_dir: str | os.PathLike, fingerprint: dict) -> bool:
    """True if ``out_dir`` holds a complete cache for ``fingerprint`` with every shard
    present at its recorded size and CRC-32."""
    out_dir = Path(out_dir)
    try:
        manifest = load_manifest(out_dir)
    except ConfigError:
        return False
    return manifest["fingerprint"] == _normalize_json(fingerprint) and not _damaged_shards(
        out_dir, manifest)


def disk_bytes_per_1000(out_dir: str | os.PathLike) -> float:
    """Disk cost of the cache per 1,000 examples (shard bytes on disk, manifest excluded)."""
    out_dir = Path(out_dir)
    manifest = load_manifest(out_dir)
    total = sum((out_dir / s["file"]).stat().st_size for s in manifest["shards"])
    return 1000.0 * total / manifest["num_examples"]


def _decode(raw: Mapping[str, tf.Tensor], key: str, f: dict, cast_float32: bool) -> tf.Tensor:
    """One feature of one example back as the tensor that was computed (a ragged key at its real
    length; int8 dequantized and top-k logits filled in, both float32)."""
    shape = [-1 if d is None else d for d in f["shape"]]

    def part(name: str, dtype: str, part_shape: list) -> tf.Tensor:
        return tf.reshape(tf.io.decode_raw(raw[name], tf.as_dtype(dtype), little_endian=True), part_shape)

    encoding = f.get("encoding")
    if encoding == INT8:
        scale = part(key + SCALE, f["scale_dtype"], shape[:-1])
        return tf.cast(part(key, "int8", shape), tf.float32) * scale[..., None]
    if encoding == "topk":
        k, classes = f["k"], shape[-1]
        values = part(key, f["dtype"], shape[:-1] + [k])
        onehot = tf.one_hot(tf.cast(part(key + INDEX, f["index_dtype"], shape[:-1] + [k]), tf.int32), classes)
        fill = part(key + REST, "float32", shape[:-1]) - np.float32(np.log(classes - k))
        chosen = tf.reduce_max(onehot, axis=-2) > 0
        return tf.where(chosen, tf.reduce_sum(onehot * values[..., None], axis=-2), fill[..., None])
    values = part(key, f["dtype"], shape)
    return tf.cast(values, tf.float32) if cast_float32 and values.dtype == tf.float16 else values


def _stored_names(key: str, f: dict) -> list[str]:
    """The bytes features of the Example that hold `key`."""
    return {INT8: [key, key + SCALE], "topk": [key, key + INDEX, key + REST]}.get(f.get("encoding"), [key])


def _parser(features: dict, keys: list[str], cast_float32: bool) -> Callable:
    """Parse function: one serialized Example -> {key: tensor}, static shapes but a ragged key's
    sequence axis."""
    description = {name: tf.io.FixedLenFeature([], tf.string)
                   for k in keys for name in _stored_names(k, features[k])}

    def parse(serialized: tf.Tensor) -> dict:
        raw = tf.io.parse_single_example(serialized, description)
        return {key: _decode(raw, key, features[key], cast_float32) for key in keys}

    return parse


def read_sharded(out_dir: str | os.PathLike, *, keys: Optional[Iterable[str]] = None,
                 cast_float32: bool = True, cycle_length: int = 1) -> tf.data.Dataset:
    """Stream a complete cache as a dataset of per-example dicts.

    ``keys`` selects features (default: all); ``cast_float32`` turns stored float16 back
    into float32 (int8 and top-k keys always come back float32). A ragged key comes at the
    example's real length: batch with ``padded_batch`` (each batch padded to its longest
    example, with the cache's ``padding_values``). With the default ``cycle_length=1`` examples
    come in their original order (example i of the transfer set is element i); a larger value
    reads that many shards at once and interleaves their examples (faster on slow disks, order
    no longer by index).
    """
    out_dir = Path(out_dir)
    manifest = load_manifest(out_dir)
    features = manifest["features"]
    keys = list(features) if keys is None else list(keys)
    unknown = [k for k in keys if k not in features]
    if unknown:
        raise ConfigError(f"cache {out_dir} has no feature(s) {unknown}; it has {sorted(features)}")
    files = [str(out_dir / s["file"]) for s in manifest["shards"]]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise ConfigError(f"cache {out_dir} is missing shard files {missing}; rerun the writer "
                          "with overwrite=True")
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=cycle_length, block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.map(_parser(features, keys, cast_float32),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.apply(tf.data.experimental.assert_cardinality(manifest["num_examples"]))


def padding_values(out_dir: str | os.PathLike) -> dict:
    """{key: value} that the cache's ragged keys held past each example's length (for `padded_batch`)."""
    return {k: f["pad"] for k, f in load_manifest(out_dir)["features"].items() if "ragged_axis" in f}


def padded_batch(ds: tf.data.Dataset, batch_size: int, padding: Optional[Mapping] = None,
                 drop_remainder: bool = False, length: Optional[int] = None) -> tf.data.Dataset:
    """Batches of per-example dicts, each key padded to the batch's longest example with `padding`'s
    value for it (default 0): what a cache padded to max_seq_length gives after trimming to the batch's
    longest window. `length`: pad every sequence axis to that length instead (the padded layout)."""
    padding = dict(padding or {})
    values = {k: tf.cast(padding.get(k, 0), spec.dtype) for k, spec in ds.element_spec.items()}
    shapes = None if length is None else {k: [length if d is None else d for d in spec.shape.as_list()]
                                          for k, spec in ds.element_spec.items()}
    return ds.padded_batch(batch_size, padded_shapes=shapes, padding_values=values, drop_remainder=drop_remainder)


def read_arrays(out_dir: str | os.PathLike, length: Optional[int] = None,
                keys: Optional[Iterable[str]] = None) -> dict:
    """Every example of a (small) cache as numpy arrays [N, ...], sequence axes padded to `length`
    (default: the longest example) with the cache's padding values: the padded layout, in memory."""
    ds = padded_batch(read_sharded(out_dir, keys=keys), load_manifest(out_dir)["num_examples"],
                      padding_values(out_dir), length=length)
    return {k: v.numpy() for k, v in next(iter(ds)).items()}


def pad_values_of(arrays: Mapping[str, np.ndarray], mask: np.ndarray) -> dict:
    """{key: the one value each [N, T, ...] array holds where `mask` [N, T] is 0} (0 where the mask
    has no padding); ConfigError if an array holds several there."""
    padding = np.asarray(mask) == 0
    out = {}
    for key, arr in arrays.items():
        values = np.unique(np.asarray(arr)[padding])
        if values.size > 1:
            raise ConfigError(f"{key!r} holds several values at padding positions ({values[:5].tolist()}); "
                              "ragged storage needs one pad value")
        out[key] = values[0].item() if values.size else 0
    return out


def subset(ds: tf.data.Dataset, keep: np.ndarray) -> tf.data.Dataset:
    """The elements of ``ds`` where ``keep`` (one bool per element, in order) is True; elements
    past the end of ``keep`` are dropped."""
    keep = np.asarray(keep, dtype=bool)
    mask = tf.constant(keep)
    kept = ds.take(len(keep)).enumerate().filter(lambda i, _: tf.gather(mask, i)).map(lambda _, x: x)
    return kept.apply(tf.data.experimental.assert_cardinality(int(keep.sum())))
