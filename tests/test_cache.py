"""Sharded teacher-output cache: round trip, odd sizes, kill/resume, tmp files, fingerprints."""
from __future__ import annotations

import os
import shutil
import zlib
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.transfer import cache

T, N, H = 6, 5, 8
NUM = 37          # not a multiple of SHARD or of either batch size
SHARD = 8         # -> 5 shards: 8, 8, 8, 8, 5
FP = {"teacher": "tiny-bert", "layer": 3, "max_seq_length": T}
DTYPES = {"hidden": "float16"}


def example_arrays(i: int) -> dict[str, np.ndarray]:
    """Arrays of example i, from a generator keyed by i so batch boundaries cannot matter."""
    rng = np.random.default_rng([1234, i])
    return {
        "ids": np.full(T, i, np.int32) + rng.integers(0, 1000, T, dtype=np.int32),
        "logits": rng.standard_normal((T, N)).astype(np.float32),
        # Varied magnitudes so float16 rounding is visible (1/3 is not a float16).
        "hidden": (rng.standard_normal((T, H)) * 100 + 1 / 3).astype(np.float32),
    }


def compute_batch(rows) -> dict[str, np.ndarray]:
    """Stack the examples `rows`."""
    rows = [example_arrays(int(i)) for i in rows]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def read_all(out_dir, **kwargs) -> dict[str, np.ndarray]:
    """The whole cache as stacked numpy arrays, in dataset order."""
    rows = list(cache.read_sharded(out_dir, **kwargs).as_numpy_iterator())
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def shard_paths(out_dir: Path) -> list[Path]:
    return sorted(out_dir.glob("shard-*.tfrecord"))


def write(out_dir, compute=compute_batch, **kwargs) -> dict:
    """write_sharded with this file's defaults."""
    args = dict(shard_size=SHARD, batch_size=5, fingerprint=FP, dtypes=DTYPES, progress=False)
    args.update(kwargs)
    return cache.write_sharded(out_dir, NUM, compute, **args)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted run (batch size 5), shared read-only by the tests."""
    out = tmp_path_factory.mktemp("reference")
    write(out)
    return out


def test_round_trip_values_order_static_shapes(reference):
    ds = cache.read_sharded(reference)
    assert ds.element_spec == {
        "ids": tf.TensorSpec((T,), tf.int32),
        "logits": tf.TensorSpec((T, N), tf.float32),
        "hidden": tf.TensorSpec((T, H), tf.float32),
    }
    assert int(ds.cardinality()) == NUM
    got = read_all(reference)
    want = compute_batch(range(NUM))
    np.testing.assert_array_equal(got["ids"], want["ids"])          # order and ints exact
    np.testing.assert_array_equal(got["logits"], want["logits"])    # float32 bit-exact
    # float16 storage: exactly the float16 rounding of the input, not the input itself.
    np.testing.assert_array_equal(got["hidden"], want["hidden"].astype(np.float16).astype(np.float32))
    assert not np.array_equal(got["hidden"], want["hidden"])


def test_keys_subset_and_float16_kept(reference):
    ds = cache.read_sharded(reference, keys=["hidden"], cast_float32=False)
    assert ds.element_spec == {"hidden": tf.TensorSpec((T, H), tf.float16)}
    got = np.stack(list(ds.map(lambda x: x["hidden"]).as_numpy_iterator()))
    np.testing.assert_array_equal(got, compute_batch(range(NUM))["hidden"].astype(np.float16))
    with pytest.raises(ConfigError, match="no feature.*'mask'"):
        cache.read_sharded(reference, keys=["mask"])


def test_manifest_and_disk_cost(reference, tmp_path):
    m = cache.load_manifest(reference)
    assert m["num_examples"] == NUM and m["num_shards"] == 5 and m["shard_size"] == SHARD
    assert [s["num_examples"] for s in m["shards"]] == [8, 8, 8, 8, 5]
    assert [s["file"] for s in m["shards"]] == [p.name for p in shard_paths(reference)]
    assert m["shards"][2]["file"] == "shard-00002-of-00005.tfrecord"
    assert m["features"] == {"ids": {"dtype": "int32", "shape": [T]},
                             "logits": {"dtype": "float32", "shape": [T, N]},
                             "hidden": {"dtype": "float16", "shape": [T, H]}}
    assert m["fingerprint"] == FP
    assert m["total_bytes"] == sum(p.stat().st_size for p in shard_paths(reference))
    assert cache.disk_bytes_per_1000(reference) == pytest.approx(1000 * m["total_bytes"] / NUM)
    # float16 saves 2 bytes per hidden value against float32 (plus a few bytes of
    # protobuf length varints per example that grow with the payload).
    saved = write(tmp_path, dtypes=None)["total_bytes"] - m["total_bytes"]
    assert NUM * T * H * 2 <= saved <= NUM * (T * H * 2 + 8)


def test_odd_sizes_single_partial_shard(tmp_path):
    m = cache.write_sharded(tmp_path, 3, compute_batch, shard_size=1000, batch_size=2,
                            fingerprint=FP, progress=False)
    assert m["num_shards"] == 1 and m["shards"][0]["num_examples"] == 3
    assert (tmp_path / "shard-00000-of-00001.tfrecord").is_file()
    np.testing.assert_array_equal(read_all(tmp_path)["logits"], compute_batch(range(3))["logits"])


def test_zero_examples_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="num_examples=0"):
        cache.write_sharded(tmp_path, 0, compute_batch, fingerprint=FP, progress=False)


def test_complete_cache_is_reused_without_computing(reference):
    def must_not_run(rows):
        raise AssertionError("recomputed a complete cache")

    assert write(reference, must_not_run)["num_examples"] == NUM
    assert cache.cache_complete(reference, FP)
    assert not cache.cache_complete(reference, {**FP, "layer": 4})


_KILLED_WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import xtremedistil_tf  # sets TF_USE_LEGACY_KERAS before TensorFlow loads
    import test_cache as tc
    from xtremedistil_tf.transfer.cache import write_sharded

    def blocks_in_shard_2(rows):
        # Hang inside shard 2 (its .tmp is open) until the test kills this process.
        if rows[0] >= 2 * tc.SHARD:
            time.sleep(600)
        return tc.compute_batch(rows)

    write_sharded({out!r}, tc.NUM, blocks_in_shard_2, shard_size=tc.SHARD, batch_size=3,
                  fingerprint=tc.FP, dtypes=tc.DTYPES, progress=False)
""")


