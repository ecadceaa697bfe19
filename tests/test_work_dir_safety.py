"""Nothing lost, nothing stale (issue 16, items 1, 2, 5, 6): input files are fingerprinted by
content, --overwrite replaces an artifact only once its successor is complete, one run per work
dir (a lock), and Ctrl-C ends in one line and exit 130.

A refused run must leave every artifact that existed before it byte for byte. The bin/train cases
run in one process (tests/train_cli_driver.py); the finished run they start from is faked (data/
made for real, teacher/ and student/ as step.json files), so no training is needed.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from conftest import REPO, toy_ner_sentences
from test_bad_inputs import ENV, base_flags, bin_train, error_line, tree_digest
from test_pipeline import write_conll

from xtremedistil_tf.data.loading import DataConfig
from xtremedistil_tf.errors import ConfigError, Interrupted, WorkDirError
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.lock import work_dir_lock
from xtremedistil_tf.run.workdir import STEP_FILE, WorkDir, fingerprint_hash, write_error_reason

# Written by every run, refused or not: never a step's artifact.
RUN_FILES = {"run.log", "config.json", ".lock"}


def make_corpus(root):
    root.mkdir(parents=True, exist_ok=True)
    write_conll(root / "train.txt", toy_ner_sentences(60, seed=3))
    write_conll(root / "test.txt", toy_ner_sentences(20, seed=4))
    return root


def data_config(corpus, **fields) -> DataConfig:
    """The DataConfig bin/train makes from test_bad_inputs.base_flags."""
    return DataConfig(data_dir=str(corpus), train_file="train.txt", test_file="test.txt", seed=42, **fields)


def finished_work_dir(work, corpus):
    """A work dir as a finished run leaves it: data/ made for real, the later steps faked."""
    work_dir = WorkDir(work)
    pipeline.step_data(work_dir, pipeline.RunConfig(work_dir=str(work), data=data_config(corpus)))
    for step in ("teacher", "transfer", "student"):
        (work / step).mkdir()
        (work / step / STEP_FILE).write_text(json.dumps({"hash": f"made-by-{step}", "fingerprint": {}, "info": {}}))
        (work / step / "weights.bin").write_bytes(os.urandom(256))
    (work / "metrics.json").write_text(json.dumps({"student": {"scores": "of the student on disk"}}))
    return tree_digest(work)


def without_run_files(digest: dict) -> dict:
    return {k: v for k, v in digest.items() if k not in RUN_FILES}


# ----------------------------------------------------------------------------- item 1: input files

def test_an_edited_input_file_is_refused_naming_it(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    cfg = pipeline.RunConfig(work_dir=str(work), data=data_config(corpus))
    pipeline.step_data(WorkDir(work), cfg)
    before = tree_digest(work)
    # Touched, same content: the hash says nothing changed; the new mtime becomes the fast check.
    os.utime(corpus / "train.txt", ns=(1, 1))
    pipeline.step_data(WorkDir(work), cfg)
    stamps = json.loads((work / "data" / STEP_FILE).read_text())["inputs"]
    assert stamps[str(corpus / "train.txt")]["mtime_ns"] == 1
    assert set(stamps) == {str(corpus / "train.txt"), str(corpus / "test.txt")}
    # Same size and mtime: the file is not read again (a changed file that kept both is not
    # caught: the documented price of the fast check).
    step = json.loads((work / "data" / STEP_FILE).read_text())
    step["inputs"][str(corpus / "test.txt")]["sha256"] = "0" * 64
    (work / "data" / STEP_FILE).write_text(json.dumps(step))
    assert WorkDir(work).input_stamps("data", {str(corpus / "test.txt"): "--test_file"})[
        str(corpus / "test.txt")]["sha256"] == "0" * 64
    step["inputs"][str(corpus / "test.txt")]["sha256"] = stamps[str(corpus / "test.txt")]["sha256"]
    (work / "data" / STEP_FILE).write_text(json.dumps(step))
    # Edited: refused like a changed flag, naming the file and its flag.
    with open(corpus / "test.txt", "a", encoding="utf-8") as f:
        f.write("mary B-PER\n\n")
    digest = tree_digest(work)
    with pytest.raises(ConfigError, match=rf"^{work / 'data'} was made from other input files \({corpus / 'test.txt'} "
                                          r"\(--test_file\) changed since the step read it \(\d+ bytes then, \d+ now\)\); "
                                          r"use a new --work_dir, or pass --overwrite"):
        pipeline.step_data(WorkDir(work), cfg)
    assert tree_digest(work) == digest
    assert digest["data/train.jsonl"] == before["data/train.jsonl"]
    # --overwrite redoes the data, and every later step's fingerprint changes with it.
    old = pipeline.step_data(WorkDir(work, overwrite=True), cfg)
    assert "mary" in (work / "data" / "test.jsonl").read_text()
    (corpus / "test.txt").unlink()
    with pytest.raises(ConfigError, match=r"test.txt \(--test_file\) is gone since the step read it"):
        pipeline.step_data(WorkDir(work), cfg)
    assert old["inputs"] and set(old["inputs"]) == {str(corpus / "train.txt"), str(corpus / "test.txt")}


def test_work_dirs_made_before_input_fingerprints_still_resume(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    cfg = pipeline.RunConfig(work_dir=str(work), data=data_config(corpus))
    pipeline.step_data(WorkDir(work), cfg)
    step = json.loads((work / "data" / STEP_FILE).read_text())
    legacy = {"data": step["fingerprint"]["data"]}

    (work / "data" / STEP_FILE).write_text(json.dumps({"hash": fingerprint_hash(legacy), "fingerprint": legacy,
                                                       "info": step["info"]}))
    before = tree_digest(work)
    pipeline.step_data(WorkDir(work), cfg)
    assert tree_digest(work) == before


# ----------------------------------------------------------------------------- item 2: --overwrite

def test_overwrite_keeps_the_old_artifact_until_the_new_one_is_complete(tmp_path):
    work = WorkDir(tmp_path / "w", overwrite=True)
    work.run_step("data", {"a": 1}, lambda tmp: (tmp / "x").write_text("old") and None)
    before = tree_digest(work.root)

    def fails(tmp):
        (tmp / "x").write_text("half")
        raise RuntimeError("the build failed")

    with pytest.raises(RuntimeError):
        work.run_step("data", {"a": 2}, fails)
    assert tree_digest(work.root) == before and work.replaced == []
    work.run_step("data", {"a": 2}, lambda tmp: (tmp / "x").write_text("new") and None)
    assert (work.root / "data" / "x").read_text() == "new" and work.replaced == ["data"]
    assert sorted(p.name for p in work.root.iterdir()) == ["data"]   # no data.tmp, no data.old


def test_a_failure_after_a_replaced_step_leaves_metrics_of_what_is_on_disk(tmp_path, monkeypatch):
    corpus = make_corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    finished_work_dir(work, corpus)
    cfg = pipeline.RunConfig(work_dir=str(work), data=data_config(corpus, dev_fraction=0.3), overwrite=True)

    def teacher_fails(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "step_teacher", teacher_fails)
    with pytest.raises(Interrupted, match="^interrupted; rerun the same command to resume from step teacher$"):
        pipeline.run(cfg)
    data_info = json.loads((work / "data" / STEP_FILE).read_text())["info"]
    assert json.loads((work / "metrics.json").read_text()) == {"data": data_info,
                                                                 "peak_rss_mib": {"data": data_info["peak_rss_mib"]}}
    assert (work / "student" / "weights.bin").exists()   # not deleted: replaced only by a finished student


# ----------------------------------------------------------------------------- bin/train, one process

@pytest.fixture(scope="module")
def cli_results(tmp_path_factory, tiny_bert_dir):
    """name -> (the work dir's digest before, its digest after, the run's {code, stderr}, expected line)."""
    root = tmp_path_factory.mktemp("safety")
    cases, argvs, before = {}, [], {}

    def case(name, extra, expected, edit=None):
        corpus = make_corpus(root / name / "corpus")
        work = root / name / "work"
        before[name] = finished_work_dir(work, corpus)
        if edit:
            edit(corpus)
        cases[name] = expected(corpus) if callable(expected) else expected
        argvs.append(base_flags(corpus, tiny_bert_dir, work) + extra)

    def edit_train(corpus):
        with open(corpus / "train.txt", "a", encoding="utf-8") as f:
            f.write("paris B-LOC\n\n")

    case("edited_train_file", [], lambda c: f"was made from other input files ({c / 'train.txt'} (--train_file) "
                                            "changed since the step read it", edit_train)
    case("edited_train_file_same_size", [], lambda c: f"({c / 'train.txt'} (--train_file) changed",
         lambda c: (c / "train.txt").write_text((c / "train.txt").read_text().replace("john", "mary", 1)))
    case("overwrite_misspelt_train_file", ["--overwrite", "--train_file=trian.txt"],
         lambda c: f"{c / 'trian.txt'}: file does not exist")
    case("overwrite_bad_student_dropout", ["--overwrite", "--student_dropout=1.5"],
         "--student_dropout=1.5; expected a fraction in [0, 1)")
    (root / "cases.json").write_text(json.dumps(argvs), encoding="utf-8")
    subprocess.run([sys.executable, str(REPO / "tests" / "train_cli_driver.py"), str(root / "cases.json"),
                    str(root / "results.json")], env=ENV, check=True, capture_output=True, timeout=600)
    results = json.loads((root / "results.json").read_text(encoding="utf-8"))
    return {name: (before[name], tree_digest(root / name / "work"), result, cases[name])
            for name, result in zip(cases, results)}


@pytest.mark.parametrize("name", ["edited_train_file", "edited_train_file_same_size",
                                  "overwrite_misspelt_train_file", "overwrite_bad_student_dropout"])
def test_a_refused_run_leaves_every_artifact_byte_for_byte(cli_results, name):
    before, after, result, expected = cli_results[name]
    assert result["code"] == 2, result["stderr"][-3000:]
    assert expected in error_line(result["stderr"])
    assert without_run_files(after) == without_run_files(before)   # metrics.json included


# ----------------------------------------------------------------------------- item 5: the lock

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
time.sleep(600)
"""


