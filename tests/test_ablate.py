"""bin/ablate and bin/evaluate on a tiny two-language WikiAnn-format corpus with a random tiny teacher."""
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, toy_ner_sentences

from xtremedistil_tf.data.alignment import TagVocab, encode
from xtremedistil_tf.data.loading import DataConfig, check_data_config, load_splits
from xtremedistil_tf.data.readers import read_wikiann_dirs
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods import student_run
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.student_run import evaluate_student, load_student
from xtremedistil_tf.run import ablate, pipeline
from xtremedistil_tf.run.workdir import WorkDir
from xtremedistil_tf.students import StudentArch
from xtremedistil_tf.teachers.finetune import FinetuneConfig
from xtremedistil_tf.transfer.cache import read_arrays

LANGS = ["en", "de"]
SIZES = {"train": 60, "dev": 15, "test": 15}


def write_wikiann(path, sentences):
    path.write_text("".join("".join(f"{s.lang}:{w}\t{t}\n" for w, t in zip(s.tokens, s.tags)) + "\n"
                            for s in sentences), encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("wikiann")
    for k, lang in enumerate(LANGS):
        (root / lang).mkdir()
        for j, (split, n) in enumerate(SIZES.items()):
            write_wikiann(root / lang / split, toy_ner_sentences(n, seed=10 * k + j, lang=lang))
    return root


def tiny_config(work_dir, corpus, teacher_dir):
    """The toy ablation's settings; `tiny_flags` are the same as bin/ablate flags (--seed=42 makes
    the data and the teacher)."""
    data = DataConfig(format="wikiann", data_dir=str(corpus), langs=list(LANGS), seed=42)
    teacher = pipeline.TeacherConfig(name=str(teacher_dir), random_init=True, max_seq_length=16, dropout=0.0,
                                     layer=1, finetune=FinetuneConfig(epochs=3, batch_size=16, learning_rate=3e-3,
                                                                      # a random tiny encoder: the head
                                                                      # trains with it (0: at the encoder's
                                                                      # rate), BERT-initialised
                                                                      head_learning_rate=0.0, head_init="bert",
                                                                      progress=False))
    student = DistilConfig(arch=StudentArch(embedding_dim=8, hidden=8), epochs_per_layer=2, patience=2, batch_size=16,
                           learning_rate=5e-2)
    return pipeline.RunConfig(work_dir=str(work_dir), data=data, teacher=teacher, student=student,
                              transfer=pipeline.TransferConfig(shard_size=64, batch_size=32), progress=False)


def tiny_flags(work_dir, corpus, teacher_dir):
    """tiny_config as bin/ablate flags."""
    return ["--data_format=wikiann", f"--data_dir={corpus}", f"--langs={','.join(LANGS)}", f"--teacher={teacher_dir}",
            "--teacher_random_init", "--max_seq_length=16", "--teacher_dropout=0", "--teacher_layer=1",
            "--teacher_epochs=3", "--teacher_batch_size=16", "--teacher_learning_rate=3e-3",
            "--teacher_head_learning_rate=0", "--teacher_head_init=bert", "--student_embedding_dim=8",
            "--student_hidden=8", "--epochs_per_layer=2", "--student_patience=2", "--student_batch_size=16",
            "--student_learning_rate=5e-2", "--shard_size=64", "--transfer_batch_size=32", "--no_progress",
            f"--work_dir={work_dir}"]


def stamps(work_dir, steps):
    """Modification times of the steps' records (the dev cache is recorded by its manifest)."""
    files = [os.path.join(s, "manifest.json" if s == "transfer_dev" else "step.json") for s in steps]
    return {f: os.stat(os.path.join(work_dir, f)).st_mtime_ns for f in files}


UPSTREAM = ("data", "teacher", "transfer", "transfer_dev")
# The shared run trains a teacher and three students and saves them as SavedModels: about 140 s of
# CPU on 2 cores (TF tracing and SavedModel writing dominate; the sizes are already the smallest).
END_TO_END = pytest.mark.slow


@pytest.fixture(scope="module")
def ablation(tmp_path_factory, corpus, tiny_bert_dir):
    """D0, then a rerun that adds D1 (as a killed ablation resumes at its first unfinished strategy)."""
    cfg = tiny_config(tmp_path_factory.mktemp("work"), corpus, tiny_bert_dir)
    ablate.run_ablation(cfg, ["D0"])
    first = stamps(cfg.work_dir, UPSTREAM + ("ablate/D0",))
    report = ablate.run_ablation(cfg, ["D0", "D1"])
    return cfg, first, report


def info(cfg, step):
    return json.load(open(os.path.join(cfg.work_dir, step, "step.json")))["info"]


def parse_tables(text):
    """Markdown tables of `text` as lists of rows (lists of cells), header first."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            if not line.startswith("|---"):
                current.append([c.strip() for c in line.strip("|").split("|")])
        else:
            current = None
    return tables


def pct(x):
    return f"{100 * x:.2f}"


@END_TO_END
def test_upstream_steps_run_once_and_finished_strategies_are_skipped(ablation):
    cfg, first, report = ablation
    assert stamps(cfg.work_dir, UPSTREAM + ("ablate/D0",)) == first
    assert os.path.exists(os.path.join(cfg.work_dir, "ablate", "D1", "student.json"))
    assert open(os.path.join(cfg.work_dir, "ablation.md"), encoding="utf-8").read() == report
    # A third run has nothing left to train.
    steps = UPSTREAM + ("ablate/D0", "ablate/D1")
    again = stamps(cfg.work_dir, steps)
    assert ablate.run_ablation(cfg, ["D0", "D1"]) == report
    assert stamps(cfg.work_dir, steps) == again


@END_TO_END
def test_table3_matches_the_scores_in_the_step_dirs(ablation):
    cfg, _, report = ablation
    table = parse_tables(report)[0]
    assert table[0] == ["model", "strategy", "de", "en", "mean", "std", "all", "% of teacher"]
    # The teacher step's scores decoded as the students are (constrained) are the 100%; its argmax scores a row.
    assert [row[0] for row in table[1:]] == ["teacher", "teacher (argmax)", "D0", "D1"]
    teacher = info(cfg, "teacher")["scores"]["test"]
    own = info(cfg, "teacher")["argmax_scores"]["test"]
    assert teacher["decode"] == "constrained" and not os.path.exists(os.path.join(cfg.work_dir, "ablate",
                                                                                  "teacher-decoded"))
    teacher_mean = np.mean([teacher["languages"][lang]["f1"] for lang in ("de", "en")])
    for row in table[1:]:
        scores = {"teacher": teacher, "teacher (argmax)": own}.get(row[0]) or info(cfg, f"ablate/{row[0]}")["scores"][
            "test"]
        f1 = [scores["languages"][lang]["f1"] for lang in ("de", "en")]
        assert scores["languages"]["de"]["sentences"] == scores["languages"]["en"]["sentences"] == SIZES["test"]
        assert row[2:7] == [pct(f1[0]), pct(f1[1]), pct(np.mean(f1)), pct(np.std(f1)), pct(scores["all"]["f1"])]
        assert row[7] == f"{np.mean(f1) / teacher_mean:.1%}"
    assert table[1][7] == "100.0%" and teacher["all"]["f1"] > 0.5


def test_table3_reads_the_teachers_decoded_and_argmax_scores_from_the_teacher_step(tmp_path):
    """Table 3's 100% is the teacher step's `scores` (decoded as the students), its `teacher (argmax)` row
    the step's `argmax_scores`; a teacher step without them (a CRF teacher) gives one teacher row."""
    def scores(f1, **extra):
        return {"test": {"all": {"f1": f1}, **extra}}

    work = WorkDir(tmp_path)
    teacher = {"scores": scores(0.8, decode="constrained"), "argmax_scores": scores(0.7), "parameters": 1}
    work.mark_done("teacher", {"teacher": 1}, teacher)
    work.mark_done("ablate/D1", {"student": 1}, {"scores": scores(0.6)})
    table = parse_tables(ablate.table3_markdown(tmp_path, ["D1"]))[0]
    assert table[1:] == [
        ["teacher", "fine-tuned teacher, decoded as the students (constrained word decoding)", "80.00", "100.0%"],
        ["teacher (argmax)", "the same teacher, its own decoding (argmax at each word's first piece)", "70.00",
         "87.5%"],
        ["D1", table[3][1], "60.00", "75.0%"]]
    del teacher["argmax_scores"]
    work.mark_done("teacher", {"teacher": 1}, teacher)
    assert [row[0] for row in parse_tables(ablate.table3_markdown(tmp_path, ["D1"]))[0][1:]] == ["teacher", "D1"]


@END_TO_END
def test_table4_lists_every_unfreeze_step_with_its_dev_f1(ablation):
    cfg, _, report = ablation
    tables = parse_tables(report)[1:]
    d0 = info(cfg, "ablate/D0")["per_language"]
    # D0: one table per language (in language order, as Table 3); D1: one.
    histories = [d0["de"]["history"], d0["en"]["history"], info(cfg, "ablate/D1")["history"]]
    assert len(tables) == len(histories)
    for table, history in zip(tables, histories):
        assert table[0] == ["stage", "loss", "unfrozen", "best epoch", "dev loss (start → best)", "dev F1"]
        assert [[row[0], row[3], row[5]] for row in table[1:]] == \
            [[str(s["stage"]), str(s["best_epoch"]), pct(s["dev_f1"])] for s in history["steps"]]
    assert tables[2][1][:3] == ["1", "labels+logits", "softmax + logits + projection + bilstm + word_embedding"]
    assert report.index("de student:") < report.index("en student:") < report.index("### D1")


def test_table3_of_sentences_without_languages_gives_f1_and_share_only():
    """CoNLL-like data: scores have no languages and no f1_mean; Table 3 shows `all` and `% of teacher`."""
    rows = parse_tables("\n".join(ablate.table3({"test": {"all": {"f1": 0.8}}},
                                                 {"D1": [{"scores": {"test": {"all": {"f1": 0.6}}}}]})))[0]
    assert rows[0] == ["model", "strategy", "all", "% of teacher"]
    assert [row[2:] for row in rows[1:]] == [["80.00", "100.0%"], ["60.00", "75.0%"]]


def test_table4_of_a_representation_stage_has_no_f1():
    step = {"stage": 1, "stage_name": "representation", "unfrozen": ["projection", "bilstm"], "best_epoch": 0,
            "initial_val_loss": 0.5, "best_val_loss": 0.5, "dev_f1": None}
    later = {**step, "stage": 2, "stage_name": "logits", "unfrozen": ["logits"], "best_epoch": 3,
             "initial_val_loss": 2.25, "best_val_loss": 0.123456, "dev_f1": 0.8765}
    rows = parse_tables("\n".join(ablate.table4({"steps": [step, later]})))[0][1:]
    assert rows == [["1", "representation", "projection + bilstm", "0", "0.5 → 0.5", "–"],
                    ["2", "logits", "logits", "3", "2.25 → 0.1235", "87.65"]]


@END_TO_END
def test_d0_trains_one_student_per_language_on_its_own_windows(ablation, tiny_tokenizer):
    cfg, _, _ = ablation

    work = WorkDir(cfg.work_dir)
    splits = pipeline.load_data(work)

    class Teacher:  # what cached_window_languages reads of a teacher
        tag_vocab = TagVocab(json.load(open(os.path.join(cfg.work_dir, "data", "labels.json"))))
        max_seq_length = 16

    langs = ablate.cached_window_languages(work, splits, tiny_tokenizer, Teacher)
    cache = read_arrays(work.path("transfer"), length=16, keys=["input_ids"])["input_ids"][:len(langs["train"])]
    for lang in LANGS:
        own = encode([s for s in splits["train"] if s.lang == lang], tiny_tokenizer, Teacher.tag_vocab, 16)
        picked = np.stack([w for w, l in zip(cache, langs["train"]) if l == lang])
        np.testing.assert_array_equal(picked, own.input_ids)
        assert os.path.exists(os.path.join(cfg.work_dir, "ablate", "D0", f"student-{lang}", "student.json"))
    d0 = info(cfg, "ablate/D0")
    assert set(d0["per_language"]) == set(LANGS)
    assert d0["parameters"] == 2 * info(cfg, "ablate/D1")["parameters"]


@END_TO_END
def test_d0_scores_are_the_pipelines_scores_of_each_language_student(ablation):
    """D0's per-language F1 in step.json (and so in ablation.md) is what the pipeline's scoring
    (student_run.evaluate_student: the constrained word decoder) gives that language's student."""
    cfg, _, _ = ablation

    test = pipeline.load_data(WorkDir(cfg.work_dir))["test"]
    recorded = info(cfg, "ablate/D0")["scores"]["test"]["languages"]
    for lang in LANGS:
        model, meta, tokenizer = load_student(os.path.join(cfg.work_dir, "ablate", "D0", f"student-{lang}"))
        scores = evaluate_student(model, tokenizer, TagVocab(meta.labels), meta.max_seq_length,
                                  [s for s in test if s.lang == lang], meta.scheme)
        # The toy D0 students tag every word O, where both decoders agree: the next test tells them apart.
        assert recorded[lang]["f1"] == pytest.approx(scores["all"]["f1"], abs=1e-12)


def swapped_bi(student, tag_vocab):
    """`student` with the probabilities of B-X and I-X swapped for every type X: its argmax starts
    entities with I- after O, which the constrained decoder must replace."""
    tags = list(tag_vocab.tags)
    swap = {"B-": "I-", "I-": "B-"}
    perm = [tags.index(swap[t[:2]] + t[2:]) if t[:2] in swap and swap[t[:2]] + t[2:] in tags else i
            for i, t in enumerate(tags)]
    inputs = {key: tf.keras.Input([None], dtype=tf.int32, name=key) for key in ("input_ids", "attention_mask")}
    probs = student(inputs, training=False)["probs"]
    return tf.keras.Model(inputs, {"probs": tf.gather(probs, perm, axis=-1)})


@END_TO_END
def test_d0_scores_decode_as_the_pipeline_where_argmax_would_differ(ablation, tmp_path, monkeypatch):
    """step_per_language scores with the pipeline's decoder (evaluate_student), on students whose
    argmax breaks the scheme: the recorded F1 is the constrained decoder's, not the argmax's."""
    cfg, _, _ = ablation
    shutil.copytree(cfg.work_dir, tmp_path / "work")
    work = WorkDir(tmp_path / "work")
    tag_vocab = TagVocab(json.load(open(work.path("data") / "labels.json")))
    # D1's student (it finds some entities), B/I-swapped, stands in for each language's D0 student.
    d1, _, tokenizer = student_run.load_student(work.path("ablate") / "D1")
    students = {lang: swapped_bi(d1, tag_vocab) for lang in LANGS}

    class History:
        def to_dict(self):
            return {"steps": []}

    monkeypatch.setattr(ablate, "_distil_language",
                        lambda work, sc, teacher, tokenizer, dev, window_langs, lang, *rest: (students[lang], History()))
    monkeypatch.setattr(student_run, "save_student", lambda *args, **kwargs: None)
    d0_cfg = replace(cfg, work_dir=str(work.root), student=replace(cfg.student, strategy="D0", seed=7))
    _, fingerprint = ablate.upstream_steps(d0_cfg)
    ablate.step_per_language(work, d0_cfg, fingerprint, LANGS, "ablate/probe")
    recorded = work.step_info("ablate/probe")["scores"]["test"]["languages"]
    test = pipeline.load_data(work)["test"]
    differs = []
    for lang in LANGS:
        own = [s for s in test if s.lang == lang]
        f1 = {decode_as: student_run.evaluate_student(students[lang], tokenizer, tag_vocab, 16, own, cfg.data.scheme,
                                                      decode_as=decode_as)["all"]["f1"]
              for decode_as in ("constrained", "argmax")}
        assert recorded[lang]["f1"] == pytest.approx(f1["constrained"], abs=1e-12)
        differs.append(f1["argmax"] != pytest.approx(f1["constrained"], abs=1e-6))
    assert any(differs), "the swapped students' argmax should score differently"


def run_cli(*args):
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


@END_TO_END
def test_bin_evaluate_gives_the_pipeline_scores(ablation, corpus, tmp_path):
    cfg, _, _ = ablation
    evaluate = str(REPO / "bin" / "evaluate")
    data = ["--data_format=wikiann", f"--data_dir={corpus}"]
    jobs = {
        # A teacher without --decode: decoded as the students, the ablation's 100%.
        "teacher": run_cli(evaluate, f"--model={cfg.work_dir}/teacher/model", *data, "--langs=en,de",
                           f"--output_json={tmp_path / 'teacher.json'}"),
        # --decode=own: its own decoding, the teacher step's argmax_scores.
        "teacher-own": run_cli(evaluate, f"--model={cfg.work_dir}/teacher/model", *data, "--langs=en,de",
                               "--decode=own", f"--output_json={tmp_path / 'teacher-own.json'}"),
        "own of a student": run_cli(evaluate, f"--model={cfg.work_dir}/ablate/D1", *data, "--langs=en,de",
                                    "--decode=own"),
        "D1": run_cli(evaluate, f"--model={cfg.work_dir}/ablate/D1", *data, "--langs=en,de",
                      f"--output_json={tmp_path / 'D1.json'}"),
        # D0's German student alone scores the German test sentences as the ablation did.
        "D0-de": run_cli(evaluate, f"--model={cfg.work_dir}/ablate/D0/student-de", *data, "--langs=de",
                         f"--output_json={tmp_path / 'D0-de.json'}"),
        "neither": run_cli(evaluate, f"--model={cfg.work_dir}/ablate", *data, "--langs=de"),
        # Every finished student and the teacher with both word decoders.
        "decoders": run_cli(str(REPO / "bin" / "benchmark"), "decoders", f"--work_dir={cfg.work_dir}"),
        "decoders of no ablation": run_cli(str(REPO / "bin" / "benchmark"), "decoders", f"--work_dir={tmp_path}"),
        "bad strategy": run_cli(str(REPO / "bin" / "ablate"), f"--work_dir={tmp_path / 'w'}", "--strategies=D0,D5"),
        "bad seeds": run_cli(str(REPO / "bin" / "ablate"), f"--work_dir={tmp_path / 'w'}", "--seeds=1,-2"),
        "bad seeds of variants": run_cli(str(REPO / "bin" / "ablate"), f"--work_dir={tmp_path / 'w'}",
                                         "--seeds=1,1", "--method=multigrained"),
    }
    out = {name: (job.wait(timeout=300), *job.communicate()) for name, job in jobs.items()}
    for name in ("teacher", "teacher-own", "D1", "D0-de"):
        assert out[name][0] == 0, out[name][2][-2000:]
        scores = json.load(open(tmp_path / f"{name}.json"))
        assert f"F1 {scores['all']['f1']:.4f}" in out[name][1]
        # bin/evaluate decodes a teacher as the students (constrained) unless given --decode=own.
        expected = {"teacher": info(cfg, "teacher")["scores"], "teacher-own": info(cfg, "teacher")["argmax_scores"],
                    "D1": info(cfg, "ablate/D1")["scores"], "D0-de": info(cfg, "ablate/D0")["scores"]}[name]["test"]
        if name == "D0-de":
            assert scores["all"]["f1"] == pytest.approx(expected["languages"]["de"]["f1"], abs=1e-12)
            assert scores["all"]["sentences"] == SIZES["test"]
        else:
            assert scores["all"]["f1"] == pytest.approx(expected["all"]["f1"], abs=1e-12)
            assert scores["f1_mean"] == pytest.approx(expected["f1_mean"], abs=1e-12)
            assert f"mean {scores['f1_mean']:.4f}" in out[name][1]
    assert json.load(open(tmp_path / "teacher.json"))["kind"] == "teacher"
    assert json.load(open(tmp_path / "teacher.json"))["decode"] == "constrained"
    assert json.load(open(tmp_path / "teacher-own.json"))["decode"] == "own"
    assert info(cfg, "teacher")["scores"]["test"] != info(cfg, "teacher")["argmax_scores"]["test"]
    # bin/benchmark decoders: its constrained column is Table 3's (the students' recorded scores, the
    # teacher step's), its argmax column the teacher step's argmax scores and the students' argmax scores.
    assert out["decoders"][0] == 0, out["decoders"][2][-2000:]
    table, = parse_tables(out["decoders"][1])
    assert table[0] == ["model", "constrained", "argmax"]
    rows = {row[0]: row[1:] for row in table[1:]}
    assert sorted(rows) == ["D1", "teacher"] and "skipped (per-language D0 students, CRF students): D0/student-de" in \
        out["decoders"][1]
    assert rows["teacher"] == [pct(info(cfg, "teacher")["scores"]["test"]["f1_mean"]),
                               pct(info(cfg, "teacher")["argmax_scores"]["test"]["f1_mean"])]

    d1, meta, tokenizer = student_run.load_student(os.path.join(cfg.work_dir, "ablate", "D1"))
    test = pipeline.load_data(WorkDir(cfg.work_dir))["test"]
    argmax = student_run.evaluate_student(d1, tokenizer, TagVocab(meta.labels), meta.max_seq_length, test,
                                          cfg.data.scheme, decode_as="argmax")["f1_mean"]
    assert rows["D1"] == [pct(info(cfg, "ablate/D1")["scores"]["test"]["f1_mean"]), pct(argmax)]
    code, _, err = out["decoders of no ablation"]
    assert code == 2 and "expected a bin/ablate work dir" in err.strip().splitlines()[-1], err[-2000:]
    for name, message in (("neither", "holds neither teacher.json"), ("bad strategy", "unknown strategy 'D5'"),
                          ("own of a student", "--decode=own is a token teacher's own decoding; "),
                          ("bad seeds", "--seeds: '-2' is not a non-negative integer"),
                          ("bad seeds of variants", "--seeds names ['1'] more than once")):
        code, _, err = out[name]
        assert code == 2 and "Traceback" not in err and message in err.strip().splitlines()[-1], err[-2000:]
    assert not (tmp_path / "w").exists()


def test_unknown_or_repeated_strategies_are_refused_before_any_work(tmp_path, corpus, tiny_bert_dir):
    cfg = tiny_config(tmp_path / "w", corpus, tiny_bert_dir)
    with pytest.raises(ConfigError, match="unknown strategy 'D9'"):
        ablate.run_ablation(cfg, ["D0", "D9"])
    with pytest.raises(ConfigError, match=r"more than once"):
        ablate.run_ablation(cfg, ["D1", "D1"])
    assert not (tmp_path / "w").exists()


# ----------------------------------------------------------------------------- --seeds

@pytest.mark.parametrize("seeds, message", [
    (["1", "x"], "--seeds: 'x' is not a non-negative integer"),
    (["1", "-1"], "--seeds: '-1' is not a non-negative integer"),
    (["2", "1.5"], "--seeds: '1.5' is not a non-negative integer"),
    (["1", ""], "--seeds: '' is not a non-negative integer"),
    (["1", str(2**31)], f"--seeds: '{2**31}' is not a non-negative integer up to {2**31 - 1}"),
    ([], "--seeds is empty"),
    (["3", "1", "03"], r"--seeds names \['3'\] more than once"),
])
def test_bad_seeds_are_refused_before_any_work(tmp_path, corpus, tiny_bert_dir, seeds, message):
    cfg = tiny_config(tmp_path / "w", corpus, tiny_bert_dir)
    with pytest.raises(ConfigError, match=message) as error:
        ablate.run_ablation(cfg, ["D1"], seeds=seeds)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "w").exists()


