import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, read_scalars, toy_ner_sentences, train_configs

from xtremedistil_tf.data.alignment import TagVocab, encode, predict_by_length
from xtremedistil_tf.data.loading import DataConfig, check_data_config, first_per_language
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.engine.resume import DEFAULT_SEED
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.multigrained import MultiGrainedConfig
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.student_run import evaluate_student, load_student
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run import probes as probes_module
from xtremedistil_tf.run.probes import DEFAULT_PROBES, agreement, as_sentence, probe_rows, probe_texts
from xtremedistil_tf.run.report import write_report
from xtremedistil_tf.run.workdir import STEP_FILE, WorkDir
from xtremedistil_tf.students import StudentArch
from xtremedistil_tf.teachers import finetune
from xtremedistil_tf.teachers.finetune import FinetuneConfig, evaluate_teacher
from xtremedistil_tf.teachers.saved import load_teacher
from xtremedistil_tf.transfer.cache import damaged_shards, read_arrays, read_sharded


def write_conll(path, sentences):
    path.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(s.tokens, s.tags)) + "\n" for s in sentences),
                    encoding="utf-8")


@pytest.fixture(scope="module")
def toy_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_conll(root / "train.txt", toy_ner_sentences(200, seed=3))
    # The toy names are all in train but for this city run longer than any train has (an unseen name, issue 50).
    unseen = Sentence("john was in paris berlin berlin paris berlin".split(), ["B-PER", "O", "O"] + ["B-LOC"]
                      + ["I-LOC"] * 4)
    write_conll(root / "test.txt", toy_ner_sentences(40, seed=4) + [unseen])
    (root / "unlabeled.txt").write_text("john was in paris\nmary at berlin .\n", encoding="utf-8")
    return root


def toy_config(work_dir, corpus, teacher_dir):
    data = DataConfig(format="conll", data_dir=str(corpus), train_file="train.txt", test_file="test.txt",
                      transfer_file="unlabeled.txt", dev_fraction=0.2)
    teacher = pipeline.TeacherConfig(name=str(teacher_dir), random_init=True, max_seq_length=16, dropout=0.0,
                                     layer=1, finetune=FinetuneConfig(epochs=3, batch_size=16, learning_rate=3e-3,
                                                                      # a random tiny encoder: the head
                                                                      # trains with it, BERT-initialised
                                                                      head_learning_rate=None, head_init="bert",
                                                                      progress=False))
    # run_eagerly: each of D4.2's nine unfreeze steps compiles a fresh model, and for this tiny student tracing
    # them costs more than it saves (78 s of CPU for the student step traced, 47 s eager; the same scores).
    student = DistilConfig(arch=StudentArch(embedding_dim=16, hidden=16), epochs_per_layer=2, patience=2, batch_size=32,
                           learning_rate=2e-2, strategy="D4.2", run_eagerly=True)
    return pipeline.RunConfig(work_dir=str(work_dir), data=data, teacher=teacher, student=student,
                              transfer=pipeline.TransferConfig(shard_size=64, batch_size=32), progress=False)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, toy_corpus, tiny_bert_dir):
    work = tmp_path_factory.mktemp("work")
    cfg = toy_config(work, toy_corpus, tiny_bert_dir)
    return cfg, pipeline.run(cfg)


def test_pipeline_writes_every_artifact(finished_run):
    cfg, metrics = finished_run
    work = cfg.work_dir
    for name in ("data/train.jsonl", "data/step.json", "teacher/model/teacher.json", "transfer/manifest.json",
                 "transfer_dev/manifest.json", "student/model/saved_model.pb", "student/vocab.txt",
                 "metrics.json", "config.json", "student/student.json"):
        assert os.path.exists(os.path.join(work, name)), name
    assert metrics["data"]["train_sentences"] == 160 and metrics["data"]["dev_sentences"] == 40
    assert metrics["data"]["transfer_sentences"] == 2
    assert metrics["teacher"]["scores"]["test"]["all"]["f1"] > 0.8
    # Transfer set = labeled train + unlabeled sentences, one window each at this length.
    ds = list(read_sharded(os.path.join(work, "transfer")).as_numpy_iterator())
    assert len(ds) == 162
    # Each window at its real length (no padding stored).
    length = len(ds[0]["input_ids"])
    assert ds[0]["attention_mask"].sum() == length < 16
    assert ds[0]["logits"].shape == (length, 9) and ds[0]["hidden"].shape == (length, 32)
    # Read back padded: padding positions carry zeros; the unlabeled sentences carry PAD tags only.
    padded = read_arrays(os.path.join(work, "transfer"), length=16)
    assert np.all(padded["logits"][padded["attention_mask"] == 0] == 0)
    assert np.all(padded["label_ids"][-1] == 8)
    # The teacher learned first pieces only (the default supervision): the cache marks exactly the
    # pieces that carry a word label (ids 0-4; X, [CLS], [SEP], [PAD] come after).
    labeled, marked = padded["label_ids"][:160], padded["teacher_mask"][:160]
    np.testing.assert_array_equal(marked == 1, labeled < 5)
    assert (labeled == 6).any()  # [CLS] pieces are there, and unmarked
    assert metrics["transfer"]["train_windows"] == 160 and metrics["transfer"]["dev"]["windows"] == 40