def hold_lock(work):
    work.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(work / ".lock")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_run_on_a_work_dir_fails_at_once_naming_the_holder(tmp_path):
    work = tmp_path / "work"
    holder = hold_lock(work)
    try:
        start = time.time()
        with pytest.raises(ConfigError, match=rf"^--work_dir={work} is in use by another run \(process {holder.pid} "
                                              rf"holds {work / '.lock'}\)"):
            with work_dir_lock(work):
                pass
        assert time.time() - start < 5
    finally:
        holder.kill()
        holder.wait()
    # The killed holder's lock file is still there, with its pid: it blocks nobody.
    assert (work / ".lock").read_text().strip() == str(holder.pid)
    with work_dir_lock(work):
        assert (work / ".lock").read_text().strip() == str(os.getpid())


def test_bin_train_refuses_a_locked_work_dir_in_one_line(tmp_path, tiny_bert_dir):
    corpus = make_corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    before = finished_work_dir(work, corpus)
    holder = hold_lock(work)
    try:
        proc = bin_train(base_flags(corpus, tiny_bert_dir, work))
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2
    assert error_line(proc.stderr) == (f"error: --work_dir={work} is in use by another run (process {holder.pid} "
                                       f"holds {work / '.lock'}); wait for it to finish or stop it, or use another "
                                       "--work_dir")
    assert without_run_files(tree_digest(work)) == without_run_files(before)


