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
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO
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


@pytest.mark.slow
def test_bin_train_interrupted_every_half_second_then_rerun_finishes(tmp_path, tiny_bert_dir):
    corpus = make_corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    args = [sys.executable, BIN_TRAIN, *flags(corpus, tiny_bert_dir, work)]
    seen = {}
    # 0.5 s, 1.0 s, ... 15.0 s after the start (the runs resume one another's steps); then, on a machine so loaded
    # that no run got past its imports by then, a second later each time until one is stopped inside a step.
    moments = [k / 2 for k in range(1, 31)] + list(range(16, 61))
    for k, moment in enumerate(moments):
        if moment > 15 and set(seen) & step_lines():
            break
        signum = signal.SIGINT if k % 2 == 0 else signal.SIGTERM
        proc = popen(args)
        time.sleep(moment)
        proc.send_signal(signum)
        line = check_stopped(proc, signum, work, step_lines() | {RESUME, NOT_STARTED})
        seen.setdefault(line, []).append(moment)
    assert NOT_STARTED in seen and set(seen) & step_lines(), seen   # imports and a step were both hit
    done = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    metrics = json.loads((work / "metrics.json").read_text(encoding="utf-8"))
    assert {"data", "teacher", "transfer", "student"} <= set(metrics)
    assert_nothing_half_written(work)
    assert sorted(p.name for p in work.iterdir() if p.name.endswith((".tmp", ".old"))) == []
    assert os.path.isfile(work / "student" / "model" / "saved_model.pb")
