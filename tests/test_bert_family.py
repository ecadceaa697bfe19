"""BERT-family means BERT-family: RoBERTa (byte-level BPE, <s>=0 <pad>=1 </s>=2, positions after the
padding id), DistilBERT (no token types, transformer/layer_._N), ELECTRA (embedding size apart from
the hidden size) through data -> teacher -> transfer -> student, and bin/export's refusal of a
SavedModel of a byte-level BPE student, whose pieces no in-graph tokenizer makes (teachers/families.py)."""
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, TOY_LABELS, toy_ner_sentences, write_tiny_vocab
from test_pipeline import write_conll
from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
from transformers import (
    AutoTokenizer,
    DistilBertConfig,
    ElectraConfig,
    RobertaConfig,
    RobertaTokenizerFast,
    TFAutoModel,
    XLMRobertaTokenizerFast,
)

from xtremedistil_tf.cli.evaluate import evaluate_model
from xtremedistil_tf.data.alignment import TagVocab, encode
from xtremedistil_tf.data.loading import DataConfig
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export.predictor import load_serving_fn, predict
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.student_run import build_student
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.students import StudentArch
from xtremedistil_tf.students.artifact import read_config
from xtremedistil_tf.teachers.crf_head import set_embedding_dropout
from xtremedistil_tf.teachers.families import (
    BYTE_LEVEL_BPE,
    UNIGRAM,
    WORDPIECE,
    needs_prefix_space,
    tokenizer_family,
    usable_positions,
)
from xtremedistil_tf.teachers.finetune import FinetuneConfig, layer_depth, parameter_groups
from xtremedistil_tf.teachers.model import TokenTeacher, build_teacher, check_teacher_dir, load_tokenizer
from xtremedistil_tf.transfer.cache import read_arrays, read_sharded

MAX_LEN = 16


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
    """A tiny RoBERTa dir: a byte-level BPE tokenizer trained here on the toy words (mixed case), and
    a config whose 18 positions hold 16 pieces (no weights: the pipeline initialises it randomly)."""
    directory = tmp_path_factory.mktemp("roberta")
    texts = [" ".join(s.tokens) for s in toy_ner_sentences(60, seed=1)] + ["John lives in Paris, Mary in Berlin."]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=300, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                     unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    tokenizer.save_pretrained(str(directory))
    RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=MAX_LEN + 2, type_vocab_size=1,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def distilbert_dir(tmp_path_factory):
    directory = write_tiny_vocab(tmp_path_factory.mktemp("distilbert"))
    vocab_size = len((directory / "vocab.txt").read_text(encoding="utf-8").split())
    DistilBertConfig(vocab_size=vocab_size, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                     max_position_embeddings=MAX_LEN).save_pretrained(str(directory))
    return directory


def encoder_of(config):
    encoder = TFAutoModel.from_config(config)
    encoder.build_in_name_scope()
    return encoder


# ----------------------------------------------------------------------------- tokenizers and alignment

def test_byte_level_tokenizer_takes_words_and_labels_their_first_piece(roberta_dir):
    tokenizer = load_tokenizer(str(roberta_dir))
    assert tokenizer_family(tokenizer) == BYTE_LEVEL_BPE and tokenizer.add_prefix_space
    assert (tokenizer.cls_token_id, tokenizer.pad_token_id, tokenizer.sep_token_id) == (0, 1, 2)
    vocab = TagVocab(TOY_LABELS)
    sentence = Sentence(["john", "was", "in", "parisberlin"], ["B-PER", "O", "O", "B-LOC"])
    windows = encode([sentence], tokenizer, vocab, MAX_LEN)
    # Each word is a word of running text, with its space: the first word too, so "john" first is
    # the same piece as "john" mid-sentence, and the unseen word splits into a Ġ piece and more.
    running_text = AutoTokenizer.from_pretrained(str(roberta_dir))  # as saved: add_prefix_space=False
    assert running_text.add_prefix_space is False
    pieces = [running_text(" " + w, add_special_tokens=False)["input_ids"] for w in sentence.tokens]
    assert tokenizer.convert_ids_to_tokens(pieces[0]) == ["Ġjohn"]
    assert len(pieces[3]) > 1 and tokenizer.convert_ids_to_tokens(pieces[3])[0].startswith("Ġ")
    assert not any(t.startswith("Ġ") for t in tokenizer.convert_ids_to_tokens(pieces[3])[1:])
    flat = [p for word in pieces for p in word]
    n = len(flat) + 2
    assert windows.input_ids[0, :n].tolist() == [0] + flat + [2]
    assert np.all(windows.input_ids[0, n:] == 1) and windows.attention_mask[0].sum() == n
    expected = [vocab.id("[CLS]")]
    for word, tag in zip(pieces, sentence.tags):
        expected += [vocab.id(tag)] + [vocab.x_id] * (len(word) - 1)
    assert windows.label_ids[0, :n].tolist() == expected + [vocab.id("[SEP]")]
    assert windows.word_index[0, :n].tolist() == [-1, 0, 1, 2, 3] + [-1] * (len(pieces[3]) - 1) + [-1]


