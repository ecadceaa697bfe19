"""One teacher-output cache written by several workers (issue 30 item 2): each worker of TF_CONFIG's
cluster writes its own shards (s % W == w) into the shared directory, whichever sees them all writes
the manifest, and a killed worker's rerun redoes only its missing shards."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cache_worker_driver as driver
import numpy as np
import pytest
import tensorflow as tf
import test_cache as tc
from conftest import TOY_LABELS

from xtremedistil_tf.engine.distribute import worker_of_cluster
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.teachers.model import build_teacher
from xtremedistil_tf.transfer import cache, outputs
from xtremedistil_tf.transfer.cache import read_arrays

DRIVER = Path(__file__).parent / "cache_worker_driver.py"
SHARD = 6
WORKERS = ["localhost:20001", "localhost:20002"]   # read by the resolver only: generation opens no port


def tf_config(index: int) -> str:
    return json.dumps({"cluster": {"worker": WORKERS}, "task": {"type": "worker", "index": index}})


def run_parts(out: Path, count: int, **kwargs) -> list:
    """write_sharded of test_cache's examples by `count` workers at once (threads); their manifests."""
    results, errors = [None] * count, []

    def worker(index):
        try:
            results[index] = tc.write(out, part=(index, count), **kwargs)
        except Exception as e:  # reported by the test's thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one_process")
    tc.write(out)
    return out


@pytest.mark.parametrize("count", [2, 3, 7])   # 7 workers for 5 shards: two write none
def test_parts_write_the_bytes_of_one_process(one_process, tmp_path, count):
    manifests = run_parts(tmp_path, count)
    want = cache.load_manifest(one_process)
    assert all(m == want for m in manifests)
    assert [p.name for p in tc.shard_paths(tmp_path)] == [p.name for p in tc.shard_paths(one_process)]
    for mine, ref in zip(tc.shard_paths(tmp_path), tc.shard_paths(one_process)):
        assert mine.read_bytes() == ref.read_bytes(), mine.name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in one_process.iterdir())


def test_a_worker_other_than_0_waits_for_worker_0_to_clear_another_run(one_process, tmp_path):
    tc.write(tmp_path, fingerprint={**tc.FP, "layer": 9})
    with pytest.raises(ConfigError, match="different configuration"):
        tc.write(tmp_path, part=(1, 2))
    done = []
    late = threading.Thread(target=lambda: done.append(tc.write(tmp_path, part=(1, 2), overwrite=True)),
                            daemon=True)
    late.start()
    time.sleep(3 * cache.POLL_SECONDS)
    assert not done and cache.load_manifest(tmp_path)["fingerprint"]["layer"] == 9   # waits, deletes nothing
    tc.write(tmp_path, part=(0, 2), overwrite=True)
    late.join(60)
    assert done and done[0] == cache.load_manifest(one_process)
    for mine, ref in zip(tc.shard_paths(tmp_path), tc.shard_paths(one_process)):
        assert mine.read_bytes() == ref.read_bytes(), mine.name


def test_worker_of_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert worker_of_cluster() == (0, 1)
    monkeypatch.setenv("TF_CONFIG", tf_config(1))
    assert worker_of_cluster() == (1, 2)
    cluster = {"chief": ["c:1"], "worker": ["w:1", "w:2"]}
    for task, want in ((("chief", 0), (0, 3)), (("worker", 0), (1, 3)), (("worker", 1), (2, 3))):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": task[0], "index": task[1]}}))
        assert worker_of_cluster() == want
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 5}}))
    with pytest.raises(ConfigError, match="not in its cluster"):
        worker_of_cluster()


# ---------------------------------------------------------------- worker processes on a tiny teacher

@pytest.fixture(scope="module")
def teacher_cache(tmp_path_factory, tiny_bert_dir):
    """A saved tiny teacher (BERT, 2 layers, hidden 32), the driver's spec, and the cache one process
    writes (in this process, with TensorFlow's default threads: the workers use one thread each)."""
    root = tmp_path_factory.mktemp("workers")
    tf.keras.utils.set_random_seed(0)
    teacher, tokenizer = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16, dropout=0.0,
                                       random_init=True)
    teacher.save(root / "teacher", tokenizer)
    spec = {"teacher": str(root / "teacher"), "sentences": 40, "max_len": 16, "shard_size": SHARD,
            "batch_size": 4, "hang_from": None}
    windows, teacher = driver.windows_and_teacher(spec)
    manifest = driver.write({**spec, "out": str(root / "one_process")}, windows, teacher)
    assert manifest["num_shards"] >= 4   # worker 1 has two shards or more to be killed between
    return spec, root / "one_process"


