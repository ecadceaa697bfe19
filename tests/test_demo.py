"""make demo's steps on a tiny slice: the Makefile's own commands and configs/demo.flags, with a tiny random teacher and
a few tweets (the code path, not the F1), so a broken demo fails CI; its console says each thing once."""
import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow   # a pipeline run, an export, an evaluation, four timed exports (about two minutes)
def test_make_demo_on_a_tiny_slice(tmp_path, tiny_bert_dir):
    stamp = tmp_path / "installed"
    stamp.touch()   # newer than requirements.txt and setup.py: make installs nothing
    work = tmp_path / "demo"
    flags = (f"--teacher={tiny_bert_dir} --teacher_random_init --teacher_layer=1 --teacher_epochs=1 "
             "--max_eval_sentences=40 --student_embedding_dim=8 --student_hidden=8 "
             "--epochs_per_layer=1 --no_progress")
    out = subprocess.run(["make", "--no-print-directory", "demo", f"PY={sys.executable}", f"STAMP={stamp}",
                          f"DEMO_DIR={work}", f"DEMO_FLAGS={flags}", f"DEMO_TEXT={tmp_path / 'bbc.txt'}",
                          "DEMO_TEXT_SENTENCES=300"], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    printed = [line for line in lines if not line.startswith(sys.executable) and not line.startswith("HF_HUB")]
    # Each thing once: the summary's rows, the speed table, the served examples.
    # (student / teacher only where the tiny teacher's F1 is not 0: at most once.)
    assert sum(line.startswith("student / teacher test span F1") for line in printed) <= 1
    for start in ("teacher test F1 / P / R", "student test span F1 / P / R", "student parameters",
                  "speed, ms per sentence of 32 pieces (", "  TensorFlow (SavedModel)", "  ONNX Runtime int8", "report ",
                  "serve it with TF Serving: "):
        assert sum(line.startswith(start) for line in printed) == 1, (start, printed)
    assert sum(" test sentences served right (of " in line for line in printed) == 1
    # The unlabeled news written first (bin/transfer_text) is part of the student's transfer set.
    assert len((tmp_path / "bbc.txt").read_text(encoding="utf-8").splitlines()) == 300
    assert '"transfer_file"' in (work / "data" / "step.json").read_text(encoding="utf-8")
    assert (work / "deployed.json").exists() and (work / "export" / "ner" / "1" / "saved_model.pb").exists()
    # The summary's speed table is the benchmark's own (deployed.json, which bin/benchmark deployed also printed).
    assert [line for line in printed if line.startswith("  TensorFlow (SavedModel)")][0] in \
        (work / "deployed.txt").read_text(encoding="utf-8").splitlines()
