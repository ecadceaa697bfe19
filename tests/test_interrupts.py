"""Ctrl-C (SIGINT) and SIGTERM at any moment of bin/train (issue 42, item 1): exit 130 / 143, the one documented
line (naming the step that was running, or saying nothing was started), no traceback, nothing half-written, and a
rerun of the same command finishes.

The default tier interrupts one run while a hook holds it inside the teacher's construction (TFBertLayer.__init__,
looping in tf.nest's C++ code, where a KeyboardInterrupt used to come back as a TypeError or AssertionError); the slow
tier interrupts a run every half second of its first 15 seconds (imports, flag parsing, the data step, the teacher's
construction, tracing and training), alternating the two signals, then reruns it to the end.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, stderr_line_of
from test_bad_inputs import ENV, base_flags
from test_work_dir_safety import make_corpus

from xtremedistil_tf import stop
from xtremedistil_tf.io import atomic_dir
from xtremedistil_tf.run.workdir import STEP_FILE
from xtremedistil_tf.stop import NOT_STARTED

RESUME = "interrupted; rerun the same command to resume"
BIN_TRAIN = str(REPO / "bin" / "train")

# bin/train with a hook: the first TFBertLayer built writes <marker> and then loops in tf.nest.flatten (C++)
# until the test's signal arrives. argv[0] is bin/train, as when a shell starts it.
BLOCKED = """
import runpy, sys, time
from pathlib import Path
marker, sys.argv = Path(sys.argv[1]), [sys.argv[2], *sys.argv[3:]]
import xtremedistil_tf
import tensorflow as tf
from transformers.models.bert import modeling_tf_bert

built = modeling_tf_bert.TFBertLayer.__init__

def blocking(self, *args, **kwargs):
    marker.write_text("building")
    deadline = time.time() + 120
    while time.time() < deadline:
        tf.nest.flatten({"a": [1, 2, {"b": (3, 4)}], "c": [5] * 50})
    built(self, *args, **kwargs)

modeling_tf_bert.TFBertLayer.__init__ = blocking
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def flags(corpus, tiny_bert_dir, work):
    return base_flags(corpus, tiny_bert_dir, work) + ["--strategy=D0"]


def popen(args):
    # A terminal's signals: the default SIGINT disposition even where this pytest runs in the background.
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def check_stopped(proc, signum, work, allowed):
    """The run ended by `signum` as documented: 128 + signum, the last stderr line one of `allowed`, no traceback,
    no error line, and nothing half-written in the work dir. Returns the last line."""
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    assert not [line for line in lines if line.startswith("error:") or "Error" in line], stderr[-3000:]
    assert lines[-1] in allowed, stderr[-3000:]
    assert_nothing_half_written(work)
    return lines[-1]


def assert_finished(proc, work):
    """A run that exited 0: no traceback, its metrics written and nothing half-written."""
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert (work / "metrics.json").is_file() and (work / "student" / STEP_FILE).is_file(), stderr[-3000:]
    assert_nothing_half_written(work)


def assert_nothing_half_written(work):
    """No temporary or set-aside file or dir, and every step dir that exists is complete (its step.json)."""
    if not work.exists():
        return
    leftovers = [str(p) for p in work.rglob("*") if p.name.endswith((".tmp", ".old"))]
    assert leftovers == []
    for step in ("data", "teacher", "student"):
        if (work / step).exists():
            assert (work / step / STEP_FILE).is_file()
    if (work / "transfer").exists():   # written in place: whole shards only, the manifest once complete
        assert all(p.name.startswith("shard-") or p.suffix == ".json" for p in (work / "transfer").iterdir())


def step_lines(steps=("data", "teacher", "transfer", "student", "metrics")):
    return {f"{RESUME} from step {step}" for step in steps}


