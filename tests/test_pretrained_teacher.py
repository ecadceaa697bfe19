"""A fine-tuned checkpoint as the teacher, used as it is (teachers/pretrained.py, teachers/labelmap.py)."""
import logging

import numpy as np
import pytest
import tensorflow as tf
from conftest import toy_ner_sentences, write_tiny_vocab
from transformers import AutoTokenizer, BertConfig, TFBertForSequenceClassification, TFBertForTokenClassification

from xtremedistil_tf.cli.evaluate import evaluate_model
from xtremedistil_tf.data.alignment import encode
from xtremedistil_tf.data.classification import encode_texts, predict_by_length_texts
from xtremedistil_tf.data.loading import DataConfig
from xtremedistil_tf.data.schemes import convert_tags, label_set
from xtremedistil_tf.data.scoring import score_by_language
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.student_run import distil, staged_sources
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.students import StudentArch
from xtremedistil_tf.teachers.finetune import FinetuneConfig, predict_piece_tags
from xtremedistil_tf.teachers.labelmap import class_label_map, detect_scheme, token_label_map
from xtremedistil_tf.teachers.pretrained import build_pretrained_teacher
from xtremedistil_tf.teachers.saved import load_teacher
from xtremedistil_tf.transfer.cache import read_sharded

IOB2_PER_LOC = label_set(["PER", "LOC"], "IOB2")   # O B-PER I-PER B-LOC I-LOC
CONLL_CHECKPOINT = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


# ----------------------------------------------------------------------------- label mapping

def word_tags(label_map, checkpoint_columns):
    """One sentence's word tags in the data scheme from the checkpoint's argmax column per word (the word
    decoding `PretrainedTokenTeacher.decode_words` makes of its windows)."""
    return label_map.to_data_scheme([label_map.word_labels[c] for c in checkpoint_columns])


def test_scheme_is_read_from_the_prefixes():
    assert detect_scheme(["O", "B-PER", "I-PER"]) == "IOB2"
    assert detect_scheme(["O", "B-PER", "I-PER", "E-PER", "S-PER"]) == "BIOES"
    assert detect_scheme(["O", "B-PER", "M-PER", "E-PER", "S-PER"]) == "BMES"
    assert detect_scheme(["O", "PERSON", "LOCATION"]) == "IO"


def test_iob2_checkpoint_onto_bioes_data():
    data = label_set(["PER", "LOC"], "BIOES")  # O B-PER I-PER E-PER S-PER B-LOC I-LOC E-LOC S-LOC
    m = token_label_map(CONLL_CHECKPOINT, data, "BIOES")
    # S- reads the checkpoint's B-, E- its I-; O also reads the dropped MISC columns.
    assert m.sources == [[0, 5, 6], [1], [2], [2], [1], [3], [4], [4], [3]]
    assert m.dropped == ["MISC"]
    # B-PER I-PER O B-LOC B-LOC B-MISC: the sequence is converted, not tag by tag.
    assert word_tags(m, [1, 2, 0, 3, 3, 5]) == ["B-PER", "E-PER", "O", "S-LOC", "S-LOC", "O"]


def test_bmes_checkpoint_onto_iob2_data():
    checkpoint = ["O", "B-PER", "M-PER", "E-PER", "S-PER"]
    m = token_label_map(checkpoint, label_set(["PER"], "IOB2"), "IOB2")
    assert m.checkpoint_scheme == "BMES"
    assert m.sources == [[0], [1, 4], [2, 3]]
    assert word_tags(m, [4, 1, 2, 3, 0]) == ["B-PER", "B-PER", "I-PER", "I-PER", "O"]


def test_iob2_checkpoint_onto_iob1_data():
    m = token_label_map(CONLL_CHECKPOINT, label_set(["PER", "LOC"], "IOB1"), "IOB1")
    assert m.sources == [[0, 5, 6], [1], [2], [3], [4]]
    # Two adjacent PER entities: IOB1 marks only the second start with B-.
    assert word_tags(m, [1, 1, 2, 0]) == ["I-PER", "B-PER", "I-PER", "O"]