def test_check_seeds_keeps_the_order_given():
    assert ablate.check_seeds(["3", " 1", "0"]) == [3, 1, 0]
    assert ablate.check_seeds([7]) == [7]


def fake_info(f1_by_lang, all_f1=None):
    f1s = list(f1_by_lang.values())
    return {"scores": {"test": {"languages": {lang: {"f1": f1} for lang, f1 in f1_by_lang.items()},
                                "f1_mean": float(np.mean(f1s)), "f1_std": float(np.std(f1s)),
                                "all": {"f1": all_f1 if all_f1 is not None else float(np.mean(f1s))}}}}


def test_seed_tables_give_mean_std_per_seed_values_and_the_ordering_seed_by_seed():
    teacher = fake_info({"de": 0.9, "en": 0.8})["scores"]
    # D1 beats D0-S in seed 1 and loses in seed 2; D4.2 ties D4.1 in seed 2 (>= holds); D3.1 was not run.
    results = {"D0-S": [fake_info({"de": 0.6, "en": 0.5}), fake_info({"de": 0.7, "en": 0.6})],
               "D1": [fake_info({"de": 0.7, "en": 0.6}), fake_info({"de": 0.6, "en": 0.5})],
               "D3.2": [fake_info({"de": 0.70, "en": 0.70}), fake_info({"de": 0.7, "en": 0.72})],
               "D4.1": [fake_info({"de": 0.75, "en": 0.7}), fake_info({"de": 0.8, "en": 0.7})],
               "D4.2": [fake_info({"de": 0.8, "en": 0.7}), fake_info({"de": 0.8, "en": 0.7})]}
    table3, = parse_tables("\n".join(ablate.table3(teacher, results)))
    assert table3[0] == ["model", "strategy", "de", "en", "mean", "all", "% of teacher"]
    assert table3[1][2:] == ["90.00", "80.00", "85.00", "85.00", "100.0%"]
    d1 = {row[0]: row for row in table3}["D1"]
    assert d1[2:6] == [f"65.00 ± {pct(np.std([0.7, 0.6], ddof=1))}", f"55.00 ± {pct(np.std([0.6, 0.5], ddof=1))}",
                       f"60.00 ± {pct(np.std([0.65, 0.55], ddof=1))}", f"60.00 ± {pct(np.std([0.65, 0.55], ddof=1))}"]
    assert d1[6] == f"{0.6 / 0.85:.1%}"
    per_seed, = parse_tables("\n".join(ablate.per_seed_table("test", [4, 9], results)))
    assert per_seed[0] == ["strategy", "seed 4", "seed 9", "mean ± std"]
    assert per_seed[2] == ["D1", "65.00", "55.00", f"60.00 ± {pct(np.std([0.65, 0.55], ddof=1))}"]
    order, = parse_tables("\n".join(ablate.ordering_table("test", [4, 9], results)))
    assert order[0] == ["ordering", "seed 4", "seed 9", "holds"]
    assert order[1:] == [["D4.2 ≥ D4.1", "yes: 75.00 vs 72.50", "yes: 75.00 vs 75.00", "2 of 2"],
                         ["D4.1 ≥ D3.2", "yes: 72.50 vs 70.00", "yes: 75.00 vs 71.00", "2 of 2"],
                         ["D1 > D0-S", "yes: 65.00 vs 55.00", "NO: 55.00 vs 65.00", "1 of 2"]]
    assert ablate.ordering_table("test", [1], {"D0": results["D1"], "D4.2": results["D4.2"]}) == \
        ["No pair of the ordering's strategies was run."]
    # One seed: today's table, with the spread across languages.
    single, = parse_tables("\n".join(ablate.table3(teacher, {"D1": results["D1"][:1]})))
    assert single[0] == ["model", "strategy", "de", "en", "mean", "std", "all", "% of teacher"]
    assert single[2][2:7] == ["70.00", "60.00", "65.00", "5.00", "65.00"]


