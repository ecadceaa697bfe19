"""bin/benchmark teacher: the plain reference loop (benchmarks/reference_teacher.py) and the
pipeline's teacher on the same data and budget."""
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, toy_ner_sentences, write_tiny_vocab
from test_console import NOISE
from test_pipeline import write_conll
from transformers import BertConfig, TFBertModel

from xtremedistil_tf.benchmarks.reference_teacher import IGNORE, encode, to_iob2


def test_reference_scores_any_scheme_as_iob2():
    assert to_iob2(["S-PER", "B-LOC", "M-LOC", "E-LOC", "O"]) == ["B-PER", "B-LOC", "I-LOC", "I-LOC", "O"]
    assert to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == ["B-PER", "I-PER", "B-PER", "O", "B-LOC"]
    assert to_iob2(["B-PER", "I-ORG"]) == ["B-PER", "B-ORG"]


def test_reference_labels_first_pieces_only(tiny_tokenizer):
    sentence = {"tokens": ["Johnny", "in", "Berlin"], "tags": ["B-PER", "O", "B-LOC"]}
    rows, firsts = encode([sentence], tiny_tokenizer, {"O": 0, "B-PER": 1, "B-LOC": 2}, max_length=32)
    ids, mask, labels = rows[0]
    pieces = tiny_tokenizer.convert_ids_to_tokens(ids)
    assert pieces == ["[CLS]", "john", "##n", "##y", "in", "berlin", "[SEP]"]
    assert firsts == [[1, 4, 5]]
    assert labels[firsts[0][0]] == 1 and labels[firsts[0][1]] == 0 and labels[firsts[0][2]] == 2
    assert sum(label != IGNORE for label in labels) == 3  # [CLS], continuations and [SEP] are ignored
    # Truncation: the words that no longer fit have no first piece.
    _, cut = encode([sentence], tiny_tokenizer, {"O": 0, "B-PER": 1, "B-LOC": 2}, max_length=6)
    assert cut == [[1, 4, -1]]


@pytest.fixture(scope="module")
def pretrained_tiny_bert(tmp_path_factory):
    """A tiny BERT with weights (random, saved with save_pretrained): what the reference loop loads."""
    directory = write_tiny_vocab(tmp_path_factory.mktemp("tiny_bert_weights"))
    vocab_size = len((directory / "vocab.txt").read_text(encoding="utf-8").split())
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    model = TFBertModel(config)
    model.build_in_name_scope()
    model.save_pretrained(str(directory), safe_serialization=True)
    return directory


# bin/benchmark teacher end to end in a subprocess: in the slow tier, and CI runs it (Makefile CI_SLOW_TESTS).
@pytest.mark.slow
def test_benchmark_trains_both_on_the_same_data(tmp_path, pretrained_tiny_bert):
    write_conll(tmp_path / "train.txt", toy_ner_sentences(240, seed=1))
    write_conll(tmp_path / "dev.txt", toy_ner_sentences(40, seed=2))
    write_conll(tmp_path / "test.txt", toy_ner_sentences(40, seed=3))
    work = tmp_path / "work"
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, str(REPO / "bin" / "benchmark"), "teacher", "--data_format=conll", f"--data_dir={tmp_path}",
         "--train_file=train.txt", "--dev_file=dev.txt", "--test_file=test.txt", f"--teacher={pretrained_tiny_bert}",
         "--teacher_layer=1", "--max_seq_length=16", "--teacher_epochs=4", "--teacher_learning_rate=3e-3",
         "--teacher_batch_size=16", "--patience=4", f"--work_dir={work}", "--no_progress"],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("pipeline ") for line in lines) and any(line.startswith("reference ") for line in lines)
    # The console of every command: no absl-formatted INFO lines (`I1125 07:25:26.949 ... run/workdir.py:185]`),
    # no transformers load notices, from the pipeline's teacher or from the reference loop.
    console = result.stdout + result.stderr
    assert not re.search(r"^[IW]\d{4} \d\d:\d\d:\d\d", console, re.M), console[-2000:]
    assert not any(noise in console for noise in NOISE), console[-2000:]
    assert "step teacher: running" in console
    rows = json.loads((work / "benchmark_teacher.json").read_text())
    # Both learn the toy task (names are PER, cities LOC) from the same snapshot of the data.
    assert rows["pipeline"]["test_f1"] > 0.8 and rows["reference"]["test_f1"] > 0.8
    assert [h["epoch"] for h in rows["reference"]["history"]] == [1, 2, 3, 4]
    assert rows["pipeline"]["recipe"]["supervision"] == "first_piece"
    metrics = json.loads((work / "metrics.json").read_text())
    # Compared as the reference loop scores: argmax at each word's first piece.
    assert rows["pipeline"]["test_f1"] == metrics["teacher"]["argmax_scores"]["test"]["all"]["f1"]
    assert rows["pipeline"]["dev_f1"] == metrics["teacher"]["argmax_scores"]["dev"]["all"]["f1"]
    assert not (work / "student").exists() and not (work / "transfer").exists()


def test_benchmark_refuses_a_random_teacher(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "bin" / "benchmark"), "teacher", "--teacher=random",
                             f"--work_dir={tmp_path}"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 2
    assert "bin/benchmark teacher: the teacher benchmark compares fine-tuning of a pretrained model" in result.stderr
