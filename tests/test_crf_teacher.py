"""The BERT+CRF teacher: piece-level constraints, learning a toy task, surrogates, save/load."""
import json

import numpy as np
import pytest
import tensorflow as tf

from conftest import TOY_LABELS, toy_ner_sentences
from xtremedistil_tf.crf import ops
from xtremedistil_tf.data.alignment import TagVocab, encode
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.teachers.crf_head import build_crf_teacher, piece_crf_constraints
from xtremedistil_tf.teachers.finetune import evaluate_teacher, finetune, parameter_groups, predict_piece_tags, recipe_for
from xtremedistil_tf.teachers.saved import load_teacher


def crf_finetune_config(**overrides):
    """The multi-grained paper's teacher settings (Table 6, Sec. 5.2): the CRF recipe at the encoder rate 1e-5;
    keyword arguments override them."""
    return recipe_for("crf", **{"batch_size": 32, "learning_rate": 1e-5, **overrides})


def _path_allowed(tags, allowed, start, end):
    return start[tags[0]] and end[tags[-1]] and all(allowed[a, b] for a, b in zip(tags, tags[1:]))


def test_constraints_admit_every_encoded_window_and_forbid_scheme_breaks(tiny_tokenizer):
    vocab = TagVocab(TOY_LABELS)
    allowed, start, end = piece_crf_constraints(vocab, "IOB2")
    ids = {t: vocab.id(t) for t in vocab.tags}
    sentences = toy_ner_sentences(50, seed=3) + [
        Sentence(["john", "berlinberlin", "paris", "mary"], ["B-PER", "B-LOC", "I-LOC", "B-PER"]),
        Sentence([], [])]
    # max_seq_length 8: long sentences become windows cut mid-entity ([CLS] I-LOC ..., B-LOC [SEP]).
    for max_len in (16, 8):
        windows = encode(sentences, tiny_tokenizer, vocab, max_len)
        for row, mask in zip(windows.label_ids, windows.attention_mask):
            assert _path_allowed(row[:mask.sum()], allowed, start, end), [vocab.tags[t] for t in row]
    assert not allowed[ids["O"], ids["I-PER"]] and not allowed[ids["B-LOC"], ids["I-PER"]]
    assert allowed[ids["[CLS]"], ids["I-LOC"]] and allowed[ids["B-PER"], ids["X"]] and allowed[ids["X"], ids["I-PER"]]
    assert not allowed[ids["[CLS]"], ids["X"]] and not allowed[:, ids["[CLS]"]].any()
    assert not allowed[ids["[SEP]"]].any() and not allowed[:, ids["[PAD]"]].any() and not allowed[ids["[PAD]"]].any()
    assert start.sum() == 1 and start[ids["[CLS]"]] and end.sum() == 1 and end[ids["[SEP]"]]


@pytest.fixture(scope="module")
def trained(tiny_bert_dir):
    tf.keras.utils.set_random_seed(0)
    teacher, tokenizer = build_crf_teacher(str(tiny_bert_dir), TOY_LABELS, "IOB2", max_seq_length=16,
                                           dropout=0.1, embedding_dropout=0.1, random_init=True)
    train, dev = toy_ner_sentences(200, seed=1), toy_ner_sentences(60, seed=2)
    before = evaluate_teacher(teacher, tokenizer, dev, "IOB2")["all"]["f1"]
    # A random-init tiny encoder needs a far larger rate than the paper's 1e-5 for a pretrained one.
    config = crf_finetune_config(epochs=3, batch_size=16, learning_rate=3e-3, head_learning_rate=1e-2,
                                 layer_decay=1.0, warmup_fraction=0.1, patience=4, progress=False)
    result = finetune(teacher, tokenizer, train, dev, "IOB2", config)
    return teacher, tokenizer, dev, before, result


def test_crf_teacher_learns_toy_task(trained):
    teacher, tokenizer, dev, before, result = trained
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < 0.3 * losses[0]
    after = evaluate_teacher(teacher, tokenizer, dev, "IOB2")["all"]["f1"]
    assert after > 0.9 and after > before + 0.4
    assert after == pytest.approx(result.best_dev_f1)
    # The transitions learned: O -> I-LOC stays forbidden, B-LOC -> I-LOC became likely.
    trans = teacher.transitions.numpy()
    vocab = teacher.tag_vocab
    assert trans[vocab.id("O"), vocab.id("I-LOC")] == ops.FORBIDDEN
    assert trans[vocab.id("B-LOC"), vocab.id("I-LOC")] > trans[vocab.id("B-LOC"), vocab.id("B-PER")]