def test_io_labels_with_long_names_onto_iob2_data():
    m = token_label_map(["O", "PERSON", "Location"], IOB2_PER_LOC, "IOB2")
    assert m.checkpoint_scheme == "IO"
    assert m.sources == [[0], [1], [1], [2], [2]]
    assert word_tags(m, [1, 1, 0, 2, 2]) == ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]


def test_lower_case_types_and_synonyms():
    m = token_label_map(["O", "B-person", "I-person", "B-location", "I-location", "B-organisation",
                         "I-organisation"], label_set(["ORG", "PER", "LOC"], "IOB2"), "IOB2")
    assert m.dropped == []
    # data: O B-ORG I-ORG B-PER I-PER B-LOC I-LOC; the checkpoint's columns are in another order.
    assert m.sources == [[0], [5], [6], [1], [2], [3], [4]]
    assert word_tags(m, [5, 6, 1, 0, 3]) == ["B-ORG", "I-ORG", "B-PER", "O", "B-LOC"]


def test_unmappable_label_sets_name_both():
    with pytest.raises(ConfigError) as e:
        token_label_map(CONLL_CHECKPOINT, label_set(["PER", "DATE"], "IOB2"), "IOB2")
    message = str(e.value)
    assert "'B-MISC'" in message and "'B-DATE'" in message and "DATE" in message
    with pytest.raises(ConfigError, match="LABEL_0"):
        token_label_map(["LABEL_0", "LABEL_1"], IOB2_PER_LOC, "IOB2")


def test_class_labels_match_by_name():
    assert class_label_map(["positive", "negative", "neutral"], ["NEGATIVE", "POSITIVE"]) == ([1, 0], ["neutral"])
    with pytest.raises(ConfigError, match=r"\['LABEL_0', 'LABEL_1'\].*\['neg', 'pos'\]"):
        class_label_map(["LABEL_0", "LABEL_1"], ["neg", "pos"])


# ----------------------------------------------------------------------------- tiny checkpoints

def _save_checkpoint(directory, model_class, id2label):
    """A tiny BERT checkpoint with a sharp random head (its argmax varies from word to word)."""
    write_tiny_vocab(directory)
    vocab = len((directory / "vocab.txt").read_text(encoding="utf-8").split())
    config = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, id2label=dict(enumerate(id2label)),
                        label2id={label: i for i, label in enumerate(id2label)})
    tf.keras.utils.set_random_seed(7)
    model = model_class(config)
    model(model.dummy_inputs)
    kernel, bias = model.classifier.get_weights()
    model.classifier.set_weights([np.random.default_rng(1).normal(0, 2.0, kernel.shape).astype(np.float32), bias])
    model.save_pretrained(str(directory))
    return model


@pytest.fixture(scope="module")
def token_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ner_checkpoint")
    return directory, _save_checkpoint(directory, TFBertForTokenClassification, CONLL_CHECKPOINT)


@pytest.fixture(scope="module")
def io_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("io_checkpoint")
    return directory, _save_checkpoint(directory, TFBertForTokenClassification, ["O", "PERSON", "LOCATION"])


def checkpoint_word_labels(model, tokenizer, sentences):
    """The checkpoint's own argmax label at each word's first piece (computed without our code)."""
    result = []
    for s in sentences:
        enc = tokenizer(list(s.tokens), is_split_into_words=True, return_tensors="np")
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits.numpy()[0]
        firsts, seen = [], set()
        for position, word in enumerate(enc.word_ids(0)):
            if word is not None and word not in seen:
                seen.add(word)
                firsts.append(position)
        result.append([model.config.id2label[int(i)] for i in logits[firsts].argmax(-1)])
    return result