@END_TO_END
def test_bin_ablate_seeds_trains_a_student_per_seed_from_one_teacher_and_reports_mean_std(ablation, corpus,
                                                                                         tiny_bert_dir, tmp_path):
    cfg, _, _ = ablation
    work = tmp_path / "work"   # a copy of the shared run's teacher and cache: its own report stays as it is
    shutil.copytree(cfg.work_dir, work)
    seeds_cfg = replace(cfg, work_dir=str(work))
    ablate.run_ablation(seeds_cfg, ["D1"], seeds=[1])   # seed 1 finished, as a killed run leaves it
    steps = UPSTREAM + ("ablate/seed-1/D1",)
    before = stamps(work, steps)
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "ablate"), *tiny_flags(work, corpus, tiny_bert_dir),
                           "--strategies=D1", "--seeds=1,2"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # One teacher and one cache for every seed; the finished seed-1 student was read, not retrained.
    assert stamps(work, steps) == before
    infos = {seed: info(seeds_cfg, f"ablate/seed-{seed}/D1") for seed in (1, 2)}
    fingerprints = {seed: json.load(open(work / "ablate" / f"seed-{seed}" / "D1" / "step.json"))["fingerprint"]
                    for seed in (1, 2)}
    assert [fingerprints[s]["student"]["seed"] for s in (1, 2)] == [1, 2]
    assert ({k: v for k, v in fingerprints[1].items() if k != "student"}
            == {k: v for k, v in fingerprints[2].items() if k != "student"})
    # The two students differ (their own initialisation and batch order).
    losses = {s: [st["best_val_loss"] for st in infos[s]["history"]["steps"]] for s in (1, 2)}
    assert losses[1] != losses[2]
    report = (work / "ablation.md").read_text(encoding="utf-8")
    tables = parse_tables(report)
    table3, per_seed = tables[0], tables[1]
    assert report[report.index("## Strategies"):report.index("\n\n## Seeds")] in proc.stdout
    f1 = {s: infos[s]["scores"]["test"]["f1_mean"] for s in (1, 2)}
    mean, std = np.mean(list(f1.values())), np.std(list(f1.values()), ddof=1)
    assert per_seed == [["strategy", "seed 1", "seed 2", "mean ± std"],
                        ["D1", pct(f1[1]), pct(f1[2]), f"{pct(mean)} ± {pct(std)}"]]
    assert table3[0] == ["model", "strategy", "de", "en", "mean", "all", "% of teacher"]
    assert [row[0] for row in table3[1:]] == ["teacher", "teacher (argmax)", "D1"]
    d1 = table3[3]
    assert d1[4] == f"{pct(mean)} ± {pct(std)}"
    for col, lang in ((2, "de"), (3, "en")):
        values = [infos[s]["scores"]["test"]["languages"][lang]["f1"] for s in (1, 2)]
        assert d1[col] == f"{pct(np.mean(values))} ± {pct(np.std(values, ddof=1))}"
    pooled = [infos[s]["scores"]["test"]["all"]["f1"] for s in (1, 2)]
    assert d1[5] == f"{pct(np.mean(pooled))} ± {pct(np.std(pooled, ddof=1))}"
    # Table 4 of each seed's student.
    assert report.index("seed 1:") < report.index("seed 2:")