def _run_and_kill_after_two_shards(out: Path) -> None:
    """Start a writer in a subprocess and SIGKILL it once shards 0-1 are committed and
    shard 2 is half-written, so the kill lands at a known point."""
    script = _KILLED_WRITER.format(tests=str(Path(__file__).parent), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE,
                            env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    tmp = out / "shard-00002-of-00005.tfrecord.tmp"
    deadline = time.monotonic() + 120
    try:
        while not (len(shard_paths(out)) == 2 and tmp.exists()):
            if proc.poll() is not None:
                pytest.fail(f"writer exited early ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("writer did not reach shard 2 within 120 s")
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


def test_killed_run_resumes_and_matches_uninterrupted(reference, tmp_path):
    out = tmp_path / "killed"
    _run_and_kill_after_two_shards(out)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in shard_paths(out)}
    assert sorted(before) == ["shard-00000-of-00005.tfrecord", "shard-00001-of-00005.tfrecord"]
    assert not (out / cache.MANIFEST).exists()
    with pytest.raises(ConfigError, match="incomplete.*rerun"):
        cache.read_sharded(out)
    assert not cache.cache_complete(out, FP)

    computed = []

    def recording(rows):
        computed.append((rows[0], rows[-1] + 1))
        return compute_batch(rows)

    write(out, recording, batch_size=3)
    assert computed[0] == (16, 19)                  # resumed at shard 2, not from scratch
    assert not list(out.glob("*.tmp"))
    for name, stat in before.items():              # committed shards were not rewritten
        assert ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) == stat
    # Byte-identical to the uninterrupted run (which used another batch size).
    assert [p.name for p in shard_paths(out)] == [p.name for p in shard_paths(reference)]
    for mine, ref in zip(shard_paths(out), shard_paths(reference)):
        assert mine.read_bytes() == ref.read_bytes(), mine.name
    got, want = read_all(out), read_all(reference)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    assert cache.cache_complete(out, FP)
    assert not (out / cache.STATE).exists()


def test_failed_run_leaves_no_tmp_and_rerun_removes_a_killed_writers(reference, tmp_path):
    def fails_in_shard_3(rows):
        if rows[0] >= 3 * SHARD:
            raise RuntimeError("teacher crashed")
        return compute_batch(rows)

    with pytest.raises(RuntimeError, match="teacher crashed"):
        write(tmp_path, fails_in_shard_3)
    tmp = tmp_path / "shard-00003-of-00005.tfrecord.tmp"
    assert not tmp.exists() and len(shard_paths(tmp_path)) == 3   # a failed shard removes its .tmp
    tmp.write_bytes(b"garbage a reader must never see")   # as a killed writer (SIGKILL) leaves it
    (tmp_path / "notes.tmp").write_text("not ours")
    write(tmp_path)
    assert not tmp.exists()
    assert (tmp_path / "notes.tmp").read_text() == "not ours"   # only the cache's own files go
    for mine, ref in zip(shard_paths(tmp_path), shard_paths(reference), strict=True):
        assert mine.read_bytes() == ref.read_bytes(), mine.name