def start_worker(spec: dict, out: Path, index: int, hang_from=None) -> subprocess.Popen:
    path = out.parent / f"spec-{out.name}-{index}-{hang_from}.json"
    path.write_text(json.dumps({**spec, "out": str(out), "hang_from": hang_from}))
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CONFIG": tf_config(index)}
    return subprocess.Popen([sys.executable, str(DRIVER), str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def finish(proc: subprocess.Popen, limit_s: float = 240) -> str:
    out, err = proc.communicate(timeout=limit_s)
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode()


def assert_same_examples(got_dir: Path, want_dir: Path) -> None:
    """Example by example: ids, mask and labels equal; logits (float32) and hidden (float16) within
    their storage's rounding (the workers ran the teacher on one thread, the reference on several)."""
    got, want = cache.load_manifest(got_dir), cache.load_manifest(want_dir)
    assert [(s["file"], s["num_examples"]) for s in got["shards"]] == \
           [(s["file"], s["num_examples"]) for s in want["shards"]]
    assert got["features"] == want["features"] and got["fingerprint"] == want["fingerprint"]
    got_rows = list(cache.read_sharded(got_dir, cast_float32=False).as_numpy_iterator())
    want_rows = list(cache.read_sharded(want_dir, cast_float32=False).as_numpy_iterator())
    assert len(got_rows) == len(want_rows) == want["num_examples"]
    for i, (g, w) in enumerate(zip(got_rows, want_rows)):
        for key in ("input_ids", "attention_mask", "label_ids"):
            np.testing.assert_array_equal(g[key], w[key], err_msg=f"example {i} {key}")
        np.testing.assert_allclose(g["logits"], w["logits"], rtol=1e-5, atol=1e-6, err_msg=f"example {i}")
        assert g["hidden"].dtype == np.float16
        np.testing.assert_allclose(g["hidden"].astype(np.float32), w["hidden"].astype(np.float32),
                                   rtol=2 ** -10, atol=1e-6, err_msg=f"example {i} hidden")


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_two_worker_processes_write_the_one_process_cache(teacher_cache, tmp_path):
    spec, one_process = teacher_cache
    out = tmp_path / "cache"
    workers = [start_worker(spec, out, index) for index in (0, 1)]
    outputs = [finish(w) for w in workers]
    num_shards = cache.load_manifest(one_process)["num_shards"]
    assert all(o.strip() == f"manifest {num_shards}" for o in outputs)
    assert not list(out.glob("*.tmp")) and not (out / cache.STATE).exists()
    assert_same_examples(out, one_process)


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_killed_worker_rerun_redoes_only_its_missing_shards(teacher_cache, tmp_path):
    spec, one_process = teacher_cache
    out = tmp_path / "cache"
    num_shards = cache.load_manifest(one_process)["num_shards"]
    names = [cache.shard_name(i, num_shards) for i in range(num_shards)]
    # Worker 1 (shards 1, 3, ...) hangs inside shard 3, with shard 1 committed: SIGKILL it there.
    killed = start_worker(spec, out, 1, hang_from=3 * SHARD)
    survivor = start_worker(spec, out, 0)
    deadline = time.monotonic() + 240
    try:
        while not ((out / names[1]).exists() and (out / (names[3] + ".tmp")).exists()):
            assert killed.poll() is None, killed.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "worker 1 did not reach shard 3"
            time.sleep(0.1)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.communicate()
    assert killed.returncode == -signal.SIGKILL
    # Worker 0 writes all of its shards, then waits for worker 1's: no manifest meanwhile.
    while not all((out / names[i]).exists() for i in range(0, num_shards, 2)):
        assert survivor.poll() is None, survivor.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "worker 0 did not write its shards"
        time.sleep(0.1)
    time.sleep(4 * cache.POLL_SECONDS)
    assert survivor.poll() is None and not (out / cache.MANIFEST).exists()
    assert not (out / names[3]).exists() and (out / (names[3] + ".tmp")).exists()
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tc.shard_paths(out)}
    assert sorted(before) == sorted(names[i] for i in range(num_shards) if i % 2 == 0 or i == 1)

    rerun = start_worker(spec, out, 1)
    assert finish(rerun).strip() == f"manifest {num_shards}"
    assert finish(survivor).strip() == f"manifest {num_shards}"
    for name, stat in before.items():   # finished shards (worker 1's shard 1 too) were not rewritten
        assert ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) == stat, name
    assert not list(out.glob("*.tmp")) and not (out / cache.STATE).exists()
    assert_same_examples(out, one_process)


def test_length_grouped_teacher_outputs_equal_the_in_order_ones_for_less_padding(teacher_cache, tmp_path,
                                                                                monkeypatch):
    """write_teacher_outputs batches each shard's windows by length (the default): the cache holds the
    outputs of the in-order run, row for row (to float rounding), and the teacher ran on fewer padded
    positions."""
    spec, _ = teacher_cache
    windows, teacher = driver.windows_and_teacher(spec)
    padded = {}   # run -> pieces the teacher computed, padding included
    compute = outputs.compute_window_outputs

    def counting(run, windows_, rows, first_pieces=False):
        padded[current] = padded.get(current, 0) + len(rows) * int(windows_.attention_mask[rows].sum(1).max())
        return compute(run, windows_, rows, first_pieces)

    monkeypatch.setattr(outputs, "compute_window_outputs", counting)
    got = {}
    for current in ("in_order", "grouped"):
        outputs.write_teacher_outputs(teacher, windows, tmp_path / current, layer=1, fingerprint={"test": current},
                                      shard_size=spec["shard_size"], batch_size=spec["batch_size"],
                                      progress=False, group_by_length=current == "grouped")
        got[current] = read_arrays(tmp_path / current, length=spec["max_len"])
    for name in ("input_ids", "attention_mask", "label_ids"):
        np.testing.assert_array_equal(got["grouped"][name], got["in_order"][name])
    for name in ("logits", "hidden"):
        np.testing.assert_allclose(got["grouped"][name], got["in_order"][name], atol=2e-3, rtol=2e-3)
    assert padded["grouped"] < padded["in_order"]
    lengths = outputs.window_lengths(windows)
    shards = [lengths[s:s + spec["shard_size"]] for s in range(0, len(lengths), spec["shard_size"])]
    work = {"in_order": 0, "grouped": 0}
    for shard in shards:
        for name, order in (("in_order", shard), ("grouped", np.sort(shard))):
            work[name] += sum(len(order[b:b + 4]) * order[b:b + 4].max() for b in range(0, len(order), 4))
    assert padded == work