@END_TO_END
def test_strategies_that_begin_alike_train_the_representation_stage_once(ablation, tmp_path, caplog):
    cfg, _, _ = ablation
    work = tmp_path / "work"   # a copy of the shared run's teacher and cache
    shutil.copytree(cfg.work_dir, work)
    shared_cfg = replace(cfg, work_dir=str(work))
    with caplog.at_level(logging.INFO, logger="xtremedistil_tf.methods.staged"):
        ablate.run_ablation(shared_cfg, ["D3.1", "D4.1"])
    continued = [r.getMessage() for r in caplog.records if "from an earlier student" in r.getMessage()]
    assert len(continued) == 1 and continued[0].startswith("[student] D4.1: stage 1 continues (representation)")
    steps = {name: info(shared_cfg, f"ablate/{name}")["history"]["steps"] for name in ("D3.1", "D4.1")}
    assert steps["D4.1"][0] == steps["D3.1"][0] and steps["D4.1"][0]["stage_name"] == "representation"
    assert [s["stage"] for s in steps["D4.1"]] == [1, 2, 3]
    # Nothing is left once every student that could use it is done.
    assert not (work / "checkpoints" / pipeline.SHARED_STAGES).exists()


# ----------------------------------------------------------------------------- --transfer_from_train_rest

