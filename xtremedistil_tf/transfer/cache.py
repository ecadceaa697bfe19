"""Sharded on-disk cache of per-example arrays (teacher outputs over a transfer set).

The teacher runs once over the transfer set; its outputs (ids, mask, logits, hidden
states, k-best paths, ...) are written here as TFRecord shards and streamed back with
``tf.data`` so the set never has to fit in RAM. This module knows nothing about BERT:
it stores whatever ``compute_batch`` returns.

Layout of ``out_dir`` (see docs/cache.md):

* ``shard-SSSSS-of-NNNNN.tfrecord``: examples ``[s*shard_size, min((s+1)*shard_size, n))``.
  One ``tf.train.Example`` per example, one bytes feature per key holding the raw
  little-endian C-order array. Written to ``<name>.tmp`` and renamed with ``os.replace``
  when complete, so a shard file that exists is always whole.
* ``cache_state.json``: written before the first shard; fingerprint, spec and feature
  shapes of the run in progress, so a rerun can tell whether the shards are its own.
* ``manifest.json``: written last, atomically; its presence means the cache is complete.

Why raw bytes + shapes in the manifest rather than ``tf.io.serialize_tensor``: reading
back is ``tf.io.decode_raw`` (a memcpy) plus a reshape to a shape known when the graph
is built, so every tensor gets a static shape for free; ``parse_tensor`` would decode a
TensorProto per value and return an unknown shape, and it cannot skip the proto header.
(Parsing records in batches with ``tf.io.parse_example`` then unbatching measured no faster
here: reading the records dominates, so the simpler per-example parse is used.)
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json, fsync_dir, fsync_file, read_json

MANIFEST = "manifest.json"
STATE = "cache_state.json"
FORMAT = "xtremedistil_tf.sharded_cache"
FORMAT_VERSION = 1
_SHARD_RE = re.compile(r"^shard-(\d{5})-of-(\d{5})\.tfrecord$")
# Types tf.io.decode_raw can produce, so anything written can be read back.
_STORABLE = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
             "float16", "float32", "float64"}

ComputeBatch = Callable[[int, int], Mapping[str, np.ndarray]]


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


def _cache_files(out_dir: Path) -> list[Path]:
    """Files this module owns in ``out_dir`` (shards, tmp files, state, manifest)."""
    owned = []
    for p in out_dir.iterdir():
        name = p.name[:-4] if p.name.endswith(".tmp") else p.name
        if _SHARD_RE.match(name) or name in (MANIFEST, STATE):
            owned.append(p)
    return owned


def _clear(out_dir: Path) -> None:
    """Delete this module's files only; anything else the user keeps there stays."""
    for p in _cache_files(out_dir):
        p.unlink()


