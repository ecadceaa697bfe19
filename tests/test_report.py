"""write_report from a synthetic metrics.json (+ latency JSON): the numbers and the PNGs."""
import json
import subprocess
import sys

import matplotlib.image
import pytest

from xtremedistil_tf.data.scoring import predates_decoded_teacher_scores
from xtremedistil_tf.export.predictor import as_text
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.report import write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _scores(f1s):
    """Scores in the data/scoring.py layout for {lang: f1}; precision/recall derived to be distinct."""
    languages = {lang: {"f1": f1, "precision": f1 - 0.01, "recall": f1 + 0.01, "sentences": 10}
                 for lang, f1 in f1s.items()}
    mean = sum(f1s.values()) / len(f1s)
    return {"all": {"f1": mean, "precision": mean - 0.01, "recall": mean + 0.01, "sentences": 10 * len(f1s)},
            "languages": languages, "f1_mean": mean, "f1_std": 0.0125}


def decoded(scores):
    """A teacher's scores as the teacher step records them: decoded as the students, marked so."""
    return {split: {"decode": "constrained", **s} for split, s in scores.items()}


def _latency_entry(name, parameters, compression, s1, s32):
    return {"name": name, "parameters": parameters, "size_bytes": 2**20 * 3, "compression": compression,
            "speedup_batch1": s1, "speedup_batch32": s32,
            "latency_ms": {"batch1": {"fused+xla": 1.5}, "batch32": {"fused+xla": 0.2}}}


@pytest.fixture
def work_dir(tmp_path):
    metrics = {
        "teacher": {"scores": decoded({"dev": _scores({"en": 0.91, "de": 0.87}),
                                       "test": _scores({"en": 0.9, "de": 0.86})}),
                    "parameters": 177_000_000},
        "student": {"scores": {"dev": _scores({"en": 0.85, "de": 0.81}), "test": {**_scores({"en": 0.8421, "de": 0.8}),
                                                           "spans": {"all": {"f1": 0.81, "precision": 0.8, "recall": 0.82}}}},
                    "parameters": 6_500_000},
        "students": {"100x400": {"scores": {"test": _scores({"en": 0.86, "de": 0.84})}}},
    }
    latency = {"queries": 1000, "seq_length": 32,
               "teacher": {"parameters": 177_000_000, "size_bytes": 2**20 * 700,
                           "latency_ms": {"batch1": {"xla": 60.0}, "batch32": {"xla": 25.0}}},
               "students": [_latency_entry("50x200", 6_500_000, 27.2, 41.0, 120.0),
                            _latency_entry("100x400", 13_000_000, 13.6, 20.0, 50.0),
                            _latency_entry("300x600", 40_000_000, 4.4, 5.0, 9.0)]}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    (tmp_path / "config.json").write_text(json.dumps({"student": {"embedding_dim": 50, "hidden": 200}}))
    (tmp_path / "latency.json").write_text(json.dumps(latency))
    return tmp_path


def _assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    # A real rendered figure, not an empty image: matplotlib draws axes, bars and text.
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels[..., :3].std() > 0.05


def test_report_tables_and_plots(work_dir):
    path = write_report(work_dir)
    text = path.read_text()
    assert path == work_dir / "report.md"
    # Scores: P/R/F1 of teacher and student on both splits, the span F1 where the scores have one, mean ± std
    # over languages.
    assert "| student | test | 0.8111 | 0.8311 | 0.8211 | 0.8100 | 0.8211 ± 0.0125 |" in text
    assert "| teacher | dev | 0.8800 | 0.9000 | 0.8900 | - |" in text
    # Per-language F1 and parameters with compression.
    assert "| en | 0.9100 | 0.9000 | 0.8500 | 0.8421 |" in text
    assert "| student | 6,500,000 | 27.2x |" in text
    # Latency table from latency.json.
    assert "| 50x200 | 6,500,000 | 3.0 | 1.500 (fused+xla) | 0.200 (fused+xla) | 27.2x | 41.0x | 120.0x |" in text
    assert "report_plots/figure1.png" in text and "report_plots/languages.png" in text
    _assert_png(work_dir / "report_plots" / "figure1.png")
    _assert_png(work_dir / "report_plots" / "languages.png")
    assert not list(work_dir.glob("*.tmp"))