# ----------------------------------------------------------------------------- item 6: Ctrl-C

def test_ctrl_c_gives_one_line_exit_130_and_no_half_written_step(tmp_path, tiny_bert_dir):
    corpus = make_corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    # A terminal's Ctrl-C: the default SIGINT disposition, even when this pytest was started in the background
    # (`nohup ... &` ignores SIGINT, and an ignored signal stays ignored in children; Python then installs no handler).
    proc = subprocess.Popen([sys.executable, str(REPO / "bin" / "train"), *base_flags(corpus, tiny_bert_dir, work),
                             "--teacher_epochs=50", "--patience=50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while time.time() < deadline and "step teacher: running" not in _text(work / "run.log"):
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "interrupted; rerun the same command to resume from step teacher"
    assert not (work / "teacher").exists() and not (work / "teacher.tmp").exists()
    assert (work / "data" / STEP_FILE).exists()


def _text(path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


# ----------------------------------------------------------------------------- item 4: TF's own writes

TF_WRITE = """
import os, resource, sys
sys.path.insert(0, sys.argv[2])
import xtremedistil_tf
import tensorflow as tf
from xtremedistil_tf.cli.common import one_line
from xtremedistil_tf.errors import WorkDirError
from xtremedistil_tf.run.workdir import WorkDir

work = WorkDir(sys.argv[1])
work.run_step("data", {"a": 1}, lambda tmp: None)
module = tf.Module()
module.v = tf.Variable(tf.zeros([100000]))   # 400 KB of variables, past the 64 KiB limit
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    work.run_step("teacher", {"a": 1}, lambda tmp: tf.saved_model.save(module, str(tmp / "model")))
except WorkDirError as e:
    print(one_line(e))
"""


def test_a_full_disk_inside_tensorflow_writes_is_the_same_one_line_error(tmp_path):
    # RLIMIT_FSIZE makes TF's SaveV2 fail with EFBIG, which TF reports as an OutOfRangeError.
    proc = subprocess.run([sys.executable, "-c", TF_WRITE, str(tmp_path / "w"), str(REPO)], capture_output=True,
                          text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith(f"step teacher failed: File too large ({tmp_path / 'w' / 'teacher.tmp' / 'model'}/")
    assert line.endswith(f"; nothing of it was kept in {tmp_path / 'w' / 'teacher'} (rerun the same command once "
                         "fixed)")
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["data"]


def test_tensorflow_disk_full_errors_are_write_errors_and_other_tf_errors_are_not():
    full = tf.errors.ResourceExhaustedError(None, None, "{{function_node x}} /w/teacher.tmp/ck.data-0.tempstate1; "
                                                        "No space left on device [Op:SaveV2]")
    assert write_error_reason(full) == "No space left on device (/w/teacher.tmp/ck.data-0.tempstate1)"
    assert write_error_reason(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")) is None
    assert write_error_reason(OSError(28, "No space left on device", "/w/x")) == "No space left on device (/w/x)"
    assert write_error_reason(OSError(2, "No such file or directory", "/w/x")) is None
    assert write_error_reason(ValueError("No space left on device")) is None


class SafetensorError(Exception):
    """As safetensors' Rust code reports a full disk: no errno field, no file name, the OS error in the text."""


def test_a_full_disk_in_a_rust_library_names_what_the_step_was_writing(tmp_path):
    work = WorkDir(tmp_path / "w")

    def save_pretrained(tmp):   # config.json written, then the weights: the library removes its partial file
        (tmp / "model" / "encoder").mkdir(parents=True)
        (tmp / "model" / "encoder" / "config.json").write_text("{}")
        time.sleep(0.01)
        (tmp / "model" / "encoder" / "model.safetensors").write_bytes(b"partial")
        (tmp / "model" / "encoder" / "model.safetensors").unlink()
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(WorkDirError) as info:
        work.run_step("teacher", {"a": 1}, save_pretrained)
    encoder = tmp_path / "w" / "teacher.tmp" / "model" / "encoder"
    assert str(info.value) == (f"step teacher failed: No space left on device ({encoder}); "
                               f"nothing of it was kept in {tmp_path / 'w' / 'teacher'} (rerun the same command once fixed)")
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == []
    assert write_error_reason(SafetensorError("I/O error: No such file or directory (os error 2)")) is None


# ----------------------------------------------------------------------------- item 10: absl flag errors

@pytest.mark.parametrize("args, expected", [
    (["--no_such_flag=1"], "error: Unknown command line flag 'no_such_flag'"),
    (["--seed=abc"], "error: flag --seed=abc: invalid literal for int() with base 10: 'abc'"),
])
def test_a_flag_absl_cannot_parse_is_a_usage_error_exit_2(tmp_path, args, expected):
    proc = bin_train([f"--work_dir={tmp_path / 'w'}", *args])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert error_line(proc.stderr).startswith(expected)