@pytest.fixture
def recording():
    """stop.py's handler in this process, for the test only (pytest's own Ctrl-C handling back afterwards). SIGINT
    starts as a terminal's Ctrl-C has it: a pytest started in the background (`make test &`) inherits it ignored, and
    stop.py rightly leaves an ignored SIGINT alone; the inherited disposition is put back at the end."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    assert stop.install()
    try:
        yield
    finally:
        stop.uninstall()
        stop.reset()
        uninstalled = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, inherited)
    assert uninstalled is signal.default_int_handler


def test_a_signal_is_recorded_before_the_work_raised_during_it_and_held_in_a_commit(recording, tmp_path):
    os.kill(os.getpid(), signal.SIGTERM)   # while the command starts: recorded, nothing raised
    time.sleep(0.05)
    assert stop.received() == signal.SIGTERM and stop.exit_status() == 143
    with pytest.raises(KeyboardInterrupt):   # the work does not start
        with stop.armed():
            pytest.fail("the work started after the signal")
    stop.reset()
    held = []
    with pytest.raises(KeyboardInterrupt):
        with stop.armed():
            with stop.deferred():   # a commit: the signal waits for its end
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                held.append("the section ran to its end")
            pytest.fail("the interrupt was not raised at the section's end")
    assert held == ["the section ran to its end"] and stop.exit_status() == 130
    stop.reset()
    with pytest.raises(KeyboardInterrupt):   # a build a signal reached is not committed, even when it returned
        with atomic_dir(tmp_path / "step") as tmp:
            (tmp / "half").write_text("x")
            os.kill(os.getpid(), signal.SIGINT)   # not armed: recorded only
            time.sleep(0.05)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_inside_model_construction_is_the_documented_line(tmp_path, tiny_bert_dir, signum):
    corpus = make_corpus(tmp_path / "corpus")
    work, marker = tmp_path / "work", tmp_path / "building"
    proc = popen([sys.executable, "-c", BLOCKED, str(marker), BIN_TRAIN, *flags(corpus, tiny_bert_dir, work)])
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate()[1][-3000:]
    time.sleep(0.3)   # well inside the loop
    proc.send_signal(signum)
    line = check_stopped(proc, signum, work, step_lines())
    assert line == f"{RESUME} from step teacher"
    assert (work / "data" / STEP_FILE).is_file() and not (work / "teacher").exists()


# bin/<command> run by a wrapper whose __main__ holds an object that sends this process SIGINT when Python's shutdown
# destroys it: after the command has returned, after Python has put the signals' own handlers back
# (`_PySignal_Fini` runs before the modules are torn down), as a Ctrl-C would land while TensorFlow shuts down.
LATE_SIGNAL = """
import os, runpy, signal, sys, time

class SignalAtShutdown:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        sys.stdout.write("survived the signal\\n")

late = SignalAtShutdown()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_before_the_work_ends_the_command_before_tensorflow_has_loaded(tmp_path, signum):
    """Sent as soon as the package's handler is in place (-X importtime's line for console.py, imported after
    stop.install()): the one line and 128 + signum, before TensorFlow's import has finished (its importtime line,
    shown once the import ends, never comes), and no work dir."""
    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, "-X", "importtime", BIN_TRAIN, f"--work_dir={work}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    with stderr_line_of(proc, b"import time:", limit_s=300):
        for line in iter(proc.stderr.readline, b""):
            if re.search(rb"\|\s+xtremedistil_tf\.console$", line.rstrip()):
                break
        proc.send_signal(signum)
        rest = proc.stderr.read().decode()
        proc.wait(timeout=60)
    assert proc.returncode == 128 + signum, rest[-3000:]
    lines = [line for line in rest.splitlines() if not line.startswith("import time:")]
    assert lines == [NOT_STARTED], rest[-3000:]
    assert not re.search(r"\|\s+tensorflow$", rest, re.MULTILINE)
    assert not work.exists()