@pytest.fixture(scope="module")
def teacher_only_run(tmp_path_factory, toy_corpus, tiny_bert_dir):
    """A teacher-only run of the toy config with --teacher_epochs=0 (the step's scoring is its only
    forward pass), counting the windows of each pass (finetune.predict_by_length) of the run."""
    cfg = toy_config(tmp_path_factory.mktemp("work"), toy_corpus, tiny_bert_dir)
    cfg.student, cfg.teacher.finetune.epochs = None, 0
    passes = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(finetune, "predict_by_length",
                      lambda windows, fn, *args: passes.append(len(windows)) or predict_by_length(windows, fn, *args))
        metrics = pipeline.run(cfg)
    return cfg, metrics, passes


def test_teacher_step_scores_decoded_as_the_students_and_argmax_from_one_pass(teacher_only_run):
    """The teacher step's `scores` are evaluate_teacher's decoded as the students (constrained, marked so),
    its `argmax_scores` evaluate_teacher's own decoding, from one pass per split; metrics.json and the
    console summary read them."""
    cfg, metrics, passes = teacher_only_run
    work = pipeline.WorkDir(cfg.work_dir)
    info, splits = work.step_info("teacher"), pipeline.load_data(work)
    teacher, tokenizer = load_teacher(work.path("teacher") / "model")
    assert passes == [len(encode(splits[split], tokenizer, teacher.tag_vocab, 16)) for split in ("dev", "test")]
    seen = pipeline.seen_names(cfg, splits)   # both decodings on seen and unseen names too (issue 50)
    for split in ("dev", "test"):
        assert info["scores"][split] == {"decode": "constrained", **evaluate_teacher(
            teacher, tokenizer, splits[split], "IOB2", decode="constrained", seen=seen)}
        assert info["argmax_scores"][split] == evaluate_teacher(teacher, tokenizer, splits[split], "IOB2", seen=seen)
    # The fresh head's argmax breaks IOB2, which the constrained decoder repairs: the two differ.
    assert info["scores"]["test"]["all"]["f1"] != info["argmax_scores"]["test"]["all"]["f1"]
    assert metrics["teacher"]["scores"] == info["scores"]
    assert metrics["teacher"]["argmax_scores"] == info["argmax_scores"]
    summary = dict(line.split("  ", 1) for line in pipeline.summary_table(cfg.work_dir, metrics).splitlines())
    assert summary["teacher test F1 / P / R"].strip().startswith(f"{info['scores']['test']['all']['f1']:.4f} / ")
    assert summary["teacher (argmax) test F1 / P / R"].strip().startswith(
        f"{info['argmax_scores']['test']['all']['f1']:.4f} / ")


def test_a_teacher_step_of_an_older_version_gets_its_decoded_scores_once(teacher_only_run, tmp_path):
    """A work dir whose teacher step recorded only argmax `scores` (no "decode"): the next run scores the
    saved teacher decoded as the students and adds that to its step.json, the recorded scores kept as
    `argmax_scores`; the teacher and its fingerprint stay; the run after that does nothing again."""
    cfg, _, _ = teacher_only_run
    shutil.copytree(cfg.work_dir, tmp_path / "work")
    cfg = pipeline.RunConfig(**{**cfg.__dict__, "work_dir": str(tmp_path / "work")})
    step_file = tmp_path / "work" / "teacher" / STEP_FILE
    now = json.loads(step_file.read_text())
    recorded = {split: {**s, "recorded": "then"} for split, s in now["info"].pop("argmax_scores").items()}
    old = {**now, "info": {**now["info"], "scores": recorded}}
    step_file.write_text(json.dumps(old))
    model = {p: p.stat().st_mtime_ns for p in (tmp_path / "work" / "teacher" / "model").iterdir()}
    metrics = pipeline.run(cfg)
    upgraded = json.loads(step_file.read_text())
    assert upgraded == {**old, "info": {**old["info"], "scores": now["info"]["scores"], "argmax_scores": recorded}}
    assert metrics["teacher"]["scores"] == now["info"]["scores"] and metrics["teacher"]["argmax_scores"] == recorded
    assert {p: p.stat().st_mtime_ns for p in model} == model
    stamp = step_file.stat().st_mtime_ns
    pipeline.run(cfg)
    assert step_file.stat().st_mtime_ns == stamp