def test_transfer_from_train_rest_is_the_rest_of_each_languages_train_file_without_labels(corpus):
    full = read_wikiann_dirs(str(corpus), LANGS, "train")
    cfg = DataConfig(format="wikiann", data_dir=str(corpus), langs=list(LANGS), max_train_sentences=20,
                     transfer_from_train_rest=25)
    splits = load_splits(cfg)
    for lang in LANGS:
        own = [s for s in full if s.lang == lang]
        assert [s for s in splits["train"] if s.lang == lang] == own[:20]
        unlabeled = [s for s in splits["transfer"] if s.lang == lang]
        assert [s.tokens for s in unlabeled] == [s.tokens for s in own[20:45]]
        assert all(s.tags is None for s in unlabeled)
    assert len(splits["transfer"]) == 2 * 25 and len(splits["dev"]) == 2 * SIZES["dev"]
    # A count beyond the rest takes all of it: every train sentence is labeled or unlabeled, never both.
    everything = load_splits(DataConfig(**{**cfg.__dict__, "transfer_from_train_rest": 10_000}))["transfer"]
    for lang in LANGS:
        assert [s.tokens for s in everything if s.lang == lang] == [s.tokens for s in full if s.lang == lang][20:]
    assert len(everything) == 2 * (SIZES["train"] - 20)
    # Off by default, and then not part of the data's fingerprint (older work dirs still match).
    assert "transfer_from_train_rest" not in DataConfig().to_dict()
    assert cfg.to_dict()["transfer_from_train_rest"] == 25


