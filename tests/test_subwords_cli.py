"""bin/distil_lm end to end on tiny data, and the NER pipeline fine-tuning its student (slow: two
TensorFlow processes and a compiled training step)."""
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf
from conftest import REPO
from subwords_helpers import corpus
from transformers import BertConfig, TFBertModel

from xtremedistil_tf.methods.subwords.vocab import learn_vocab, save_vocab


def _write_wikiann(root, sentences_by_split):
    for split, sentences in sentences_by_split.items():
        path = root / "en" / split
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for words in sentences:
            lines += [f"en:{w}\t{'B-PER' if i == 0 else 'O'}" for i, w in enumerate(words)] + [""]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _tiny_teacher(directory, text):
    save_vocab(learn_vocab(text, 200), directory)
    model = TFBertModel(BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64))
    model(input_ids=tf.constant([[2, 5, 3]]))
    model.save_pretrained(str(directory))


def _run(args, cwd):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable] + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_distil_lm_writes_a_student_the_ner_pipeline_fine_tunes(tmp_path):
    text = corpus(200, seed=4)
    _write_wikiann(tmp_path / "wikiann", {"train": text[:160], "dev": text[160:180], "test": text[180:]})
    _tiny_teacher(tmp_path / "teacher", text)
    work = tmp_path / "lm"
    args = [str(REPO / "bin" / "distil_lm"), f"--teacher={tmp_path / 'teacher'}",
            f"--data_dir={tmp_path / 'wikiann'}", "--langs=en", "--vocab_size=60", "--hidden=16", "--heads=2",
            "--layers=2", "--steps=4", "--eval_sentences=20", "--max_seq_length=32",
            "--variant=DualTrain+SharedProjDown", f"--work_dir={work}", "--no_progress"]
    done = _run(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((work / "results.json").read_text())
    assert results["teacher_mlm_head_pretrained"] is False          # a bare TFBertModel: fresh MLM head
    assert results["vocab"]["student_size"] == 60 and results["vocab"]["student_unk_rate"] == 0.0
    assert results["eval"]["masked_words"] > 0 and len(results["history"]) == 1
    assert results["projection_pairs"] == 2 * 16 + 4
    table = (work / "model_sizes.md").read_text()
    assert "| student | 60 | 16 |" in table and "| teacher | 200 | 32 |" in table
    assert len((work / "student" / "vocab.txt").read_text().split()) == 60
    again = _run(args, tmp_path)                                     # same flags: nothing is redone
    assert again.returncode == 0 and "done already" in again.stdout

    ner = _run([str(REPO / "bin" / "train"), f"--teacher={work / 'student'}", "--student=false",
                "--data_format=wikiann", f"--data_dir={tmp_path / 'wikiann'}", "--langs=en", "--teacher_epochs=1",
                "--max_seq_length=32", "--teacher_layer=2", f"--work_dir={tmp_path / 'ner'}", "--no_progress"],
               tmp_path)
    assert ner.returncode == 0, ner.stderr[-3000:]
    metrics = json.loads((tmp_path / "ner" / "metrics.json").read_text())
    assert 0.0 <= metrics["teacher"]["scores"]["test"]["all"]["f1"] <= 1.0
    # The tagger read the student's own vocabulary (60 pieces), not the teacher's.
    encoder_vocab = (tmp_path / "ner" / "teacher" / "model" / "encoder" / "vocab.txt").read_text().split()
    assert len(encoder_vocab) == 60


@pytest.mark.slow
def test_bad_flags_are_one_line_errors(tmp_path):
    done = _run([str(REPO / "bin" / "distil_lm"), f"--work_dir={tmp_path}", "--data_dir=x", "--hidden=50",
                 "--heads=4"], tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == \
        "error: --hidden=50 is not a multiple of --heads=4"