@pytest.mark.parametrize("head, data_format", [("crf", "conll"), ("softmax", "label_tsv")])
def test_an_older_crf_or_sentence_teacher_step_is_not_scored_again(tmp_path, head, data_format):
    """A CRF teacher's recorded scores are its Viterbi already: they only get their "decode"; a sentence
    teacher's are unchanged. Neither loads the teacher (there is none here)."""
    work = WorkDir(tmp_path)
    scores = {"dev": {"all": {"f1": 0.5}}, "test": {"all": {"f1": 0.25}}}
    work.mark_done("teacher", {"teacher": head}, {"scores": scores, "parameters": 7})
    cfg = pipeline.RunConfig(work_dir=str(tmp_path), data=DataConfig(format=data_format),
                             teacher=pipeline.TeacherConfig(head=head))
    pipeline._add_decoded_scores(work, cfg)
    decoded = {split: {"decode": "constrained", **s} for split, s in scores.items()} if head == "crf" else scores
    assert work.stored("teacher")["info"] == {"scores": decoded, "parameters": 7}
    assert work.stored("teacher")["fingerprint"] == {"teacher": head}


def test_student_is_distilled_saved_and_reloads(finished_run):
    cfg, metrics = finished_run
    # A tiny D4.2 student of the toy task is well above chance and close to its teacher.
    assert metrics["student"]["scores"]["test"]["all"]["f1"] > 0.7
    model, meta, tokenizer = load_student(os.path.join(cfg.work_dir, "student"))
    assert meta.tags[-4:] == ["X", "[CLS]", "[SEP]", "[PAD]"] and meta.lower_case is True

    splits = pipeline.load_data(pipeline.WorkDir(cfg.work_dir))
    seen = pipeline.seen_names(cfg, splits)
    reloaded = evaluate_student(model, tokenizer, TagVocab(meta.labels), meta.max_seq_length, splits["test"], "IOB2",
                                seen=seen)
    assert reloaded["all"]["f1"] == pytest.approx(metrics["student"]["scores"]["test"]["all"]["f1"])
    assert reloaded["seen_unseen"] == metrics["student"]["scores"]["test"]["seen_unseen"]


def test_metrics_and_summary_give_seen_and_unseen_names_side_by_side(finished_run):
    """Issue 50: the teacher's and the student's test scores on names the labeled train split holds and on the
    rest (data/scoring.entity_keys' rule, against data/train.jsonl), in metrics.json and bin/train's summary."""
    cfg, metrics = finished_run
    on_disk = json.loads((Path(cfg.work_dir) / "metrics.json").read_text())
    splits = pipeline.load_data(pipeline.WorkDir(cfg.work_dir))
    seen = pipeline.seen_names(cfg, splits)
    kinds = [("LOC" if tag == "B-LOC" else "PER", " ".join(s.tokens[i:j]))
             for s in splits["test"] for tag, i, j in _entities(s.tags)]
    in_train = {("LOC" if tag == "B-LOC" else "PER", " ".join(s.tokens[i:j]))
                for s in splits["train"] for tag, i, j in _entities(s.tags)}
    expected_seen = sum(kind in in_train for kind in kinds)
    assert expected_seen == len(kinds) - 1   # the toy names but for toy_corpus' one long city run
    cells = {}
    for model in ("teacher", "student"):
        names = on_disk[model]["scores"]["test"]["seen_unseen"]
        assert names == metrics[model]["scores"]["test"]["seen_unseen"]
        assert (names["seen"]["support"], names["unseen"]["support"]) == (expected_seen, len(kinds) - expected_seen)
        assert names["train_entities"] == len(seen) == len(in_train)
        assert names["seen"]["recall"] > 0.5   # a toy model above 0.7 F1 finds the names it was taught
        cells[model] = {kind: f"{names[kind]['recall']:.4f} / {names[kind]['precision']:.4f}"
                        for kind in ("seen", "unseen")}
    summary = dict(line.split("  ", 1) for line in pipeline.summary_table(cfg.work_dir, metrics).splitlines())
    for kind in ("seen", "unseen"):
        assert summary[f"test {kind} names R / P"].strip().startswith(
            f"teacher {cells['teacher'][kind]}  student {cells['student'][kind]}  (")


def _entities(tags):
    """(first tag, start, end) of each IOB2 entity of word tags."""
    spans, start = [], None
    for i, tag in enumerate(list(tags) + ["O"]):
        if start is not None and not tag.startswith("I-"):
            spans.append((tags[start], start, i))
            start = None
        if tag.startswith("B-"):
            start = i
    return spans


def test_rerun_skips_finished_steps(finished_run):
    cfg, _ = finished_run
    stamp = os.stat(os.path.join(cfg.work_dir, "teacher", "model", "head.npz")).st_mtime_ns
    pipeline.run(cfg)
    assert os.stat(os.path.join(cfg.work_dir, "teacher", "model", "head.npz")).st_mtime_ns == stamp


def test_each_step_records_its_own_peak_memory_and_a_rerun_keeps_it(finished_run, monkeypatch):
    cfg, metrics = finished_run
    peaks = metrics["peak_rss_mib"]
    assert list(peaks) == ["data", "teacher", "transfer", "student"]
    assert all(100 < mib < 16384 for mib in peaks.values()), peaks
    # A rerun skips every step: it measures nothing new, and the steps' own peaks stay in metrics.json.
    monkeypatch.setattr(pipeline.resident, "peak_mib", lambda: 1e9)
    again = pipeline.run(cfg)
    assert again["peak_rss_mib"] == peaks
    summary = pipeline.summary_table(cfg.work_dir, again)
    assert f"student {peaks['student'] / 1024:.2f} GiB" in summary.splitlines()[-2]