@pytest.mark.parametrize("kwargs, message", [
    ({"transfer_from_train_rest": 100}, r"^--transfer_from_train_rest=100 takes the train sentences past the labeled "
                                        r"ones, so it needs --max_train_sentences"),
    ({"transfer_from_train_rest": -1, "max_train_sentences": 5}, r"^--transfer_from_train_rest=-1; expected 0"),
])
def test_transfer_from_train_rest_needs_a_labeled_cap(corpus, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        check_data_config(DataConfig(format="wikiann", data_dir=str(corpus), langs=list(LANGS), **kwargs))


# ----------------------------------------------------------------------------- --transfer_sizes

def transfer_config(work_dir, corpus, teacher_dir):
    """The toy ablation with 20 labeled sentences per language and the next 30 as unlabeled text (60 in all)."""
    cfg = tiny_config(work_dir, corpus, teacher_dir)
    return replace(cfg, data=replace(cfg.data, max_train_sentences=20, transfer_from_train_rest=30))


def test_transfer_sizes_beyond_the_unlabeled_text_are_refused_before_the_teacher_trains(tmp_path, corpus,
                                                                                          tiny_bert_dir):
    cfg = transfer_config(tmp_path / "w", corpus, tiny_bert_dir)
    with pytest.raises(ConfigError, match=r"^--transfer_sizes: 60 unlabeled sentences; the data has 60 unlabeled "
                                          r"transfer sentences, so give 0 to 59"):
        ablate.run_ablation(cfg, ["D4.2"], transfer_sizes=["10", "60"])
    assert (tmp_path / "w" / "data").exists() and not (tmp_path / "w" / "teacher").exists()


@END_TO_END
def test_bin_ablate_transfer_sizes_distils_a_student_per_size_from_one_teacher(corpus, tiny_bert_dir, tmp_path):
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "ablate"), *tiny_flags(work, corpus, tiny_bert_dir),
                           "--max_train_sentences=20", "--transfer_from_train_rest=30", "--strategies=D0-S,D4.1",
                           "--transfer_sizes=10,0"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = transfer_config(work, corpus, tiny_bert_dir)
    # D4.1 reads the transfer set: a student per size; D0-S does not: one student serves every size.
    assert sorted(p.name for p in (work / "ablate").iterdir()) == ["D0-S", "D4.1", "transfer-0", "transfer-10"]
    assert [p.name for p in (work / "ablate" / "transfer-0").iterdir()] == ["D4.1"]
    students = {size: info(cfg, ablate.strategy_step("D4.1", None, size)) for size in (0, 10, None)}
    fingerprints = {size: json.load(open(work / ablate.strategy_step("D4.1", None, size) / "step.json"))["fingerprint"]
                    for size in (0, 10, None)}
    assert [fingerprints[size]["student"].get("transfer_sentences") for size in (0, 10, None)] == [0, 10, None]
    # The logit stage learns from 40 labeled + N unlabeled sentences' windows: its dev loss moves with N.
    logits_loss = {size: students[size]["history"]["steps"][1]["best_val_loss"] for size in students}
    assert len(set(logits_loss.values())) == 3
    log_text = (work / "run.log").read_text(encoding="utf-8")
    for size in (0, 10):
        assert f"transfer set: the 40 labeled sentences and {size} of the 60 unlabeled ones" in log_text
    report = (work / "ablation.md").read_text(encoding="utf-8")
    curve = parse_tables(report[report.index("## Transfer-set size"):])[0]
    d0s = pct(info(cfg, "ablate/D0-S")["scores"]["test"]["f1_mean"])
    teacher = info(cfg, "teacher")["scores"]["test"]["f1_mean"]
    assert curve[0] == ["unlabeled sentences", "D0-S", "D4.1"]
    assert [row[0] for row in curve[1:]] == ["0", "10", "60 (all)"]
    for row, size in zip(curve[1:], (0, 10, None)):
        f1 = students[size]["scores"]["test"]["f1_mean"]
        assert row[2] == f"{pct(f1)} ({f1 / teacher:.1%})"
        assert row[1].startswith(d0s + " (")
    assert (work / ablate.CURVE_PLOT).read_bytes()[:4] == b"\x89PNG"
