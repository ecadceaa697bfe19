"""Dual teacher: student pieces enter through the up-projected student table and are predicted with the
student softmax; the teacher's loss trains the student's embeddings; a saved student reloads exactly."""
import numpy as np
import pytest
import tensorflow as tf
from subwords_helpers import corpus, tiny_mlm, tokenizer_pair
from transformers import AutoTokenizer, TFAutoModel

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.subwords.dual import IGNORE, Specials, build_batch, dual_corpus
from xtremedistil_tf.methods.subwords.models import (DualTeacher, gather_masked, load_student, save_student, transform,
                                                     word_embeddings)
from xtremedistil_tf.methods.subwords.train import DistilLMConfig, DualTrainer, masked_word_accuracy, train


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    student_tok, teacher_tok = tokenizer_pair(tmp_path_factory.mktemp("models"))
    s_spec, t_spec = Specials.of(student_tok), Specials.of(teacher_tok)
    sentences = dual_corpus(student_tok, teacher_tok, corpus(16, seed=2))
    batch = build_batch(sentences, np.random.default_rng(0), s_spec, t_spec, p=0.5, mask_prob=0.4, train=False)
    student = tiny_mlm(s_spec.size, hidden=16, seed=1)
    teacher = DualTeacher(tiny_mlm(t_spec.size, hidden=32, seed=2), 16, s_spec.size, seed=3)
    return student_tok, student, teacher, {k: tf.constant(v) for k, v in batch.items()}


def vocab_logits(dual, batch, student_embeddings):
    """(teacher-vocabulary logits, student-vocabulary logits, labels, is_student) at the masked positions,
    both softmaxes for every position (DualTeacher.masked_loss takes each position's own one)."""
    embeds = dual.embed(batch["t_ids"], batch["t_is_student"], student_embeddings)
    out = dual.teacher.bert(input_ids=None, inputs_embeds=embeds, attention_mask=batch["t_attn"], training=False)
    hidden, labels, is_student = gather_masked(out.last_hidden_state, batch["t_labels"], batch["t_is_student"])
    h = transform(dual.teacher, hidden)
    t_logits = tf.matmul(h, word_embeddings(dual.teacher), transpose_b=True) + dual.teacher.mlm.predictions.bias
    s_logits = tf.matmul(h, dual.student_table(student_embeddings), transpose_b=True) + dual.student_bias
    return t_logits, s_logits, labels, is_student


def test_each_position_reads_the_table_of_its_vocabulary(setup):
    _, student, teacher, batch = setup
    emb = teacher.embed(batch["t_ids"], batch["t_is_student"], word_embeddings(student)).numpy()
    table_s = word_embeddings(student).numpy() @ teacher.up.numpy()
    table_t = word_embeddings(teacher.teacher).numpy()
    ids, flags = batch["t_ids"].numpy(), batch["t_is_student"].numpy()
    expected = np.where(flags[..., None] == 1, table_s[np.where(flags == 1, ids, 0)], table_t[ids])
    np.testing.assert_allclose(emb, expected, rtol=1e-6, atol=1e-7)  # float32 summation order
    assert 0 < flags.sum() < flags.size


def test_masked_positions_use_the_softmax_of_their_vocabulary(setup):
    _, student, teacher, batch = setup
    loss, count, correct = teacher.masked_loss(batch, word_embeddings(student))
    t_logits, s_logits, labels, is_student = (x.numpy() for x in vocab_logits(teacher, batch, word_embeddings(student)))
    assert t_logits.shape[1] == word_embeddings(teacher.teacher).shape[0] and s_logits.shape[1] == 60

    def nll(logits, label):
        return -(logits[label] - np.log(np.exp(logits - logits.max()).sum()) - logits.max())

    expected = sum(nll(s_logits[i], labels[i]) if is_student[i] else nll(t_logits[i], labels[i])
                   for i in range(len(labels)))
    assert int(count) == int((batch["t_labels"].numpy() != IGNORE).sum()) == len(labels)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert set(is_student) == {0, 1}
    hits = sum(int((s_logits if f else t_logits)[i].argmax() == labels[i]) for i, f in enumerate(is_student))
    assert int(correct) == hits


def test_the_teachers_loss_reaches_the_student_embeddings_only_through_student_pieces(setup):
    _, student, teacher, batch = setup

    def grad_norm(b):
        with tf.GradientTape() as tape:
            loss, _, _ = teacher.masked_loss(b, word_embeddings(student))
        grad = tape.gradient(loss, word_embeddings(student))
        return 0.0 if grad is None else np.abs(tf.convert_to_tensor(grad).numpy()).sum(1)

    # Student-segmented masked words are scored over the whole student softmax: every row gets gradient.
    assert batch["t_is_student"].numpy().any() and np.min(grad_norm(batch)) > 0
    teacher_only = dict(batch, t_is_student=tf.zeros_like(batch["t_is_student"]))
    assert np.sum(grad_norm(teacher_only)) == 0.0


