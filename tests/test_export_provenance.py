"""Exports record the student they were made from (`student_identity`); the peers benchmark refuses, in one line and
before it trains spaCy, an export of another student than its work dir's (one trained since)."""
import json
import shutil

import pytest

from xtremedistil_tf.benchmarks import spacy_peer
from xtremedistil_tf.data.loading import write_jsonl
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export import formats
from xtremedistil_tf.export.predictor import check_exported_from, exported_student
from xtremedistil_tf.export.serving import export_student
from xtremedistil_tf.students.artifact import student_identity


def _retrained(student_dir, target):
    """A copy of the student whose weights moved (one byte of its variables changed), as a retraining leaves it."""
    shutil.copytree(student_dir, target)
    data = sorted((target / "model" / "variables").glob("variables.data-*"))[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    return target


def test_exports_record_their_student_and_a_retrained_one_is_refused(toy_student_dir, tmp_path):
    identity = student_identity(toy_student_dir)
    assert len(identity) == 64 and identity == student_identity(toy_student_dir)   # reading it changes nothing
    saved, _ = export_student(toy_student_dir, tmp_path / "export", version=1)
    onnx = formats.export(toy_student_dir, tmp_path / "export", fmt="onnx", quantize="none").directory
    for export in (tmp_path / "export" / "ner", saved, onnx):
        assert exported_student(export) == identity
        check_exported_from(export, toy_student_dir)   # its own student: passes
    other = _retrained(toy_student_dir, tmp_path / "retrained")
    assert student_identity(other) != identity
    for export in (tmp_path / "export" / "ner", onnx):
        with pytest.raises(ConfigError, match=rf"^{export} was exported from another student than {other} \(trained "
                                              r"since\); export it again: bin/export \.\.\. --overwrite"):
            check_exported_from(export, other)
    # An export written before exports recorded their student cannot be told apart: it passes.
    meta = json.loads((onnx / "export.json").read_text(encoding="utf-8"))
    del meta["student_sha256"]
    (onnx / "export.json").write_text(json.dumps(meta), encoding="utf-8")
    assert exported_student(onnx) is None
    check_exported_from(onnx, other)
    # A W/export/ner without a SavedModel version is not served (the student dir is): the benchmark's check passes.
    work = tmp_path / "work"
    (work / "export" / "ner").mkdir(parents=True)
    shutil.copytree(other, work / "student")
    spacy_peer.check_exports(work)


@pytest.mark.slow   # an int8 ONNX export (in CI's slow subset)
def test_peers_refuses_a_stale_export_before_training_spacy(toy_student_dir, tmp_path, monkeypatch):
    work = tmp_path / "work"
    shutil.copytree(toy_student_dir, work / "student")
    formats.export(toy_student_dir, work / "export", fmt="onnx", quantize="dynamic_int8")
    spacy_peer.check_exports(work)   # made from W/student: passes
    _retrained(toy_student_dir, tmp_path / "retrained")
    shutil.rmtree(work / "student")
    shutil.copytree(tmp_path / "retrained", work / "student")
    with pytest.raises(ConfigError, match="ner-onnx-dynamic_int8 was exported from another student"):
        spacy_peer.check_exports(work)
    # bin/benchmark peers checks before it trains spaCy (which may take its whole time budget).
    (work / "data").mkdir()
    for step in ("data", "student"):
        (work / step / "step.json").write_text("{}", encoding="utf-8")
    write_jsonl([Sentence(["Mary", "met", "John"], ["B-PER", "O", "B-PER"], "en")], work / "data" / "test.jsonl")
    monkeypatch.setattr(spacy_peer, "spacy_pipeline", lambda *a, **k: pytest.fail("spaCy trained before the check"))
    with pytest.raises(ConfigError, match="ner-onnx-dynamic_int8 was exported from another student"):
        spacy_peer.measure(work, {}, max_minutes=1, queries=1, repeats=1, threads=1)