def teacher_words(teacher, tokenizer, sentences):
    windows = encode(sentences, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    return teacher.decode_words(windows, predict_piece_tags(teacher, windows))


SENTENCES = toy_ner_sentences(12, seed=5)


def tokenizer_of(directory):
    return AutoTokenizer.from_pretrained(str(directory))


def test_token_checkpoint_predictions_are_its_own(token_checkpoint, caplog, tmp_path):
    directory, original = token_checkpoint
    with caplog.at_level(logging.INFO):
        teacher, tokenizer = build_pretrained_teacher(str(directory), "token", IOB2_PER_LOC, "IOB2", 32)
    assert "is a fine-tuned BertForTokenClassification (7 labels); used as it is" in caplog.text
    assert "checkpoint entity types ['MISC'] are not in the data" in caplog.text
    own = checkpoint_word_labels(original, tokenizer, SENTENCES)
    # MISC reads as O; the rest is the checkpoint's label (IOB2 on IOB2 data).
    expected = [[t if "MISC" not in t else "O" for t in sentence] for sentence in own]
    assert len({t for s in own for t in s}) >= 3  # the head is not trivially constant
    assert teacher_words(teacher, tokenizer, SENTENCES) == expected

    # Logits over our tags: data columns from the checkpoint's, O summed with MISC, markers the minimum.
    batch = tokenizer([list(s.tokens) for s in SENTENCES[:2]], is_split_into_words=True, padding=True,
                      return_tensors="np")
    inputs = {"input_ids": batch["input_ids"].astype(np.int32), "attention_mask": batch["attention_mask"].astype(np.int32)}
    raw = original(**inputs).logits.numpy()
    mapped, hidden = teacher.call_with_hidden(inputs, 1)
    mapped = mapped.numpy()
    assert mapped.shape == raw.shape[:2] + (9,) and hidden.shape == raw.shape[:2] + (32,)
    np.testing.assert_allclose(mapped[..., 1:5], raw[..., 1:5], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mapped[..., 0], np.logaddexp.reduce(raw[..., [0, 5, 6]], axis=-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mapped[..., 5:], np.repeat(mapped[..., :5].min(-1, keepdims=True), 4, -1))
    assert teacher.word_embeddings().shape == (original.config.vocab_size, 32)

    teacher.save(tmp_path / "saved", tokenizer)
    reloaded, reloaded_tokenizer = load_teacher(tmp_path / "saved")
    np.testing.assert_allclose(reloaded(inputs).numpy(), mapped, rtol=1e-6, atol=1e-6)
    assert teacher_words(reloaded, reloaded_tokenizer, SENTENCES) == expected


def test_io_checkpoint_onto_bioes_data(io_checkpoint):
    directory, original = io_checkpoint
    bioes = label_set(["LOC", "PER"], "BIOES")
    teacher, tokenizer = build_pretrained_teacher(str(directory), "token", bioes, "BIOES", 32)
    names = {"O": "O", "PERSON": "I-PER", "LOCATION": "I-LOC"}
    own = [[names[t] for t in s] for s in checkpoint_word_labels(original, tokenizer, SENTENCES)]
    expected = [convert_tags(s, "IOB1", "BIOES") for s in own]
    assert any(t.startswith(("B-", "E-")) for s in expected for t in s) or \
        any(t.startswith("S-") for s in expected for t in s)
    assert teacher_words(teacher, tokenizer, SENTENCES) == expected


def test_unmappable_checkpoint_fails_naming_both(token_checkpoint):
    with pytest.raises(ConfigError, match=r"B-MISC.*B-DATE"):
        build_pretrained_teacher(str(token_checkpoint[0]), "token", label_set(["DATE"], "IOB2"), "IOB2", 32)
    with pytest.raises(ConfigError, match="ForTokenClassification, but the data is sentence classification"):
        build_pretrained_teacher(str(token_checkpoint[0]), "classification", ["a", "b"], None, 32)


def test_sequence_checkpoint_predictions_are_its_own(tmp_path):
    original = _save_checkpoint(tmp_path / "ckpt", TFBertForSequenceClassification, ["positive", "negative"])
    enc = tokenizer_of(tmp_path / "ckpt")([list(s.tokens) for s in SENTENCES], is_split_into_words=True, padding=True,
                                          return_tensors="np")
    # Centre the random head's decision on these texts, so that both classes are predicted.
    margin = np.diff(original(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits.numpy())
    kernel, bias = original.classifier.get_weights()
    original.classifier.set_weights([kernel, bias + np.array([0.0, -np.median(margin) + 1e-4], np.float32)])
    original.save_pretrained(str(tmp_path / "ckpt"))
    teacher, tokenizer = build_pretrained_teacher(str(tmp_path / "ckpt"), "classification",
                                                  ["NEGATIVE", "POSITIVE"], None, 32)
    texts = [Sentence(list(s.tokens), None, None, label="POSITIVE") for s in SENTENCES]
    arrays = encode_texts(texts, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    predicted = predict_by_length_texts(arrays, teacher.predict_tags_fn(), 8)
    raw = original(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits.numpy()
    own = [original.config.id2label[int(i)].upper() for i in raw.argmax(-1)]
    assert len(set(own)) == 2
    assert [teacher.tag_vocab.labels[i] for i in predicted] == own
    # The data's classes are the checkpoint's columns swapped; the hidden output is the [CLS] state.
    inputs = {"input_ids": enc["input_ids"].astype(np.int32), "attention_mask": enc["attention_mask"].astype(np.int32)}
    logits, cls_state = teacher.call_with_hidden(inputs, 2)
    np.testing.assert_allclose(logits.numpy(), raw[:, ::-1], rtol=1e-5, atol=1e-5)
    assert cls_state.shape == (len(SENTENCES), 32)
    teacher.save(tmp_path / "saved", tokenizer)
    reloaded, _ = load_teacher(tmp_path / "saved")
    np.testing.assert_allclose(reloaded(inputs).numpy(), logits.numpy(), rtol=1e-6, atol=1e-6)
    # bin/evaluate scores the saved teacher as a classifier: accuracy is the share predicted POSITIVE.

    scores = evaluate_model(tmp_path / "saved", texts, "IOB2")
    assert scores["all"]["accuracy"] == pytest.approx(own.count("POSITIVE") / len(own))


# ----------------------------------------------------------------------------- the pipeline

def _write_conll(path, sentences):
    path.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(s.tokens, s.tags)) + "\n" for s in sentences),
                    encoding="utf-8")


def _run_config(work_dir, corpus, teacher, train_file, student=None):
    data = DataConfig(format="conll", data_dir=str(corpus), train_file=train_file, dev_file="dev.txt",
                      test_file="test.txt", transfer_file="unlabeled.txt")
    return pipeline.RunConfig(
        work_dir=str(work_dir), data=data, student=student, progress=False,
        teacher=pipeline.TeacherConfig(name=str(teacher), max_seq_length=32, layer=1,
                                       finetune=FinetuneConfig(epochs=3, batch_size=8, progress=False)),
        transfer=pipeline.TransferConfig(shard_size=16, batch_size=8))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    _write_conll(root / "train.txt", toy_ner_sentences(16, seed=3))
    _write_conll(root / "dev.txt", SENTENCES)
    _write_conll(root / "test.txt", toy_ner_sentences(8, seed=4))
    (root / "unlabeled.txt").write_text("john was in paris\nmary at berlin .\nthe john of mary\n", encoding="utf-8")
    return root


def test_teacher_step_uses_the_checkpoint_as_it_is(token_checkpoint, corpus, tmp_path, caplog):
    directory, original = token_checkpoint
    with caplog.at_level(logging.INFO):
        metrics = pipeline.run(_run_config(tmp_path, corpus, directory, "train.txt"))
    assert "used as it is, no fine-tuning" in caplog.text
    info = pipeline.WorkDir(str(tmp_path)).step_info("teacher")
    assert info["history"] == [] and info["best_epoch"] == 0  # --teacher_epochs=3 did not fine-tune it
    teacher, tokenizer = load_teacher(tmp_path / "teacher" / "model")
    own = [[t if "MISC" not in t else "O" for t in s] for s in checkpoint_word_labels(original, tokenizer, SENTENCES)]
    assert teacher_words(teacher, tokenizer, SENTENCES) == own
    expected = score_by_language([s.tags for s in SENTENCES], own, [None] * len(SENTENCES), "IOB2")
    # The teacher's own decoding is the step's argmax_scores (its scores are decoded as the students).
    got = metrics["teacher"]["argmax_scores"]["dev"]["all"]
    assert {k: v for k, v in got.items() if k != "types"} == pytest.approx(
        {k: v for k, v in expected["all"].items() if k != "types"})
    assert got["types"].keys() == expected["all"]["types"].keys()
    for kind, values in expected["all"]["types"].items():
        assert got["types"][kind] == pytest.approx(values)


def test_empty_train_split_with_unlabeled_text(token_checkpoint, corpus, tmp_path):
    student = DistilConfig(arch=StudentArch(embedding_dim=8, hidden=8), epochs_per_layer=1, patience=1, batch_size=8,
                           strategy="D2", run_eagerly=True)  # tiny: eager is cheaper than tracing
    cfg = _run_config(tmp_path, corpus, token_checkpoint[0], "", student)
    work = pipeline.WorkDir(str(tmp_path))
    fingerprint = pipeline.step_teacher(work, cfg, pipeline.step_data(work, cfg))
    pipeline.step_transfer(work, cfg, fingerprint)
    assert work.step_info("data")["train_sentences"] == 0 and work.step_info("transfer")["train_windows"] == 0

    # The label losses' "train" source is the transfer text labeled with the teacher's argmax, at the
    # pieces a hub checkpoint was trained on: each word's first piece (the cache's teacher_mask).
    teacher, tokenizer = load_teacher(tmp_path / "teacher" / "model")
    pad = teacher.tag_vocab.pad_id
    train_for, _, dev = staged_sources(student, tmp_path / "transfer", tmp_path / "transfer_dev", 0, pad_id=pad)
    # Dev's CE then counts the same pieces: gold tags at the first pieces, [PAD] at [CLS]/[SEP]/X.
    dev_batch = next(iter(dev))
    dev_labels, dev_marked = dev_batch["label_ids"].numpy(), dev_batch["teacher_mask"].numpy()
    assert (dev_labels[dev_marked == 0] == pad).all() and (dev_labels[dev_marked == 1] != pad).all()
    batch = next(iter(train_for(0)))
    ids = {k: tf.constant(batch[k]) for k in ("input_ids", "attention_mask")}
    expected = tf.argmax(teacher(ids), -1, output_type=tf.int32).numpy()
    first = {tuple(e["input_ids"]): e["teacher_mask"] for e in
             read_sharded(tmp_path / "transfer", keys=["input_ids", "teacher_mask"]).as_numpy_iterator()}
    marked = np.stack([first[tuple(row)][:len(row)] for row in batch["input_ids"].numpy()])
    assert 0 < marked.sum() < batch["attention_mask"].numpy().sum()  # [CLS] and [SEP] are not marked
    expected[marked == 0] = pad
    np.testing.assert_array_equal(batch["label_ids"].numpy(), expected)
    assert batch["input_ids"].shape[0] == 3 and set(batch) == {"input_ids", "attention_mask", "label_ids"}
    # ... and the D2 stage (labels + logits + representations) runs on it.
    _, history = distil(student, teacher, tokenizer, tmp_path / "transfer", tmp_path / "transfer_dev", 0,
                        pipeline.load_data(work)["dev"], "IOB2")
    assert len(history.steps) == 1 and np.isfinite(history.steps[0].best_val_loss) and history.steps[0].dev_f1 is not None

    # Without unlabeled text there is nothing to distil from: one error before any work.
    cfg = _run_config(tmp_path / "none", corpus, token_checkpoint[0], "", student)
    cfg.data.transfer_file = ""
    with pytest.raises(ConfigError, match="empty train split"):
        pipeline.run(cfg)
    # A teacher that would be fine-tuned needs the labeled train split.
    cfg = _run_config(tmp_path / "plain", corpus, "random", "")
    with pytest.raises(ConfigError, match="0 train"):
        pipeline.run(cfg)