def test_report_plots_the_work_dirs_f1_against_speedup(tmp_path):
    """bin/benchmark latency --work_dir measured the run's own student (one configuration): report.md
    plots its F1 against its speedup beside the teacher's, and lists the numbers."""
    scores = lambda f1: {"test": {"all": {"f1": f1, "precision": f1, "recall": f1, "sentences": 9}}}
    (tmp_path / "metrics.json").write_text(json.dumps({"teacher": {"scores": decoded(scores(0.9012)),
                                                                   "parameters": 177_000_000},
                                                       "student": {"scores": scores(0.8567), "parameters": 4_600_000}}))
    (tmp_path / "config.json").write_text(json.dumps({"student": {"embedding_dim": 50, "hidden": 200}}))
    latency = {"queries": 100, "seq_length": 32,
               "teacher": {"parameters": 177_000_000, "size_bytes": 2**20 * 700,
                           "latency_ms": {"batch1": {"xla": 60.0}, "batch32": {"xla": 25.0}}},
               "students": [_latency_entry("50x200", 4_600_000, 38.5, 31.25, 104.5)]}
    (tmp_path / "latency.json").write_text(json.dumps(latency))
    text = write_report(tmp_path).read_text()
    assert "## F1 vs compression and speedup (paper Figure 1)" in text
    assert "| teacher | 90.12 | 1.0x | 1.0x | 1.0x |" in text
    assert "| student 50x200 | 85.67 | 38.5x | 31.2x | 104.5x |" in text
    assert "report_plots/figure1.png" in text
    _assert_png(tmp_path / "report_plots" / "figure1.png")
    # Latency results of other configurations only: no F1 to plot, no figure.
    latency["students"] = [_latency_entry("100x400", 13_000_000, 13.6, 20.0, 50.0)]
    (tmp_path / "latency.json").write_text(json.dumps(latency))
    text = write_report(tmp_path).read_text()
    assert "figure1.png" not in text and not (tmp_path / "report_plots" / "figure1.png").exists()


def test_report_without_latency_or_languages(tmp_path):
    scores = {"test": {"all": {"f1": 0.5, "precision": 0.4, "recall": 0.6, "sentences": 3}}}
    (tmp_path / "metrics.json").write_text(json.dumps({"teacher": {"scores": decoded(scores), "parameters": 10}}))
    text = write_report(tmp_path).read_text()
    assert "| teacher | test | 0.4000 | 0.6000 | 0.5000 | - |  |" in text
    assert "png" not in text and "Latency" not in text
    assert not list((tmp_path / "report_plots").iterdir())


def test_report_gives_seen_and_unseen_names_side_by_side_and_reads_older_metrics(work_dir):
    """Issue 50: report.md's seen/unseen table, teacher beside student (test split); a model whose step predates
    the scores shows "-", and a metrics.json without any (the fixture's) has no such section, as bin/train's
    summary has no such rows."""
    assert "Seen and unseen names" not in write_report(work_dir).read_text()
    assert pipeline.seen_rows(json.loads((work_dir / "metrics.json").read_text())) == []
    metrics = json.loads((work_dir / "metrics.json").read_text())
    kind = {"precision": 0.75, "recall": 0.5, "f1": 0.6, "support": 1234, "predicted": 800}
    metrics["student"]["scores"]["test"]["seen_unseen"] = {"seen": kind, "unseen": {**kind, "recall": 0.25},
                                                           "train_entities": 99}
    (work_dir / "metrics.json").write_text(json.dumps(metrics))
    text = write_report(work_dir).read_text()
    assert "## Seen and unseen names (test split)" in text
    assert "| names | gold entities | teacher recall / precision | student recall / precision |" in text
    assert "| seen | 1,234 | - | 0.5000 / 0.7500 |" in text and "| unseen | 1,234 | - | 0.2500 / 0.7500 |" in text
    assert ("test unseen names R / P", "teacher -  student 0.2500 / 0.7500  (of 1,234 other gold entities)") in \
        pipeline.seen_rows(metrics)