def test_teacher_steps_in_their_own_processes_give_the_same_run(finished_run, tmp_path, caplog):
    """--step_processes=always: the teacher and teacher-output steps run in child processes (run/isolate.py), whose
    log records come through this process's handlers, and make what one process makes."""
    cfg, metrics = finished_run
    alone = replace(cfg, work_dir=str(tmp_path / "alone"), step_processes="always")
    with caplog.at_level(logging.INFO, logger="xtremedistil_tf"):
        again = pipeline.run(alone)
    running = {r.getMessage(): r.process for r in caplog.records if r.getMessage().startswith("step ")}
    for name in ("teacher", "transfer"):
        assert running[f"step {name}: in a process of its own (--step_processes=always)"] == os.getpid()
    assert running["step student: running"] == os.getpid()
    assert running["step teacher: running"] != os.getpid()   # the teacher step's own line, from its process
    assert again["teacher"]["scores"]["test"]["all"] == metrics["teacher"]["scores"]["test"]["all"]
    np.testing.assert_allclose(read_arrays(os.path.join(alone.work_dir, "transfer"), length=16)["logits"],
                               read_arrays(os.path.join(cfg.work_dir, "transfer"), length=16)["logits"], atol=1e-5)
    assert set(again["peak_rss_mib"]) == {"data", "teacher", "transfer", "student"}


def test_a_failing_step_process_is_one_error_here(finished_run, tmp_path):
    cfg, _ = finished_run
    broken = replace(cfg, work_dir=str(tmp_path / "broken"), step_processes="always",
                     teacher=replace(cfg.teacher, layer=99))
    with pytest.raises(ConfigError, match="layer"):
        pipeline.run(broken)
    assert not (tmp_path / "broken" / "teacher").exists()


def test_transfer_rewrite_rewrites_unlabeled_text_at_the_teachers_spans(finished_run, tmp_path):
    """--transfer_rewrite=2 on a copy of the finished run: the teacher is kept, the rewrite step tags the unlabeled
    sentences and writes two rewrites of each in which it finds entities, each the same sentence with names at its
    spans; the transfer cache then holds them after the unlabeled sentences."""
    cfg, metrics = finished_run
    work = tmp_path / "rewrite"
    shutil.copytree(cfg.work_dir, work)
    stamp = (work / "teacher" / STEP_FILE).stat().st_mtime_ns
    again = pipeline.run(replace(cfg, work_dir=str(work), data=replace(cfg.data, transfer_rewrite=2), overwrite=True))
    assert (work / "teacher" / STEP_FILE).stat().st_mtime_ns == stamp   # the fine-tuned teacher is kept
    info = again["rewrite"]
    rewritten = [s.tokens for s in pipeline.read_jsonl(work / "rewrite" / pipeline.REWRITTEN)]
    found = info["sentences_with_entities"]
    assert 1 <= found <= 2 and info["unlabeled_sentences"] == 2 and len(rewritten) == 2 * found
    assert info["text"]["sentences"] == len(rewritten)
    # "john was in paris" / "mary at berlin .": the words between the names are kept, names come from the pool.
    assert all(("was" in t and "in" in t) or ("at" in t and "." in t) for t in rewritten)
    assert again["transfer"]["sentences"] == metrics["transfer"]["sentences"] + len(rewritten)
    assert again["data"]["transfer_sentences"] == 2


def test_a_damaged_shard_of_a_finished_transfer_step_is_named_and_computed_again(finished_run, tmp_path, caplog):
    """A shard of the teacher-output cache whose bytes changed in place (same size: a bad disk or copy) would stop a
    student hours in with TensorFlow's 'corrupted record'; a rerun names it in one line and recomputes just it."""
    cfg, _ = finished_run
    work = tmp_path / "work"
    shutil.copytree(cfg.work_dir, work, ignore=lambda d, names: [".lock"] if Path(d) == Path(cfg.work_dir) else [])
    shards = sorted((work / "transfer").glob("shard-*.tfrecord"))
    assert len(shards) >= 2
    shard, healthy = shards[1], shards[1].read_bytes()
    data = bytearray(healthy)
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    others = {p: p.stat().st_mtime_ns for p in shards if p != shard}
    teacher = (work / "teacher" / "step.json").stat().st_mtime_ns
    with caplog.at_level(logging.WARNING, logger="xtremedistil_tf.run.pipeline"):
        pipeline.run(replace(cfg, work_dir=str(work)))
    assert [r.getMessage() for r in caplog.records if r.name.startswith("xtremedistil_tf")] == [
        f"{shard}: damaged (its CRC-32 differs from the one manifest.json records); computing it again"]
    assert shard.read_bytes() == healthy                                   # recomputed: the same bytes again
    assert {p: p.stat().st_mtime_ns for p in others} == others             # the whole shards were kept
    assert (work / "teacher" / "step.json").stat().st_mtime_ns == teacher  # and the teacher
    assert damaged_shards(work / "transfer") == []


