"""The last silent failures (issue 32): a student that diverges, inputs that are not regular files,
data with no entities, a full disk, late or partial refusals.

Each case must fail on a run that keeps going (or reuses a stale step) and pass once the run
stops before the expensive work with one line naming the step or file and what was expected.
The bin/train cases run in one process (tests/train_cli_driver.py, one TensorFlow import).
"""
import errno
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, stderr_line_of
from test_bad_inputs import ENV, base_flags, error_line, tree_digest
from test_pipeline import toy_corpus  # noqa: F401  (a fixture, used by `corpus`)
from test_work_dir_safety import make_corpus

from xtremedistil_tf.benchmarks.registry import BENCHMARKS
from xtremedistil_tf.data.loading import DataConfig
from xtremedistil_tf.engine.loop import Engine, FitOptions
from xtremedistil_tf.errors import ConfigError, DataFormatError, TrainingDiverged, WorkDirError
from xtremedistil_tf.io import atomic_write_json
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.lock import work_dir_lock
from xtremedistil_tf.run.report import write_report
from xtremedistil_tf.run.workdir import STEP_FILE, WorkDir


def run_driver(root, argvs):
    """bin/train's body on each argument list in one process; [{"code", "stderr"}] per list."""
    (root / "cases.json").write_text(json.dumps(argvs), encoding="utf-8")
    subprocess.run([sys.executable, str(REPO / "tests" / "train_cli_driver.py"), str(root / "cases.json"),
                    str(root / "results.json")], env=ENV, check=True, capture_output=True, timeout=900)
    return json.loads((root / "results.json").read_text(encoding="utf-8"))


def json_files_with_nan(root) -> list:
    """Every JSON file under root whose text has a bare NaN or Infinity (not JSON), or that does not parse."""
    bad = []
    for path in root.rglob("*.json"):
        text = path.read_text(encoding="utf-8")
        if re.search(r"\bNaN\b|\bInfinity\b", text):
            bad.append(str(path))
            continue
        json.loads(text, parse_constant=lambda name: bad.append(f"{path}: {name}"))
    return bad


# ----------------------------------------------------------------------------- item 1: a diverging student

@pytest.mark.slow
def test_a_diverging_student_stops_naming_step_epoch_and_loss_and_keeps_the_old_student(tmp_path, toy_corpus,
                                                                                        tiny_bert_dir):
    work = tmp_path / "work"
    flags = base_flags(toy_corpus, tiny_bert_dir, work) + ["--strategy=D0-S"]
    [first] = run_driver(tmp_path, [flags])
    assert first["code"] == 0, first["stderr"][-3000:]
    student = tree_digest(work / "student")
    [diverged] = run_driver(tmp_path, [flags + ["--overwrite", "--student_learning_rate=1e30"]])
    assert diverged["code"] == 2, diverged["stderr"][-3000:]
    line = error_line(diverged["stderr"])
    match = re.fullmatch(r"error: step student: the (training|dev) loss became (nan|inf|-inf) in epoch 1 \(D0-S "
                         r"stage 1/1 \(labels\) step 1/1 \+.*\); nothing of the step was kept \(lower its learning "
                         r"rate, or check the data\)", line)
    assert match, line
    assert tree_digest(work / "student") == student   # the previous student, byte for byte
    assert not (work / "student.tmp").exists()
    assert json_files_with_nan(work) == []


def test_the_engine_stops_on_a_dev_loss_that_is_no_longer_finite():
    """The shared loop of every method (staged, multi-grained, NAS, subwords, teacher): a model
    whose training loss stays finite but whose dev loss is NaN stops in that epoch, dev selection
    never keeps the starting weights as if the epoch had merely not improved."""
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((4, 2), np.float32)
    train = tf.data.Dataset.from_tensor_slices((x, np.ones((4, 1), np.float32))).batch(4)
    dev = tf.data.Dataset.from_tensor_slices((x, np.full((4, 1), np.nan, np.float32))).batch(4)
    with pytest.raises(TrainingDiverged) as info:
        Engine(name="toy").fit(model, FitOptions(lambda seed, epoch: train, 3, dev=dev, baseline=False))
    assert str(info.value).startswith("step toy: the dev loss became nan in epoch 1; nothing of the step was kept")
    info.value.step = "ablate/D0"
    assert str(info.value).startswith("step ablate/D0 (toy): the dev loss became nan in epoch 1;")


def test_json_writing_never_writes_nan(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"loss": [1.0, math.nan], "best": math.inf, "low": -math.inf, "n": 2})
    assert json.loads((tmp_path / "a.json").read_text()) == {"loss": [1.0, None], "best": None, "low": None, "n": 2}
    assert json_files_with_nan(tmp_path) == []