def test_damaged_complete_cache_recomputes_only_damaged_shards(reference, tmp_path):
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    manifest = cache.load_manifest(tmp_path)
    assert [s["crc32"] for s in manifest["shards"]] == [zlib.crc32(p.read_bytes()) for p in shard_paths(reference)]
    assert cache.damaged_shards(tmp_path) == []
    (tmp_path / "shard-00001-of-00005.tfrecord").unlink()
    truncated = tmp_path / "shard-00003-of-00005.tfrecord"
    truncated.write_bytes(truncated.read_bytes()[:-10])
    flipped = tmp_path / "shard-00004-of-00005.tfrecord"   # same size, one byte changed (a bad disk, a bad copy)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    size = manifest["shards"][3]["bytes"]
    assert cache.damaged_shards(tmp_path) == [
        (tmp_path / "shard-00001-of-00005.tfrecord", "missing"),
        (truncated, f"cut short or damaged ({size - 10:,} bytes; manifest.json records {size:,})"),
        (flipped, "damaged (its CRC-32 differs from the one manifest.json records)")]
    assert not cache.cache_complete(tmp_path, FP)
    computed = []

    def recording(rows):
        computed.append(rows[0])
        return compute_batch(rows)

    write(tmp_path, recording)
    assert sorted(set(s // SHARD for s in computed)) == [1, 3, 4]
    for mine, ref in zip(shard_paths(tmp_path), shard_paths(reference), strict=True):
        assert mine.read_bytes() == ref.read_bytes(), mine.name
    assert cache.cache_complete(tmp_path, FP)


def test_fingerprint_mismatch_raises_and_overwrite_clears(reference, tmp_path):
    out = tmp_path / "cache"
    shutil.copytree(reference, out)
    (out / "README.txt").write_text("user file")
    other = {**FP, "layer": 7, "data": "wikiann-sw"}
    with pytest.raises(ConfigError) as err:
        write(out, fingerprint=other)
    msg = str(err.value)
    assert str(out) in msg and "overwrite=True" in msg
    assert "fingerprint.layer: on disk 3, requested 7" in msg
    assert 'fingerprint.data: on disk "<missing>", requested "wikiann-sw"' in msg
    assert "fingerprint.teacher" not in msg                     # equal keys are not listed
    assert cache.cache_complete(out, FP)                        # nothing was deleted

    with pytest.raises(ConfigError, match="spec.shard_size: on disk 8, requested 10"):
        write(out, shard_size=10)

    write(out, fingerprint=other, overwrite=True)
    assert cache.cache_complete(out, other) and not cache.cache_complete(out, FP)
    assert (out / "README.txt").read_text() == "user file"


def test_partial_cache_of_other_fingerprint_raises(tmp_path):
    def fails_in_shard_1(rows):
        if rows[0] >= SHARD:
            raise RuntimeError("stop")
        return compute_batch(rows)

    with pytest.raises(RuntimeError):
        write(tmp_path, fails_in_shard_1)
    with pytest.raises(ConfigError, match="fingerprint.layer: on disk 3, requested 4"):
        write(tmp_path, fingerprint={**FP, "layer": 4})
    (tmp_path / cache.STATE).unlink()                           # shards of unknown origin
    with pytest.raises(ConfigError, match="fingerprint is unknown"):
        write(tmp_path)


def test_bad_batches_are_reported(tmp_path):
    def ragged(rows):
        batch = compute_batch(rows)
        if rows[0] > 0:
            batch["ids"] = batch["ids"][:, :-1]
        return batch

    with pytest.raises(ConfigError, match=r"compute_batch\(rows 5\.\.7\) returned 'ids' with shape \(3, 5\); expected \(3, 6\)"):
        write(tmp_path / "ragged", ragged)

    def huge(rows):
        return {"logits": np.full((len(rows), T), 1e6, np.float32)}

    with pytest.raises(ConfigError, match="'logits' as float16 overflows"):
        write(tmp_path / "huge", huge, dtypes={"logits": "float16"})

    with pytest.raises(ConfigError, match=r"dtypes, encodings or ragged name \['hiden'\]"):
        write(tmp_path / "typo", dtypes={"hiden": "float16"})


def test_lengths_group_each_shards_batches_by_length_and_store_in_index_order(reference, tmp_path):
    lengths = np.random.default_rng(5).integers(1, 50, NUM)
    batches = []

    def recording(rows):
        batches.append(np.asarray(rows))
        return compute_batch(rows)

    write(tmp_path, recording, lengths=lengths)
    for shard, (start, end) in enumerate(cache._shard_bounds(NUM, SHARD)):
        mine = [b for b in batches if start <= b[0] < end]
        assert all(b.max() < end and b.min() >= start for b in mine)   # batches stay in their shard
        order = np.concatenate(mine)
        assert order.tolist() == (start + np.argsort(lengths[start:end], kind="stable")).tolist(), shard
        assert [len(b) for b in mine] == [min(5, end - start - i) for i in range(0, end - start, 5)]
    # Stored in index order: the very bytes of the uninterrupted run in order.
    for mine, ref in zip(shard_paths(tmp_path), shard_paths(reference), strict=True):
        assert mine.read_bytes() == ref.read_bytes(), mine.name
    with pytest.raises(ConfigError, match=r"lengths has shape \(3,\); expected one per example, \(37,\)"):
        write(tmp_path / "bad", lengths=lengths[:3])