def test_work_dir_of_another_config_is_refused(finished_run, toy_corpus, tiny_bert_dir):
    cfg, _ = finished_run
    other = toy_config(cfg.work_dir, toy_corpus, tiny_bert_dir)
    other.data.dev_fraction = 0.3
    with pytest.raises(ConfigError, match=r"another configuration.*dev_fraction: 0.2 in the work dir, 0.3 now"):
        pipeline.run(other)
    assert json.load(open(os.path.join(cfg.work_dir, "data", "step.json")))["fingerprint"]["data"]["dev_fraction"] == 0.2


def test_cli_reports_bad_input_in_one_line(tmp_path):
    bad = tmp_path / "train.txt"
    bad.write_text("john B-PER\nparis\n", encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "train"), f"--work_dir={tmp_path / 'w'}",
                           f"--train_file={bad}", "--teacher=minilm", "--no_progress"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {bad}:2:")
    assert "Traceback" not in proc.stderr


# End to end through pipeline.run, so in the slow tier (CI runs it: Makefile CI_SLOW_TESTS); the default tier pins its
# pieces: tests/test_multigrained.py (the k-best cache, CRF students trained on it, their save and reload) and
# tests/test_crf_teacher.py (the CRF teacher).
@pytest.mark.slow
def test_multigrained_method_runs_end_to_end(tmp_path, toy_corpus, tiny_bert_dir):
    # BERT+CRF teacher -> k-best surrogates in the cache -> BiLSTM+CRF student -> Viterbi scores.
    cfg = toy_config(tmp_path / "work", toy_corpus, tiny_bert_dir)
    cfg.teacher.head = "crf"
    cfg.teacher.finetune.supervision = "all_pieces"  # a CRF's NLL needs a tag at every piece (recipe_for("crf"))
    cfg.teacher.dropout = cfg.teacher.embedding_dropout = 0.0
    cfg.transfer.kbest = 3
    # First teacher-only (bin/train --nostudent): no teacher outputs are cached for a student that never comes.
    cfg.student = None
    metrics = pipeline.run(cfg)
    assert "transfer" not in metrics and "student" not in metrics
    assert not os.path.exists(os.path.join(cfg.work_dir, "transfer"))
    assert "teacher outputs" not in pipeline.summary_table(cfg.work_dir, metrics)
    # Then the same work dir distils: the teacher is reused, the outputs are cached now.
    cfg.student = MultiGrainedConfig(arch=StudentArch(embedding_dim=16, hidden=16), kbest=3, epochs=6,
                                     batch_size=16, learning_rate=2e-2, patience=6, losses=("hard", "seq_ce"))
    metrics = pipeline.run(cfg)
    example = next(read_sharded(os.path.join(cfg.work_dir, "transfer")).as_numpy_iterator())
    assert example["kbest_tags"].shape == (3, example["attention_mask"].sum())
    assert "hidden" not in example  # no multi-grained loss reads it
    assert "teacher_mask" not in example  # a CRF teacher trains on every piece
    assert example["kbest_probs"].sum() + example["residual"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["teacher"]["scores"]["test"]["all"]["f1"] > 0.8
    assert metrics["student"]["scores"]["test"]["all"]["f1"] > 0.7
    model, meta, _ = load_student(os.path.join(cfg.work_dir, "student"))
    assert meta.decoder == "crf" and "crf" in [layer.name for layer in model.layers]


def test_caps_keep_the_first_sentences_of_each_language():
    sentences = [Sentence([str(i)], ["O"], lang) for i, lang in enumerate("aabbbab")]
    kept = first_per_language(sentences, 2)
    assert [(s.tokens[0], s.lang) for s in kept] == [("0", "a"), ("1", "a"), ("2", "b"), ("3", "b")]
    assert first_per_language(sentences, 0) is sentences


def test_tensorboard_logs_every_training_step(finished_run):
    cfg, _ = finished_run
    work = pipeline.WorkDir(cfg.work_dir)
    teacher = read_scalars(os.path.join(cfg.work_dir, "tensorboard", "teacher"))
    history = work.step_info("teacher")["history"]
    assert [v for _, v in teacher["dev_f1"]] == pytest.approx([e["dev_f1"] for e in history])
    assert {"train_loss", "learning_rate/head", "learning_rate/top_layer"} <= set(teacher)
    student = read_scalars(os.path.join(cfg.work_dir, "tensorboard", "student"))
    steps = work.step_info("student")["history"]["steps"]
    epochs = sum(len(step["val_losses"]) for step in steps)
    # One point per epoch across every stage and unfreezing step, for each loss term and the rate.
    assert [s for s, _ in student["val_loss"]] == list(range(1, epochs + 1))
    assert {"representation_transfer", "logits_transfer", "ce_train", "learning_rate"} <= set(student)
    assert all(0 < v <= cfg.student.learning_rate for _, v in student["learning_rate"])


def test_the_last_steps_dev_f1_is_the_students_dev_score(finished_run):
    """Table 4's dev F1 is decoded as the saved student is scored (the constrained word decoder), so a
    strategy's last step (the softmax head, the weights it keeps) gives the student's dev F1 exactly."""
    cfg, _ = finished_run
    info = pipeline.WorkDir(cfg.work_dir).step_info("student")
    last = info["history"]["steps"][-1]
    assert last["stage_name"] == "labels" and last["dev_f1"] is not None
    assert last["dev_f1"] == pytest.approx(info["scores"]["dev"]["all"]["f1"], abs=1e-12)


def test_student_fingerprint_is_the_config_less_how_it_runs():
    """asdict of the method's config (the architecture nested): heads_on="states" makes another
    XtremeDistil student; CRF students have no such heads; pad_id, verbose, run_eagerly, progress
    and log_dir (compare=False) make no other student."""
    xd = DistilConfig()
    assert pipeline.student_fingerprint(xd)["heads_on"] == "projection"
    assert pipeline.student_fingerprint(replace(xd, heads_on="states"))["heads_on"] == "states"
    # case_dim=0 (no word shapes) is left out, so students made before the field match.
    assert pipeline.student_fingerprint(xd)["arch"] == {k: v for k, v in asdict(StudentArch()).items()
                                                        if k != "case_dim"} != \
        pipeline.student_fingerprint(replace(xd, arch=StudentArch(hidden=200)))["arch"]
    assert pipeline.student_fingerprint(replace(xd, arch=StudentArch(case_dim=8)))["arch"]["case_dim"] == 8
    assert pipeline.student_fingerprint(replace(xd, pad_id=7, verbose=1, run_eagerly=True)) == \
        pipeline.student_fingerprint(xd)
    # transfer_sentences=None (the whole transfer set), group_by_length=0 and word_dropout=0 (off) are left out, so
    # students made before the fields match.
    assert set(pipeline.student_fingerprint(xd)) == {f for f in asdict(xd) if f not in (
        "pad_id", "verbose", "run_eagerly", "transfer_sentences", "group_by_length", "word_dropout")}
    mg = MultiGrainedConfig()
    assert "heads_on" not in pipeline.student_fingerprint(mg) and pipeline.student_fingerprint(mg)["method"] == "multigrained"
    assert pipeline.student_fingerprint(replace(mg, run_eagerly=True, progress=True, log_dir="x")) == \
        pipeline.student_fingerprint(mg)


def test_student_fingerprint_ignores_what_the_method_does_not_read():
    xd = DistilConfig()
    # Multi-grained settings are not an XtremeDistil student's, nor XtremeDistil's a multi-grained one's.
    assert not {"losses", "kbest", "weighting", "use_unlabeled"} & set(pipeline.student_fingerprint(xd))
    assert not {"strategy", "epochs_per_layer", "alpha"} & set(pipeline.student_fingerprint(MultiGrainedConfig()))
    mg = MultiGrainedConfig(losses=("seq_fuzzy", "hard", "seq_ce"))
    assert pipeline.student_fingerprint(mg)["losses"] == ["hard", "seq_ce", "seq_fuzzy"]
    assert pipeline.student_fingerprint(mg) != pipeline.student_fingerprint(replace(mg, losses=("hard", "seq_ce")))


def test_one_seed_default():
    """bin/train's --seed default (42) is every config's it builds: a config made without a seed is
    the run bin/train makes without --seed. The data's hold-out seed is another default (0, the
    TFDS builders' configs): bin/train passes --seed to it too."""
    assert FinetuneConfig().seed == DistilConfig().seed == MultiGrainedConfig().seed == DEFAULT_SEED == 42
    assert DataConfig().seed == 0


def test_student_flags_left_unset_keep_the_method_configs_defaults(tmp_path, tiny_bert_dir):
    """bin/train restates no student default: with no student flags its config is the method's
    dataclass as it is; a flag sets one field (the architecture's nested in `arch`)."""
    (tmp_path / "train.txt").write_text("John B-PER\nlives O\n\n", encoding="utf-8")
    base = [f"--data_dir={tmp_path}", "--train_file=train.txt", "--dev_fraction=0.5", f"--teacher={tiny_bert_dir}",
            "--teacher_random_init", f"--work_dir={tmp_path / 'w'}", "--teacher_layer=1"]
    mg = ["--method=multigrained", "--teacher_head=crf"]
    cases = [[], mg, [*mg, "--student_batch_size=64", "--student_hidden=200", "--mg_losses=token_em,hard"],
             ["--student_patience=0", "--student_heads_on=states"], [*mg, "--mg_losses=hard,kl"]]
    xd, multigrained, chosen, xd_chosen, refused = train_configs([base + c for c in cases],
                                                                 "pipeline.student_fingerprint(cfg.student)")
    assert xd == json.loads(json.dumps(pipeline.student_fingerprint(DistilConfig())))
    assert multigrained == json.loads(json.dumps(pipeline.student_fingerprint(MultiGrainedConfig())))
    assert (multigrained["batch_size"], multigrained["patience"], xd["batch_size"], xd["patience"]) == (32, 5, 512, 3)
    assert xd["seed"] == multigrained["seed"] == DEFAULT_SEED  # --seed's default
    assert (chosen["batch_size"], chosen["arch"]["hidden"], chosen["losses"], chosen["token_loss"]) == \
        (64, 200, ["hard", "token_em"], "ce")
    assert (xd_chosen["patience"], xd_chosen["heads_on"], xd_chosen["batch_size"]) == (0, "states", 512)
    assert "losses" in refused["error"]


def test_transfer_only_and_intra_op_threads_flags(tmp_path, tiny_bert_dir):
    """--transfer_only and --intra_op_threads reach the RunConfig; --transfer_only refuses
    --distribution=multi_worker (it reads TF_CONFIG itself), a negative thread count is refused."""
    base = [f"--data_dir={tmp_path}", "--train_file=train.txt", "--dev_fraction=0.5", f"--teacher={tiny_bert_dir}",
            "--teacher_random_init", f"--work_dir={tmp_path / 'w'}", "--teacher_layer=1"]
    (tmp_path / "train.txt").write_text("John B-PER\nlives O\n\n", encoding="utf-8")
    cases = [[], ["--transfer_only", "--intra_op_threads=1"], ["--transfer_only", "--distribution=multi_worker"],
             ["--intra_op_threads=-1"]]
    default, chosen, multi_worker, negative = train_configs([base + c for c in cases],
                                                            "[cfg.transfer_only, cfg.intra_op_threads]")
    assert (default, chosen) == ([False, 0], [True, 1])
    assert "--transfer_only reads TF_CONFIG itself" in multi_worker["error"]
    assert "--intra_op_threads=-1; expected at least 0" in negative["error"]


def test_report_probes_teacher_beside_student(finished_run, tmp_path):
    """report.md's probe table (issue 29 item 5): each probe in the served split, tagged by the teacher and the
    student, with the capitalised words the train split holds; the defaults are the run's languages' probes."""
    cfg, _ = finished_run
    probes = tmp_path / "probes.txt"
    probes.write_text("John met Mary in Paris.\n\nthe berlin of Qwerty\n", encoding="utf-8")
    rows = probe_rows(cfg.work_dir, str(probes))
    assert [r[0] for r in rows] == ["John met Mary in Paris.", "the berlin of Qwerty"]
    assert "[John]PER" in rows[0][1] and "[Paris]LOC" in rows[0][1]   # the toy teacher's test F1 is above 0.8
    assert rows[0][2].replace("[", "").replace("]PER", "").replace("]LOC", "") == rows[0][0]
    assert rows[0][3] == "none" and rows[1][3] == "none"   # the toy corpus is lower case
    # The student's entities, in its own column, against the teacher's: same characters and type.
    student = {e for e in ("[John]PER", "[Mary]PER", "[Paris]LOC") if e in rows[0][2]}
    teacher = {e for e in ("[John]PER", "[Mary]PER", "[Paris]LOC") if e in rows[0][1]}
    assert rows[0][4] == f"{len(student & teacher)} of {rows[0][1].count(']')}"
    assert agreement(rows)[1] == rows[0][1].count("]") + rows[1][1].count("]")
    assert list(as_sentence("Paris.").tokens) == ["Paris", "."]
    report = write_report(cfg.work_dir, probes_file=str(probes)).read_text(encoding="utf-8")
    assert "## Probe sentences" in report and rows[0][1] in report
    assert "## Seen and unseen names (test split)" in report   # teacher and student side by side (issue 50)
    assert probe_texts(Path(cfg.work_dir)) == [("en", text) for text in DEFAULT_PROBES["en"]]


def test_probe_agreement_of_another_student_is_its_probe_rows_count(finished_run, tmp_path):
    """`bin/report --probe_students` counts, for a student other than W/student (a seed of bin/ablate's), what
    report.md's probe table counts for W/student: the same function on the same teacher; a dir that is no student
    is one line."""
    cfg, _ = finished_run
    probes = tmp_path / "probes.txt"
    probes.write_text("John met Mary in Paris.\nBerlin is far from Paris.\n", encoding="utf-8")
    other = tmp_path / "seed-1"
    shutil.copytree(Path(cfg.work_dir) / "student", other)
    expected = agreement(probe_rows(cfg.work_dir, str(probes)))
    assert probes_module.probe_agreement(cfg.work_dir, other, str(probes)) == expected and expected[1] > 0
    with pytest.raises(ConfigError, match=rf"^--probe_students: {tmp_path} is no saved student"):
        probes_module.probe_agreement(cfg.work_dir, tmp_path, str(probes))


def test_probe_rows_are_kept_until_a_step_or_the_probes_change(finished_run, tmp_path, monkeypatch):
    """`bin/report` after `bin/train` (make demo) keeps the probe rows bin/train computed: no model is loaded again;
    other probes, or a step made again (a new step.json, even with the same settings), compute them afresh."""
    cfg, _ = finished_run
    work = tmp_path / "work"
    shutil.copytree(cfg.work_dir, work, ignore=lambda d, names: [".lock"] if Path(d) == Path(cfg.work_dir) else [])
    (work / "probes.json").unlink(missing_ok=True)
    probes = tmp_path / "probes.txt"
    probes.write_text("John met Mary in Paris.\n", encoding="utf-8")
    rows = probe_rows(work, str(probes))
    loads = []
    real = probes_module.load_student
    monkeypatch.setattr(probes_module, "load_student", lambda *a: loads.append(a) or real(*a))
    assert probe_rows(work, str(probes)) == rows and loads == []
    probes.write_text("Mary met John in Berlin.\n", encoding="utf-8")
    assert probe_rows(work, str(probes))[0][0] == "Mary met John in Berlin." and len(loads) == 1
    step = work / "student" / STEP_FILE
    time.sleep(0.01)
    step.write_bytes(step.read_bytes())   # the student step made again
    assert probe_rows(work, str(probes))[0][0] == "Mary met John in Berlin." and len(loads) == 2


def test_transfer_only_workers_write_the_caches_of_a_full_run(finished_run, tmp_path):
    """--transfer_only on a work dir whose teacher is done: two workers (threads here, each its part as
    TF_CONFIG would give it) write the caches a full run writes, and mark the step done as it does, so
    the next full run goes on to the student. Without a done teacher it is refused."""
    cfg, _ = finished_run
    work = tmp_path / "work"
    skip = {"transfer", "transfer_dev", "student", ".lock", "metrics.json"}
    shutil.copytree(cfg.work_dir, work, ignore=lambda d, names: [n for n in names if Path(d) == Path(cfg.work_dir)
                                                                 and n in skip])
    split = replace(cfg, work_dir=str(work), transfer_only=True)
    results, errors = {}, []

    def worker(index):
        try:
            results[index] = pipeline.run_transfer_only(split, part=(index, 2))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and results[0] == results[1] and results[0]["transfer"]["windows"] > 0
    full = pipeline.WorkDir(cfg.work_dir)
    assert json.loads((work / "transfer" / "step.json").read_text())["hash"] == full.stored("transfer")["hash"]
    for name in ("transfer", "transfer_dev"):
        got = list(read_sharded(work / name).as_numpy_iterator())
        want = list(read_sharded(full.path(name)).as_numpy_iterator())
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g["input_ids"], w["input_ids"])
            np.testing.assert_allclose(g["logits"], w["logits"], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(g["hidden"], w["hidden"], rtol=2 ** -10, atol=1e-6)
    assert not (work / "metrics.json").exists() and not (work / "student").exists()   # only the caches
    with pytest.raises(ConfigError, match="step data is not done"):
        pipeline.run(replace(split, work_dir=str(tmp_path / "empty")))


def test_a_step_transfer_only_needs_is_refused_naming_the_command_that_builds_it(tmp_path):
    """--transfer_only builds neither the teacher nor the rewrites: each refusal names what does (--nostudent
    fine-tunes the teacher but stops before the rewrites, so it is not the rewrites' command)."""
    work = pipeline.WorkDir(tmp_path / "work")
    work.must_be_done = dict(pipeline.TRANSFER_ONLY_NEEDS)
    built = []
    for name, command in (("teacher", "--nostudent"), ("rewrite", "without --transfer_only")):
        with pytest.raises(ConfigError, match=rf"^step {name} is not done in .*; run it first \(bin/train .*"
                                              rf"{command}"):
            work.run_step(name, {"x": 1}, built.append)
    assert "--nostudent" not in pipeline.TRANSFER_ONLY_NEEDS["rewrite"] and not built


def test_a_relative_transfer_file_found_here_but_not_under_data_dir_is_one_line(tmp_path, monkeypatch):
    """A relative --transfer_file is read under --data_dir; one that exists only where the command runs is refused
    naming both places, before anything is read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bbc.txt").write_text("Some news .\n", encoding="utf-8")
    (tmp_path / "data").mkdir()
    cfg = DataConfig(format="conll", data_dir=str(tmp_path / "data"), train_file="train.txt", transfer_file="bbc.txt")
    with pytest.raises(ConfigError, match=r"^--transfer_file=bbc.txt: a relative path is read under --data_dir, where "
                                          rf".*/data/bbc.txt does not exist; give the file here as "
                                          rf"--transfer_file={tmp_path / 'bbc.txt'}$"):
        check_data_config(cfg)
    (tmp_path / "data" / "bbc.txt").write_text("Other news .\n", encoding="utf-8")
    check_data_config(cfg)   # under --data_dir: that one is read, as documented