# ----------------------------------------------------------------------------- items 2, 3: streams

def feed(fifo, text: str) -> threading.Thread:
    """A writer that gives `text` to the FIFO's next reader (a daemon: a run that never reads it cannot hang)."""
    thread = threading.Thread(target=lambda: Path(fifo).write_text(text, encoding="utf-8"), daemon=True)
    thread.start()
    return thread


def test_an_input_that_is_a_stream_is_fingerprinted_by_what_was_read(tmp_path, monkeypatch):
    """`--train_file=<(...)` or a FIFO: no size or mtime says whether it changed, so the data step
    hashes what it read; a rerun with other content is refused naming the file, never reused."""
    corpus = make_corpus(tmp_path / "corpus")
    pipe = corpus / "train.pipe"
    os.mkfifo(pipe)
    text = (corpus / "train.txt").read_text(encoding="utf-8")
    work = tmp_path / "work"
    cfg = pipeline.RunConfig(work_dir=str(work), data=DataConfig(data_dir=str(corpus), train_file="train.pipe",
                                                                 test_file="test.txt", seed=42))
    feed(pipe, text)
    pipeline.step_data(WorkDir(work), cfg)
    stamp = json.loads((work / "data" / STEP_FILE).read_text())["inputs"][str(pipe)]
    assert stamp["sha256"] == hashlib.sha256(text.encode()).hexdigest() and stamp["size"] == len(text.encode())
    before = tree_digest(work)
    feed(pipe, text)                          # the same content again: the step is reused
    pipeline.step_data(WorkDir(work), cfg)
    assert tree_digest(work) == before
    changed = text + "mary B-PER\n\n"
    feed(pipe, changed)
    with pytest.raises(ConfigError, match=rf"^{work / 'data'} was made from other input files \({pipe} "
                                          rf"\(--train_file\) changed since the step read it \({len(text)} bytes "
                                          rf"then, {len(changed)} now\)\)"):
        pipeline.step_data(WorkDir(work), cfg)
    assert tree_digest(work) == before and not (work / "data.read.tmp").exists()
    feed(pipe, changed)                       # --overwrite redoes it from what it reads now
    pipeline.step_data(WorkDir(work, overwrite=True), cfg)
    assert json.loads((work / "data" / STEP_FILE).read_text())["inputs"][str(pipe)]["size"] == len(changed)
    feed(pipe, "john B-PER\nsays O extra\n\n")   # a bad line is named in the stream, not in its copy
    with pytest.raises(DataFormatError) as info:
        pipeline.step_data(WorkDir(tmp_path / "other"), cfg)
    assert (info.value.path, info.value.line) == (str(pipe), 2)
    # A relative --work_dir with a --data_dir: the copy of the stream is still found (not put under --data_dir).
    monkeypatch.chdir(tmp_path)
    feed(pipe, text)
    pipeline.step_data(WorkDir("relative"), cfg)
    assert (tmp_path / "relative" / "data" / "train.jsonl").exists()


def test_a_fifo_without_writer_says_so_and_sigterm_leaves_no_temporary_dir(tmp_path, toy_corpus, tiny_bert_dir):
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, str(REPO / "bin" / "train"),
                             *base_flags(toy_corpus, tiny_bert_dir, work), f"--train_file={fifo}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    with stderr_line_of(proc, b"reading") as line:
        assert line == f"reading {fifo} (waiting for a writer)"
        assert (work / "data.read.tmp").is_dir()   # the step had started when it blocked
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err.decode()[-3000:]   # 128 + SIGTERM, as a shell reports it
    assert err.decode().strip().splitlines()[-1] == "interrupted; rerun the same command to resume from step data"
    assert [p.name for p in work.iterdir() if p.name.endswith(".tmp")] == []


# ----------------------------------------------------------------------------- item 4: OSErrors name step and path

def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))   # as a write() says it: no file name


def test_a_full_disk_from_the_start_names_the_lock_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "pwrite", full_disk)
    with pytest.raises(ConfigError) as info:
        with work_dir_lock(tmp_path / "w"):
            pass
    assert str(info.value) == (f"--work_dir={tmp_path / 'w'} cannot be written: {tmp_path / 'w' / '.lock'}: "
                               "No space left on device")