def test_report_lists_the_teachers_argmax_scores_beside_its_decoded_ones(work_dir):
    metrics = json.loads((work_dir / "metrics.json").read_text())
    metrics["teacher"]["argmax_scores"] = {"test": _scores({"en": 0.8, "de": 0.76})}
    (work_dir / "metrics.json").write_text(json.dumps(metrics))
    text = write_report(work_dir).read_text()
    assert "| teacher | test | 0.8700 | 0.8900 | 0.8800 | - | 0.8800 ± 0.0125 |" in text
    assert "| teacher (argmax) | test | 0.7700 | 0.7900 | 0.7800 | - | 0.7800 ± 0.0125 |" in text
    assert "| teacher | 88.00 | 1.0x | 1.0x | 1.0x |" in text  # figure 1: the teacher decoded as the students
    assert "only argmax scores" not in text


def test_report_of_an_older_metrics_json_shows_its_teacher_as_argmax(work_dir, tmp_path):
    """metrics.json of a run before the teacher step recorded decoded scores: its teacher's scores are
    argmax, shown as `teacher (argmax)` only, with a hint (bin/report --summary too); a CRF teacher's
    are its Viterbi, shown as they are."""
    metrics = json.loads((work_dir / "metrics.json").read_text())
    for s in metrics["teacher"]["scores"].values():
        del s["decode"]
    metrics["teacher"].update(train_seconds=1.0, best_epoch=1)
    metrics["student"].update(train_seconds=2.0)
    (work_dir / "metrics.json").write_text(json.dumps(metrics))
    text = write_report(work_dir).read_text()
    assert "| teacher (argmax) | test | 0.8700 | 0.8900 | 0.8800 | - | 0.8800 ± 0.0125 |" in text
    assert "| teacher | dev |" not in text and "| teacher | test |" not in text  # not in the scores,
    assert "| teacher test |" not in text and "| teacher | 88.00 |" not in text  # per language, nor at 1x in figure 1
    assert "The teacher has only argmax scores here" in text and "rerun the same bin/train command" in text
    out = subprocess.run([sys.executable, "bin/report", f"--work_dir={work_dir}", "--summary"],
                         capture_output=True, text=True, check=True).stdout
    assert "teacher (argmax) test F1 / P / R" in out and "teacher test F1" not in out
    assert "The teacher has only argmax scores here" in out
    (work_dir / "config.json").write_text(json.dumps({"teacher": {"head": "crf"}, "student": {}}))
    text = write_report(work_dir).read_text()
    assert "| teacher | test | 0.8700 | 0.8900 | 0.8800 | - | 0.8800 ± 0.0125 |" in text
    assert "argmax" not in text