def test_a_signal_after_the_work_has_ended_changes_nothing(tmp_path, toy_student_dir):
    """bin/predict has written its output and returned; SIGINT while Python shuts down is ignored (exit 0, the
    output whole), where it used to kill the process (exit -2, no line)."""
    lines, out = tmp_path / "lines.txt", tmp_path / "out.jsonl"
    lines.write_text("John lives in Paris\nMary works in Berlin\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", LATE_SIGNAL, str(REPO / "bin" / "predict"),
                           f"--model={toy_student_dir}", f"--input={lines}", f"--output={out}"],
                          capture_output=True, text=True, env=ENV, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout == "survived the signal\n" and proc.stderr == ""
    assert [json.loads(line)["text"] for line in out.read_text(encoding="utf-8").splitlines()] == [
        "John lives in Paris", "Mary works in Berlin"]


@pytest.mark.slow
def test_bin_train_interrupted_every_half_second_then_rerun_finishes(tmp_path, tiny_bert_dir):
    corpus = make_corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    args = [sys.executable, BIN_TRAIN, *flags(corpus, tiny_bert_dir, work)]
    seen = {}
    # 0.5 s, 1.0 s, ... 15.0 s after the start (the runs resume one another's steps); then, on a machine so loaded
    # that no run got past its imports by then, a second later each time until one is stopped inside a step.
    # A run that resumed the others' steps can finish every step before its moment comes (a quiet machine does
    # that well inside 15 s): it must then have exited 0 with the work complete, and there is nothing left to stop.
    moments = [k / 2 for k in range(1, 31)] + list(range(16, 61))
    finished = None
    for k, moment in enumerate(moments):
        if moment > 15 and set(seen) & step_lines():
            break
        signum = signal.SIGINT if k % 2 == 0 else signal.SIGTERM
        proc = popen(args)
        time.sleep(moment)
        if proc.poll() is None:
            proc.send_signal(signum)
        if proc.wait(timeout=300) == 0:   # it ended before the signal, or the signal found it exiting
            finished = moment
            assert_finished(proc, work)
            break
        line = check_stopped(proc, signum, work, step_lines() | {RESUME, NOT_STARTED})
        seen.setdefault(line, []).append(moment)
    assert NOT_STARTED in seen and set(seen) & step_lines(), (seen, finished)   # imports and a step were both hit
    done = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    metrics = json.loads((work / "metrics.json").read_text(encoding="utf-8"))
    assert {"data", "teacher", "transfer", "student"} <= set(metrics)
    assert_nothing_half_written(work)
    assert sorted(p.name for p in work.iterdir() if p.name.endswith((".tmp", ".old"))) == []
    assert os.path.isfile(work / "student" / "model" / "saved_model.pb")


@pytest.mark.slow
@pytest.mark.parametrize("signum, group", [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["SIGINT-to-the-terminal-group", "SIGTERM-to-bin-train"])
def test_a_signal_while_the_teacher_step_runs_in_its_own_process(tmp_path, tiny_bert_dir, signum, group):
    """--step_processes=always (run/isolate.py): Ctrl-C (the terminal's whole process group) or SIGTERM (bin/train
    alone) while the teacher fine-tunes in its child process: the child stops cleanly and ends, bin/train says the
    documented line and exits 128 + signum, nothing is half-written, and the same command then finishes."""
    corpus = make_corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    args = [sys.executable, BIN_TRAIN, *flags(corpus, tiny_bert_dir, work), "--step_processes=always",
            "--teacher_epochs=50"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in proc.stderr:   # the child's log lines come through bin/train's console
        lines.append(line)
        if line.startswith("[teacher] epoch 1/50"):
            break
    children = [int(pid) for pid in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
    assert len(children) == 1, lines
    (os.killpg(proc.pid, signum) if group else proc.send_signal(signum))
    rest = proc.stderr.read()
    proc.wait(timeout=300)
    stderr = "".join(lines) + rest
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == f"{RESUME} from step teacher", stderr[-3000:]
    assert not os.path.exists(f"/proc/{children[0]}"), "the teacher step's process outlived bin/train"
    assert not (work / "teacher").exists()
    assert_nothing_half_written(work)
    args[-1] = "--teacher_epochs=1"
    done = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (work / "metrics.json").is_file() and (work / "student" / STEP_FILE).is_file()