def test_viterbi_paths_obey_the_constraints(trained):
    teacher, tokenizer, dev, _, _ = trained
    allowed, start, end = piece_crf_constraints(teacher.tag_vocab, "IOB2")
    windows = encode(dev, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    tags = predict_piece_tags(teacher, windows)
    for row, mask in zip(tags, windows.attention_mask):
        assert _path_allowed(row[:mask.sum()], allowed, start, end)


def test_surrogates_of_the_trained_teacher(trained):
    teacher, tokenizer, dev, _, _ = trained
    windows = encode(dev[:8], tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    batch = {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask}
    logits = teacher(batch).numpy()
    lengths = windows.attention_mask.sum(1)
    out = teacher.surrogate_fn(3)(logits, teacher.transitions.numpy(), lengths)
    np.testing.assert_allclose(out["kbest_probs"].sum(1) + out["residual"], 1.0, atol=1e-5)
    best = teacher.predict_tags_fn()(batch).numpy()
    np.testing.assert_array_equal(out["kbest_tags"][:, 0], best)
    np.testing.assert_allclose(out["marginals"].sum(-1), windows.attention_mask, atol=1e-5)
    # A trained teacher is confident on the toy task: its top path holds most of the mass.
    assert out["kbest_probs"][:, 0].mean() > 0.5


def test_head_group_holds_logits_and_transitions_at_head_rate(trained):
    teacher = trained[0]
    paper = crf_finetune_config()
    assert (paper.learning_rate, paper.head_learning_rate, paper.layer_decay) == (1e-5, 1e-3, 0.9)
    groups = parameter_groups(teacher, crf_finetune_config(warmup_fraction=0.0), total_steps=100)
    rates = [float(opt.learning_rate) for opt, _ in groups]  # at step 0, no warm-up
    # Top encoder layer, bottom layer, embeddings (0.9 decay per level), then logits + CRF.
    assert rates == pytest.approx([1e-5, 9e-6, 8.1e-6, 1e-3])
    head_vars = {v.name for v in groups[-1][1]}
    assert head_vars == {v.name for v in teacher.classifier.trainable_variables} | {teacher.crf.raw_transitions.name}
    # Every trainable variable but the pooler (2) is in exactly one group.
    assert sum(len(vs) for _, vs in groups) == len(teacher.trainable_variables) - 2
    assert teacher.encoder.get_input_embeddings().dropout.rate == pytest.approx(0.1)
    assert teacher.dropout.rate == pytest.approx(0.1)


def test_paper_dropouts_by_default(tiny_bert_dir):
    teacher, _ = build_crf_teacher(str(tiny_bert_dir), TOY_LABELS, "IOB2", random_init=True)
    assert teacher.encoder.get_input_embeddings().dropout.rate == 0.5 and teacher.dropout.rate == 0.5
    # Only the embedding output: the encoder layers keep the config's dropout.
    assert teacher.encoder.config.hidden_dropout_prob == pytest.approx(0.1)


def test_save_and_reload(trained, tmp_path):
    teacher, tokenizer, dev, _, _ = trained
    teacher.save(tmp_path / "teacher", tokenizer)
    meta = json.loads((tmp_path / "teacher" / "teacher.json").read_text())
    assert meta["head"] == "crf" and meta["scheme"] == "IOB2" and meta["embedding_dropout"] == 0.1
    # The generic loader recognises the CRF head from teacher.json.
    reloaded, tokenizer2 = load_teacher(tmp_path / "teacher")
    np.testing.assert_array_equal(reloaded.transitions.numpy(), teacher.transitions.numpy())
    windows = encode(dev, tokenizer2, reloaded.tag_vocab, reloaded.max_seq_length)
    np.testing.assert_array_equal(predict_piece_tags(reloaded, windows), predict_piece_tags(teacher, windows))