@pytest.mark.parametrize("variant", ["NoKD", "DualTrain+SharedProjUp"])   # DualTrain's terms are a subset
def test_variants_combine_their_terms_and_train(setup, variant):
    _, _, _, batch = setup
    student = tiny_mlm(60, hidden=16, seed=4)
    teacher = DualTeacher(tiny_mlm(200, hidden=32, seed=5), 16, 60, seed=6)
    cfg = DistilLMConfig(variant=variant, alpha=0.5, steps=2, warmup_fraction=0.0, learning_rate=1e-2)
    trainer = DualTrainer(student, teacher, cfg, run_eagerly=True)
    terms = {k: float(v) for k, v in trainer.losses(batch).items()}
    expected = terms["student"] + terms.get("teacher", 0.0) + 0.5 * terms.get("projection", 0.0)
    assert terms["total"] == pytest.approx(expected, rel=1e-6)
    assert ("teacher" in terms) == (variant != "NoKD") and ("projection" in terms) == variant.endswith("Up")
    before = word_embeddings(student).numpy().copy()
    first = trainer.train_step({k: v.numpy() for k, v in batch.items()})["total"]
    last = trainer.train_step({k: v.numpy() for k, v in batch.items()})["total"]
    assert last < first and not np.allclose(before, word_embeddings(student).numpy())


def test_a_text_smaller_than_one_batch_is_refused():
    """`batches` skips a pass's sentences that cannot fill a batch: it would never yield one (a hang)."""
    cfg = DistilLMConfig(variant="NoKD", batch_size=8, steps=2)
    trainer = DualTrainer(tiny_mlm(60, hidden=16, seed=7), None, cfg, run_eagerly=True)
    with pytest.raises(ConfigError, match="5 training sentences cannot fill one batch of 8"):
        train(trainer, [None] * 5, None, None, progress=False)  # refused before any sentence is read


def test_a_saved_student_reloads_with_identical_outputs(setup, tmp_path):
    student_tok, student, _, batch = setup
    save_student(student, student_tok, tmp_path / "student")
    again = load_student(tmp_path / "student")
    inputs = {"input_ids": batch["s_ids"], "attention_mask": batch["s_attn"]}
    np.testing.assert_allclose(again(**inputs).logits.numpy(), student(**inputs).logits.numpy(), atol=1e-6)
    # The NER pipeline's loader (TFAutoModel: encoder only) reads the same encoder.
    encoder = TFAutoModel.from_pretrained(str(tmp_path / "student"))
    np.testing.assert_allclose(encoder(**inputs).last_hidden_state.numpy(),
                               student.bert(**inputs).last_hidden_state.numpy(), atol=1e-6)
    assert AutoTokenizer.from_pretrained(str(tmp_path / "student")).get_vocab() == student_tok.get_vocab()


def test_masked_word_accuracy_counts_a_word_right_only_when_all_its_pieces_are(setup):
    _, student, _, batch = setup
    numpy_batch = {k: v.numpy().copy() for k, v in batch.items()}
    pred = student(input_ids=batch["s_ids"], attention_mask=batch["s_attn"]).logits.numpy().argmax(-1)
    # Relabel the masked pieces so the answers are known: even words entirely right; odd words right on
    # their first piece only (wrong as words when they have more pieces).
    labels, words = numpy_batch["s_labels"], numpy_batch["s_word"]
    first_seen, pieces_right, word_right = set(), 0, {}
    for b, t in zip(*np.nonzero(labels != IGNORE)):
        w = words[b, t]
        right = w % 2 == 0 or w not in first_seen
        labels[b, t] = pred[b, t] if right else (pred[b, t] + 1) % 60
        first_seen.add(w)
        pieces_right += right
        word_right[w] = word_right.get(w, True) and right
    acc = masked_word_accuracy(student, [numpy_batch], compiled=False)
    n_pieces = int((labels != IGNORE).sum())
    assert acc["masked_pieces"] == n_pieces and acc["masked_words"] == len(word_right)
    assert acc["piece_accuracy"] == pytest.approx(pieces_right / n_pieces)
    assert acc["word_accuracy"] == pytest.approx(np.mean(list(word_right.values())))
    assert 0 < acc["word_accuracy"] < acc["piece_accuracy"] < 1   # multi-piece odd words are wrong words