@pytest.mark.parametrize("error, message", [
    (OSError(errno.ENOSPC, "No space left on device"), "step transfer failed: No space left on device ({})"),
    (OSError(errno.EIO, "Input/output error", "/data/shard-3.npz"),
     "step transfer failed: /data/shard-3.npz: Input/output error"),
    (OSError(errno.EIO, "Input/output error"), "step transfer failed: {}: Input/output error"),
])
def test_every_os_error_leaving_a_step_names_the_step_and_a_path(tmp_path, monkeypatch, error, message):
    """The teacher-output cache is written in place, outside run_step: its errors are named too."""
    def fails(*args, **kwargs):
        raise error

    monkeypatch.setattr(pipeline, "step_data", lambda *args, **kwargs: {})
    monkeypatch.setattr(pipeline, "step_teacher", lambda *args, **kwargs: {})
    monkeypatch.setattr(pipeline, "step_transfer", fails)
    work = WorkDir(tmp_path / "w")
    with pytest.raises(WorkDirError) as info:
        pipeline._run_steps(work, pipeline.RunConfig(work_dir=str(work.root)), None)
    assert str(info.value) == message.format(work.path("transfer"))


def test_an_os_error_inside_run_step_names_the_step_and_its_dir(tmp_path):
    work = WorkDir(tmp_path / "w")
    with pytest.raises(WorkDirError, match=rf"^step data failed: {tmp_path / 'w' / 'data'}: Input/output error$"):
        work.run_step("data", {}, lambda tmp: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")))
    assert not (tmp_path / "w" / "data.tmp").exists()


# ----------------------------------------------------------------------------- item 6: late or partial refusals

def test_an_input_that_is_still_there_is_not_called_gone(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    (corpus / "other.txt").write_text((corpus / "train.txt").read_text(encoding="utf-8") + "mary B-PER\n\n",
                                      encoding="utf-8")
    work = tmp_path / "work"

    def data(train_file):
        return pipeline.RunConfig(work_dir=str(work), data=DataConfig(data_dir=str(corpus), train_file=train_file,
                                                                      test_file="test.txt", seed=42))

    pipeline.step_data(WorkDir(work), data("train.txt"))
    with pytest.raises(ConfigError) as info:
        pipeline.step_data(WorkDir(work), data("other.txt"))
    assert f"{corpus / 'train.txt'} (--train_file) is no longer an input (the flags name other files now)" \
        in str(info.value)
    assert "gone" not in str(info.value)
    (corpus / "train.txt").unlink()
    with pytest.raises(ConfigError, match=r"train.txt \(--train_file\) is gone since the step read it"):
        pipeline.step_data(WorkDir(work), data("other.txt"))


def test_a_work_dir_reached_through_a_symlink_keeps_its_own_name_in_the_report(tmp_path, monkeypatch):
    real = tmp_path / "wikiann-d42"
    real.mkdir()
    scores = {"test": {"all": {"f1": 0.5, "precision": 0.4, "recall": 0.6, "sentences": 3}, "decode": "constrained"}}
    (real / "metrics.json").write_text(json.dumps({"teacher": {"scores": scores, "parameters": 10}}))
    (tmp_path / "latest").symlink_to(real)
    assert write_report(tmp_path / "latest").read_text().splitlines()[0] == "# Report: wikiann-d42"
    monkeypatch.chdir(tmp_path / "latest")
    assert write_report(".").read_text().splitlines()[0] == "# Report: wikiann-d42"


def test_export_to_a_file_is_refused_before_any_model_is_loaded(tmp_path):
    """The student dir does not exist: a check made after loading the student would report that
    instead (on main the export dir failed only after the export's work)."""
    toy_student_dir = tmp_path / "no_student"
    (tmp_path / "a_file").write_text("not a directory")
    for export_dir, problem in ((tmp_path / "a_file", "is a file"),
                                (tmp_path / "a_file" / "models", f"is under {tmp_path / 'a_file'}, which is a file")):
        proc = subprocess.run([sys.executable, str(REPO / "bin" / "export"), f"--student_dir={toy_student_dir}",
                               f"--export_dir={export_dir}"], capture_output=True, text=True, env=ENV, timeout=600)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert error_line(proc.stderr) == (f"error: --export_dir={export_dir} {problem}; expected a directory "
                                           "(created if missing)")
        assert "loading" not in proc.stderr.lower() and proc.stdout == ""


def test_benchmark_help_lists_its_subcommands_first_one_line_each():
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "benchmark"), "--help"], capture_output=True, text=True,
                          env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[2] == "Subcommands:"
    listed = [line.split()[0] for line in lines[3:3 + len(BENCHMARKS)]]
    assert listed == sorted(BENCHMARKS) == ["cache", "crf", "decoders", "deployed", "embedding_drift", "finetune_memory",
                                           "formats",
                                           "latency", "lengths", "memory", "peers", "precision", "served_text",
                                           "teacher"]
    assert lines[3 + len(BENCHMARKS)] == ""
