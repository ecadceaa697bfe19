"""Other unlabeled transfer text on a finished run keeps its fine-tuned teacher (the teacher never reads that text)
and remakes what does read it: the data's transfer set, the teacher-output caches and the student."""
import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import toy_ner_sentences
from test_pipeline import toy_config, write_conll

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.workdir import STEP_FILE, WorkDir, fingerprint_hash
from xtremedistil_tf.students import StudentArch


def files_of(directory: Path) -> dict:
    """{relative path: (mtime_ns, sha256)} of every file under `directory`."""
    return {str(p.relative_to(directory)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(directory.rglob("*")) if p.is_file()}


def write_small_corpus(root: Path) -> Path:
    """train.txt (60 toy sentences), test.txt (20), unlabeled.txt (2 lines) and more.txt (3 lines) in `root`."""
    root.mkdir(parents=True, exist_ok=True)
    write_conll(root / "train.txt", toy_ner_sentences(60, seed=3))
    write_conll(root / "test.txt", toy_ner_sentences(20, seed=4))
    (root / "unlabeled.txt").write_text("john was in paris\nmary at berlin .\n", encoding="utf-8")
    (root / "more.txt").write_text("anna was in rome\npeter at oslo .\nthe man in madrid\n", encoding="utf-8")
    return root


@pytest.fixture
def corpus(tmp_path):
    return write_small_corpus(tmp_path / "corpus")


def small_config(work_dir, corpus, teacher_dir) -> pipeline.RunConfig:
    cfg = toy_config(work_dir, corpus, teacher_dir)
    cfg.teacher.finetune.epochs = 1
    cfg.student = DistilConfig(arch=StudentArch(embedding_dim=8, hidden=8), epochs_per_layer=1, patience=1,
                               batch_size=32, learning_rate=2e-2, strategy="D1", run_eagerly=True)
    return cfg


@pytest.mark.slow   # two runs of the pipeline with a student (about a minute)
def test_new_transfer_text_keeps_the_teacher_and_remakes_the_cache_and_the_student(tmp_path, corpus, tiny_bert_dir):
    cfg = small_config(tmp_path / "work", corpus, tiny_bert_dir)
    pipeline.run(cfg)
    work = WorkDir(cfg.work_dir)
    teacher_files = files_of(work.path("teacher"))
    before = {name: work.stored(name)["hash"] for name in ("data", "teacher", "transfer", "student")}

    other = replace(cfg, data=replace(cfg.data, transfer_file="more.txt"))
    # Without --overwrite the data step refuses, and says the teacher would be kept.
    with pytest.raises(ConfigError, match=r"/data was made from other input files .*only the unlabeled transfer "
                                          r"text differs: --overwrite keeps the fine-tuned teacher"):
        pipeline.run(other)
    metrics = pipeline.run(replace(other, overwrite=True))

    assert files_of(work.path("teacher")) == teacher_files   # not one byte or mtime of the teacher changed
    after = {name: work.stored(name)["hash"] for name in before}
    assert after["teacher"] == before["teacher"]
    assert all(after[name] != before[name] for name in ("data", "transfer", "student"))
    assert metrics["data"]["transfer_sentences"] == 3
    # The cache holds the labeled windows and the three new sentences.
    assert work.step_info("transfer")["windows"] == metrics["data"]["train_sentences"] + 3


def test_the_teacher_is_keyed_by_the_labeled_data_only(tmp_path, corpus):
    """labeled_data_fingerprint: other transfer text (file, char level, train rest) leaves it as it is; an edited
    labeled split changes it; a run without transfer text has the data step's own fingerprint (work dirs made
    before keep their teacher); a random teacher, whose vocabulary comes from the transfer text, is keyed by all."""
    def fingerprint(cfg):
        return pipeline.labeled_data_fingerprint(cfg, pipeline.step_data(WorkDir(tmp_path / "w", overwrite=True), cfg))

    cfg = small_config(tmp_path / "w", corpus, "unused")
    base = fingerprint(cfg)
    assert fingerprint(replace(cfg, data=replace(cfg.data, transfer_file="more.txt"))) == base
    assert fingerprint(replace(cfg, data=replace(cfg.data, transfer_char_level=True))) == base
    no_text = replace(cfg, data=replace(cfg.data, transfer_file=""))
    assert fingerprint(no_text) == base == pipeline.step_data(WorkDir(tmp_path / "w", overwrite=True), no_text)
    assert str(corpus / "train.txt") in base["inputs"] and str(corpus / "more.txt") not in base["inputs"]

    write_conll(corpus / "train.txt", toy_ner_sentences(60, seed=5))   # an edited labeled split
    assert fingerprint(cfg) != base
    random = replace(cfg, teacher=replace(cfg.teacher, name=pipeline.RANDOM_ALIAS))
    full = pipeline.step_data(WorkDir(tmp_path / "w", overwrite=True), random)
    assert pipeline.labeled_data_fingerprint(random, full) == full and str(corpus / "unlabeled.txt") in full["inputs"]


def test_a_teacher_recorded_under_all_of_the_data_is_kept(tmp_path, corpus, tiny_bert_dir):
    """A teacher step recorded by all of the data step's fingerprint, transfer text included (as work dirs were
    made before), is recorded anew under the labeled data and kept: no refusal, no refit."""
    cfg = small_config(tmp_path / "work", corpus, tiny_bert_dir)
    cfg.student, cfg.teacher.finetune.epochs = None, 0
    pipeline.run(cfg)
    work = WorkDir(cfg.work_dir)
    stored = work.stored("teacher")
    full = {**work.stored("data")["fingerprint"], "teacher": stored["fingerprint"]["teacher"]}
    assert fingerprint_hash(full) != stored["hash"]
    work.refingerprint("teacher", full)   # as an older version recorded it
    model = files_of(work.path("teacher") / "model")

    pipeline.run(cfg)
    assert work.stored("teacher")["hash"] == stored["hash"]
    assert files_of(work.path("teacher") / "model") == model
    assert (work.path("teacher") / STEP_FILE).exists()