def test_sentencepiece_tokenizer_starts_each_word_with_its_marker(tmp_path):
    """XLM-R's Unigram model marks a word start with ▁ and needs no prefix space."""
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator([" ".join(s.tokens) for s in toy_ner_sentences(60, seed=1)], vocab_size=60,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], unk_token="<unk>")
    XLMRobertaTokenizerFast(tokenizer_object=unigram._tokenizer, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>", pad_token="<pad>", mask_token="<mask>").save_pretrained(str(tmp_path))
    tokenizer = load_tokenizer(str(tmp_path))
    assert tokenizer_family(tokenizer) == UNIGRAM
    vocab = TagVocab(TOY_LABELS)
    sentence = Sentence(["john", "was", "in", "parisberlin"], ["B-PER", "O", "O", "B-LOC"])
    windows = encode([sentence], tokenizer, vocab, 64)
    n = int(windows.attention_mask[0].sum())
    pieces = tokenizer.convert_ids_to_tokens(windows.input_ids[0, :n].tolist())
    assert (pieces[0], pieces[-1]) == ("<s>", "</s>") and windows.input_ids[0, n] == tokenizer.pad_token_id
    firsts = [t for t, word in zip(pieces, windows.word_index[0, :n]) if word >= 0]
    assert len(firsts) == 4 and all(t.startswith("▁") for t in firsts)
    starts = [t.startswith("▁") for t in pieces[1:-1]]
    assert [vocab.tags[i] for i in windows.label_ids[0, 1:n - 1]] == \
        [tag for tag in _spread(sentence.tags, starts)]


def _spread(tags, starts):
    """Each word's tag on its first piece and X on the rest."""
    word = -1
    for start in starts:
        word += start
        yield tags[word] if start else "X"


def test_wordpiece_tokenizers_are_left_as_they_are(distilbert_dir):
    tokenizer = load_tokenizer(str(distilbert_dir))
    assert tokenizer_family(tokenizer) == WORDPIECE and not needs_prefix_space(tokenizer)


# ----------------------------------------------------------------------------- configs

def test_position_budget_follows_the_model_type(roberta_dir, distilbert_dir):
    assert usable_positions(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    check_teacher_dir(str(roberta_dir), need_weights=False, layer=2, max_seq_length=MAX_LEN)
    with pytest.raises(ConfigError, match=f"max_seq_length={MAX_LEN + 1} .*roberta uses {MAX_LEN}"):
        check_teacher_dir(str(roberta_dir), need_weights=False, layer=2, max_seq_length=MAX_LEN + 1)
    # DistilBERT names its depth n_layers: the layer is still checked.
    with pytest.raises(ConfigError, match="teacher_layer=3 is out of range: the teacher has 2 layers"):
        check_teacher_dir(str(distilbert_dir), need_weights=False, layer=3, max_seq_length=MAX_LEN)


def test_distilbert_teacher_trains_without_token_types(distilbert_dir):
    """A DistilBERT teacher (no token_type_ids, n_layers/dim config names): hidden states of every
    layer, a loss, and one optimizer per depth (embeddings, layer 0, layer 1) plus the head."""
    teacher, tokenizer = build_teacher(str(distilbert_dir), TOY_LABELS, MAX_LEN, random_init=True)
    assert (teacher.num_layers, teacher.hidden_size) == (2, 32)
    windows = encode(toy_ner_sentences(4, seed=5), tokenizer, teacher.tag_vocab, MAX_LEN)
    batch = {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask,
             "label_ids": windows.label_ids}
    logits, hidden = teacher.call_with_hidden(batch, 2)
    assert logits.shape == (4, MAX_LEN, len(teacher.tag_vocab)) and hidden.shape == (4, MAX_LEN, 32)
    assert np.isfinite(float(teacher.loss(batch)))
    groups = parameter_groups(teacher, FinetuneConfig(layer_decay=0.5), total_steps=10)
    assert len(groups) == 4 and groups[-1][1] == teacher.head_variables


@pytest.mark.parametrize("family", ["distilbert", "roberta", "electra"])
def test_every_encoder_variable_lands_at_its_depth(family):
    """Layer-wise decay: layer_._i at depth L-1-i, the embeddings (ELECTRA's projection included)
    at L; the CRF teacher's embedding dropout finds each family's embedding dropout."""
    config = {"distilbert": DistilBertConfig(vocab_size=40, dim=32, n_layers=3, n_heads=2, hidden_dim=64),
              "roberta": RobertaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                       intermediate_size=64, type_vocab_size=1),
              "electra": ElectraConfig(vocab_size=40, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                       num_attention_heads=2, intermediate_size=64)}[family]
    encoder = encoder_of(config)
    depths = {}
    for variable in encoder.trainable_variables:
        name = variable.name
        if "pooler" in name:
            continue
        if "/embeddings" in name:
            expected = 3
        else:
            layer = int(name.split("layer_._")[1].split("/")[0])
            expected = 2 - layer
        assert layer_depth(name, 3) == expected, name
        depths.setdefault(expected, 0)
        depths[expected] += 1
    assert sorted(depths) == [0, 1, 2, 3]
    set_embedding_dropout(encoder, 0.5)
    assert encoder.get_input_embeddings().dropout.rate == 0.5


def test_electra_student_reduces_the_embedding_width_not_the_hidden():
    teacher = TokenTeacher(encoder_of(ElectraConfig(vocab_size=40, embedding_size=16, hidden_size=32,
                                                    num_hidden_layers=2, num_attention_heads=2,
                                                    intermediate_size=64)), TagVocab(TOY_LABELS), MAX_LEN)
    teacher.build_for_length()
    assert teacher.word_embeddings().shape == (40, 16) and teacher.hidden_size == 32
    student = build_student(DistilConfig(arch=StudentArch(embedding_dim=8, hidden=8)), teacher, "IOB2")
    assert student.get_layer("word_embedding").get_weights()[0].shape == (40, 8)
    with pytest.raises(ConfigError, match=r"embedding_dim=20 must be in \[1, 16\]"):
        build_student(DistilConfig(arch=StudentArch(embedding_dim=20, hidden=8)), teacher, "IOB2")


# ----------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def roberta_run(tmp_path_factory, roberta_dir):
    corpus = tmp_path_factory.mktemp("corpus")
    write_conll(corpus / "train.txt", toy_ner_sentences(40, seed=3))
    write_conll(corpus / "test.txt", toy_ner_sentences(12, seed=4))
    (corpus / "unlabeled.txt").write_text("john was in paris\nmary at berlin .\n", encoding="utf-8")
    work = tmp_path_factory.mktemp("work")
    cfg = pipeline.RunConfig(
        work_dir=str(work),
        data=DataConfig(format="conll", data_dir=str(corpus), train_file="train.txt", test_file="test.txt",
                        transfer_file="unlabeled.txt", dev_fraction=0.2),
        teacher=pipeline.TeacherConfig(name=str(roberta_dir), random_init=True, max_seq_length=MAX_LEN, dropout=0.0,
                                       layer=1, finetune=FinetuneConfig(epochs=2, batch_size=16, learning_rate=3e-3,
                                                                        progress=False)),
        student=DistilConfig(arch=StudentArch(embedding_dim=16, hidden=16), epochs_per_layer=2, patience=2,
                             batch_size=16, learning_rate=2e-2, strategy="D2", run_eagerly=True),  # tiny: eager is cheaper
        transfer=pipeline.TransferConfig(shard_size=64, batch_size=32), progress=False)
    return work, pipeline.run(cfg)


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_roberta_teacher_runs_end_to_end(roberta_run):
    work, metrics = roberta_run
    assert metrics["teacher"]["scores"]["test"]["all"]["sentences"] == 12
    # Stored at its real length (cache format v2), read back padded with the tokenizer's own pad id.
    stored = next(read_sharded(work / "transfer").as_numpy_iterator())
    assert stored["hidden"].shape == (stored["attention_mask"].sum(), 32)
    cached = {k: v[0] for k, v in read_arrays(work / "transfer", length=MAX_LEN).items()}
    assert cached["input_ids"][0] == 0 and cached["hidden"].shape == (MAX_LEN, 32)
    assert (cached["attention_mask"] == 0).any()
    assert np.all(cached["input_ids"][cached["attention_mask"] == 0] == 1)  # RoBERTa's <pad>
    # The student dir keeps the BPE tokenizer's own files, and no vocab.txt it does not have.
    assert not (work / "student" / "vocab.txt").exists()
    assert {"vocab.json", "merges.txt", "tokenizer.json"} <= set(os.listdir(work / "student" / "tokenizer"))
    meta = read_config(work / "student")
    assert meta.tokenizer_family == BYTE_LEVEL_BPE and not meta.lower_case
    assert load_tokenizer(str(work / "student" / "tokenizer")).add_prefix_space


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_roberta_student_evaluates_and_predicts_one_tag_per_word(roberta_run):
    work, metrics = roberta_run
    # bin/evaluate reloads the saved student and its BPE tokenizer: the pipeline's own test scores.
    scores = evaluate_model(work / "student", toy_ner_sentences(12, seed=4), "IOB2")
    assert scores["kind"] == "student" and scores["all"] == metrics["student"]["scores"]["test"]["all"]
    texts = ["john was in paris", "", "Mary, at Berlin."]
    tagger = load_serving_fn(work / "student")  # a TextTagger: the BPE student runs in Python
    words, labels, _ = tagger.tag_words(texts)
    assert [[w for w, _ in ws] for ws in words] == [["john", "was", "in", "paris"], [], ["Mary", ",", "at", "Berlin", "."]]
    assert [len(tags) for tags in labels] == [4, 0, 5] and all(t in TOY_LABELS for tags in labels for t in tags)
    records = predict(tagger, texts)
    assert [r["text"] for r in records] == texts and records[1]["entities"] == []
    for record in records:
        for entity in record["entities"]:
            assert record["text"][entity["start"]:entity["end"]] == entity["text"]
            assert entity["type"] in ("PER", "LOC") and 0 < entity["confidence"] <= 1


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_bin_export_refuses_a_byte_level_bpe_student(roberta_run, tmp_path):
    work, _ = roberta_run
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, str(REPO / "bin" / "export"), f"--student_dir={work / 'student'}",
                             f"--export_dir={tmp_path / 'export'}"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 2
    line = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line == [f"error: {work / 'student'} reads the pieces of a byte-level BPE tokenizer (RoBERTa), and no "
                    "in-graph tokenizer of a tf-keras SavedModel makes them (tensorflow-text has no byte-level BPE; "
                    "KerasHub's BytePairTokenizer is a Keras 3 layer): to tag text in Python, run bin/predict "
                    f"--model={work / 'student'}, or export it with --format=onnx or --format=tflite, whose predict.py "
                    "tokenizes with the tokenizers library (docs/serving.md)"]
    assert not (tmp_path / "export").exists()