def _prepare_dir(out_dir: Path, identity: dict, overwrite: bool) -> Optional[dict]:
    """Make ``out_dir`` ready for this run; return its manifest if already complete.

    Raises ConfigError if the files there belong to another fingerprint or spec.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        _clear(out_dir)
    for path in _cache_files(out_dir):
        # A .tmp is a shard or JSON a killed writer never committed: never valid data.
        if path.name.endswith(".tmp"):
            path.unlink()
    manifest_path, state_path = out_dir / MANIFEST, out_dir / STATE
    if manifest_path.exists():
        manifest = read_json(manifest_path)
        _check_same_run(out_dir, _identity(manifest.get("fingerprint", {}), manifest.get("spec", {})),
                        identity, MANIFEST)
        if not _damaged_shards(out_dir, manifest):
            return manifest
        _reopen(out_dir, manifest, identity)
        return None
    if state_path.exists():
        _check_same_run(out_dir, read_json(state_path)["identity"], identity, STATE)
    elif any(_SHARD_RE.match(p.name) for p in out_dir.iterdir()):
        raise ConfigError(
            f"{out_dir} holds shard files but no {STATE} or {MANIFEST}, so their fingerprint is "
            f"unknown (requested fingerprint: {json.dumps(identity['fingerprint'])[:300]}). "
            "Use another directory, or pass overwrite=True to delete them.")
    return None


def _damaged_shards(out_dir: Path, manifest: dict) -> list[Path]:
    """Shards of a complete cache that are missing or not the size the manifest recorded."""
    paths = [(out_dir / s["file"], s["bytes"]) for s in manifest["shards"]]
    return [p for p, size in paths if not p.is_file() or p.stat().st_size != size]


def _reopen(out_dir: Path, manifest: dict, identity: dict) -> None:
    """Turn a complete cache with damaged shards back into a partial run of the same
    fingerprint, so the writer recomputes just those shards."""
    atomic_write_json(out_dir / STATE, {"identity": identity, "features": manifest["features"]})
    (out_dir / MANIFEST).unlink()
    for path in _damaged_shards(out_dir, manifest):
        path.unlink(missing_ok=True)


def _feature_spec(batch: Mapping[str, np.ndarray], rows: int, dtypes: Mapping[str, str]) -> dict:
    """{key: {"dtype", "shape"}} of one example, from a computed batch."""
    unused = sorted(set(dtypes) - set(batch))
    if unused:
        # Most likely a typo that would silently store a key at full precision.
        raise ConfigError(f"dtypes names {unused}, which compute_batch does not return "
                          f"(it returns {sorted(batch)})")
    spec = {}
    for key, arr in batch.items():
        arr = np.asarray(arr)
        if arr.ndim == 0 or arr.shape[0] != rows:
            raise ConfigError(f"compute_batch returned {key!r} with shape {arr.shape}; "
                              f"expected leading dimension {rows} (one row per example)")
        dtype = dtypes.get(key, arr.dtype.name)
        if dtype not in _STORABLE:
            raise ConfigError(f"cannot store {key!r} as {dtype}; storable dtypes: {sorted(_STORABLE)}")
        spec[key] = {"dtype": dtype, "shape": list(arr.shape[1:])}
    return spec


def _check_batch(batch: Mapping[str, np.ndarray], start: int, end: int, features: dict) -> None:
    """Every batch must have the keys and per-example shapes of the first one."""
    if set(batch) != set(features):
        raise ConfigError(f"compute_batch({start}, {end}) returned keys {sorted(batch)}; "
                          f"earlier batches had {sorted(features)}")
    for key, arr in batch.items():
        expected = (end - start, *features[key]["shape"])
        if tuple(np.shape(arr)) != expected:
            raise ConfigError(f"compute_batch({start}, {end}) returned {key!r} with shape "
                              f"{tuple(np.shape(arr))}; expected {expected} (pad to a fixed length)")


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


def _serialize(batch: Mapping[str, np.ndarray], row: int) -> bytes:
    """One example as a tf.train.Example of raw bytes; deterministic so reruns are byte-equal."""
    feature = {key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[arr[row].tobytes()]))
               for key, arr in batch.items()}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(
        deterministic=True)


def _batches(start: int, end: int, batch_size: int) -> Iterable[tuple[int, int]]:
    """[start, end) in batch_size steps; batches never cross a shard boundary."""
    for b in range(start, end, batch_size):
        yield b, min(b + batch_size, end)


def _write_shard(out_dir: Path, index: int, num_shards: int, start: int, end: int,
                 compute_batch: ComputeBatch, batch_size: int, dtypes: dict,
                 state: dict, bar: Any) -> None:
    """Compute examples [start, end) batch by batch into a .tmp file, then commit it.

    The first shard a run ever writes fixes the feature spec; it is saved in the state file
    before that shard is renamed, so any existing shard implies a known spec.
    """
    final = out_dir / shard_name(index, num_shards)
    tmp = final.with_name(final.name + ".tmp")
    with tf.io.TFRecordWriter(str(tmp)) as writer:
        for b_start, b_end in _batches(start, end, batch_size):
            batch = dict(compute_batch(b_start, b_end))
            if state.get("features") is None:
                state["features"] = _feature_spec(batch, b_end - b_start, dtypes)
            _check_batch(batch, b_start, b_end, state["features"])
            stored = {k: _to_storage(k, v, state["features"][k]["dtype"]) for k, v in batch.items()}
            for row in range(b_end - b_start):
                writer.write(_serialize(stored, row))
            bar.update(b_end - b_start)
    fsync_file(tmp)
    if read_json(out_dir / STATE).get("features") is None:
        atomic_write_json(out_dir / STATE, state)
    os.replace(tmp, final)
    fsync_dir(out_dir)


def _shard_bounds(num_examples: int, shard_size: int) -> list[tuple[int, int]]:
    """[start, end) of every shard."""
    return [(s, min(s + shard_size, num_examples)) for s in range(0, num_examples, shard_size)]


def write_sharded(out_dir: str | os.PathLike, num_examples: int, compute_batch: ComputeBatch, *,
                  shard_size: int = 1000, batch_size: int = 32, fingerprint: dict,
                  dtypes: Optional[dict[str, str]] = None, progress: bool = True,
                  overwrite: bool = False) -> dict:
    """Compute and cache ``num_examples`` examples as TFRecord shards; return the manifest.

    ``compute_batch(start, end)`` returns {key: array} with leading dim ``end - start`` and
    the same trailing shape for every call (pad sequences to a fixed length); it must be
    deterministic in the example index so a resumed run matches an uninterrupted one.
    ``fingerprint`` (JSON-serializable) identifies what is being cached (teacher, data,
    max_seq_length, layer, ...): a complete cache with the same fingerprint is returned
    without computing anything; a partial one is resumed, recomputing only missing shards.
    ``dtypes`` overrides the stored dtype per key (e.g. ``{"hidden": "float16"}``).
    A directory holding another fingerprint's cache raises ConfigError unless
    ``overwrite=True``, which deletes this module's files there (and only those).
    ``num_examples == 0`` raises ConfigError: an empty transfer set is an upstream bug.
    Not safe for two writers on one directory at once.
    """
    if num_examples <= 0:
        raise ConfigError(f"nothing to cache in {out_dir}: num_examples={num_examples} "
                          "(the transfer set is empty)")
    if shard_size <= 0 or batch_size <= 0:
        raise ConfigError(f"shard_size and batch_size must be positive, got {shard_size}, {batch_size}")
    dtypes = dict(dtypes or {})
    bad = {k: v for k, v in dtypes.items() if v not in _STORABLE}
    if bad:
        raise ConfigError(f"unsupported dtypes {bad}; storable dtypes: {sorted(_STORABLE)}")
    out_dir = Path(out_dir)
    spec = {"num_examples": num_examples, "shard_size": shard_size, "dtypes": dtypes}
    identity = _normalize_json(_identity(fingerprint, spec))
    manifest = _prepare_dir(out_dir, identity, overwrite)
    if manifest is not None:
        return manifest

    state_path = out_dir / STATE
    state = read_json(state_path) if state_path.exists() else {"identity": identity, "features": None}
    if not state_path.exists():
        atomic_write_json(state_path, state)

    bounds = _shard_bounds(num_examples, shard_size)
    missing = [i for i in range(len(bounds)) if not (out_dir / shard_name(i, len(bounds))).exists()]
    done = num_examples - sum(bounds[i][1] - bounds[i][0] for i in missing)
    with tqdm(total=num_examples, initial=done, unit="ex", desc=f"caching to {out_dir.name}",
              disable=not progress) as bar:
        for i in missing:
            _write_shard(out_dir, i, len(bounds), *bounds[i], compute_batch, batch_size,
                         dtypes, state, bar)
    return _write_manifest(out_dir, identity, state["features"], bounds)


def _write_manifest(out_dir: Path, identity: dict, features: dict,
                    bounds: list[tuple[int, int]]) -> dict:
    """Describe the complete cache; written last so its presence means 'complete'."""
    shards = []
    for i, (start, end) in enumerate(bounds):
        name = shard_name(i, len(bounds))
        shards.append({"file": name, "num_examples": end - start,
                       "bytes": (out_dir / name).stat().st_size})
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "encoding": "one tf.train.Example per example; one bytes feature per key holding the "
                    "raw little-endian C-order array of that example",
        "fingerprint": identity["fingerprint"], "spec": identity["spec"],
        "num_examples": identity["spec"]["num_examples"],
        "shard_size": identity["spec"]["shard_size"],
        "num_shards": len(bounds), "features": features, "shards": shards,
        "total_bytes": sum(s["bytes"] for s in shards),
    }
    atomic_write_json(out_dir / MANIFEST, manifest)
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
    manifest = read_json(path)
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"{path} is not a {FORMAT} v{FORMAT_VERSION} manifest")
    return manifest


def cache_complete(out_dir: str | os.PathLike, fingerprint: dict) -> bool:
    """True if ``out_dir`` holds a complete cache for ``fingerprint`` with every shard
    present at its recorded size."""
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


def _parser(features: dict, keys: list[str], cast_float32: bool) -> Callable:
    """Parse function: one serialized Example -> {key: tensor} with static shapes."""
    description = {k: tf.io.FixedLenFeature([], tf.string) for k in keys}

    def parse(serialized: tf.Tensor) -> dict:
        raw = tf.io.parse_single_example(serialized, description)
        out = {}
        for key in keys:
            dtype = tf.as_dtype(features[key]["dtype"])
            values = tf.reshape(tf.io.decode_raw(raw[key], dtype, little_endian=True),
                                features[key]["shape"])
            out[key] = tf.cast(values, tf.float32) if cast_float32 and dtype == tf.float16 else values
        return out

    return parse


def read_sharded(out_dir: str | os.PathLike, *, keys: Optional[Iterable[str]] = None,
                 cast_float32: bool = True, cycle_length: int = 1) -> tf.data.Dataset:
    """Stream a complete cache as a dataset of per-example dicts with static shapes.

    ``keys`` selects features (default: all); ``cast_float32`` turns stored float16 back
    into float32. With the default ``cycle_length=1`` examples come in their original order
    (example i of the transfer set is element i); a larger value reads that many shards at
    once and interleaves their examples (faster on slow disks, order no longer by index).
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


def subset(ds: tf.data.Dataset, keep: np.ndarray) -> tf.data.Dataset:
    """The elements of ``ds`` where ``keep`` (one bool per element, in order) is True; elements
    past the end of ``keep`` are dropped."""
    keep = np.asarray(keep, dtype=bool)
    mask = tf.constant(keep)
    kept = ds.take(len(keep)).enumerate().filter(lambda i, _: tf.gather(mask, i)).map(lambda _, x: x)
    return kept.apply(tf.data.experimental.assert_cardinality(int(keep.sum())))