def test_bin_report(work_dir, tmp_path):
    latency = tmp_path / "elsewhere.json"
    latency.write_text((work_dir / "latency.json").read_text())
    (work_dir / "latency.json").unlink()
    out = subprocess.run([sys.executable, "bin/report", f"--work_dir={work_dir}", f"--latency_json={latency}"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(work_dir / "report.md")
    assert "27.2x" in (work_dir / "report.md").read_text()


def test_report_types_and_training_curves(tmp_path):
    def scores(per, f1):
        return {"test": {"all": {"f1": f1, "precision": f1, "recall": f1, "sentences": 5, "types": per}}}

    teacher = {"PER": {"precision": 0.9, "recall": 0.8, "f1": 0.847, "support": 12},
               "LOC": {"precision": 0.7, "recall": 0.6, "f1": 0.646, "support": 7}}
    student = {"PER": {"precision": 0.8, "recall": 0.8, "f1": 0.8, "support": 12}}
    (tmp_path / "metrics.json").write_text(json.dumps({
        "teacher": {"scores": decoded(scores(teacher, 0.75)), "parameters": 100},
        "student": {"scores": scores(student, 0.7), "parameters": 10}}))
    for name, history in (("teacher", [{"epoch": 1, "train_loss": 0.5, "dev_f1": 0.6},
                                       {"epoch": 2, "train_loss": 0.3, "dev_f1": 0.7}]),
                          ("student", {"strategy": "D4.2", "steps": [
                              {"stage": 2, "stage_name": "logits", "unfrozen": ["logits"], "trainable": ["logits"],
                               "initial_val_loss": 2.0, "val_losses": [1.5, 1.2], "best_epoch": 2, "best_val_loss": 1.2,
                               "dev_f1": None},
                              {"stage": 3, "stage_name": "labels", "unfrozen": ["softmax"], "trainable": ["softmax"],
                               "initial_val_loss": 0.9, "val_losses": [0.5, 0.6], "best_epoch": 1, "best_val_loss": 0.5,
                               "dev_f1": 0.7}]})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "step.json").write_text(json.dumps({"info": {"history": history}}))
    text = write_report(tmp_path).read_text()
    assert "## Scores by entity type (test split; precision / recall / F1, %)" in text
    assert "| LOC | 70.0 / 60.0 / 64.6 | - | 7 |" in text
    assert "| PER | 90.0 / 80.0 / 84.7 | 80.0 / 80.0 / 80.0 | 12 |" in text
    _assert_png(tmp_path / "report_plots" / "types.png")
    _assert_png(tmp_path / "report_plots" / "curves.png")
    assert "report_plots/curves.png" in text


def test_bin_report_summary_says_how_to_serve(tmp_path):
    scores = {"test": {"all": {"f1": 0.5, "precision": 0.4, "recall": 0.6, "sentences": 3}}}
    (tmp_path / "metrics.json").write_text(json.dumps({"teacher": {
        "scores": decoded(scores), "parameters": 10, "train_seconds": 12.0, "best_epoch": 2}}))
    (tmp_path / "export" / "ner" / "1").mkdir(parents=True)
    out = subprocess.run([sys.executable, "bin/report", f"--work_dir={tmp_path}", "--summary"],
                         capture_output=True, text=True, check=True).stdout
    assert "teacher fine-tuning" in out and "12 s, best epoch 2" in out
    assert f"report                     {tmp_path / 'report.md'}" in out
    assert f'-v "$PWD/{tmp_path / "export" / "ner"}:/models/ner" -e MODEL_NAME=ner tensorflow/serving' in out


def test_predict_text_format():
    record = {"text": "John lives in Paris", "entities": [
        {"start": 0, "end": 4, "type": "PER", "text": "John", "confidence": 0.981},
        {"start": 14, "end": 19, "type": "LOC", "text": "Paris", "confidence": 0.5}]}
    assert as_text(record).splitlines() == ["John lives in Paris", "  PER          John  (0.98)",
                                            "  LOC          Paris  (0.50)"]
    assert as_text({"text": "", "entities": []}) == "\n  (no entities)"


@pytest.mark.parametrize("scores, older", [
    ({"dev": {"all": {"f1": 0.5}}, "test": {"all": {"f1": 0.4}}}, True),       # a token teacher's own decoding
    ({"dev": {"decode": "constrained", "all": {"f1": 0.5}}}, False),           # decoded as the students
    ({"dev": {"all": {"accuracy": 0.9, "f1": 0.8}}}, False),                    # a text classifier's
    ({}, False),                                                               # nothing scored
])
def test_which_teacher_scores_predate_the_decoded_ones(scores, older):
    """The one test, shared by the pipeline's upgrade of an old teacher step and the report of an old metrics.json."""
    assert predates_decoded_teacher_scores(scores) is older
