"""Multi-grained KD: CRF students, the surrogate cache, training with the sequence/token losses,
and a toy task where the teacher's surrogates on unlabeled text beat the few labels alone."""
import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import read_scalars

import xtremedistil_tf  # noqa: F401  (registers the custom layers for load_model)
from xtremedistil_tf.crf import ops
from xtremedistil_tf.data.alignment import TagVocab, decode, encode
from xtremedistil_tf.data.scoring import entity_scores
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.engine.resume import EpochCheckpoint, WeightsSlot
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods import multigrained as mg
from xtremedistil_tf.methods.multigrained import (
    MultiGrainedConfig,
    hard_targets,
    make_crf_dev_f1,
    predict_tags_crf,
    train_multigrained,
    windows_dataset,
)
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.student_run import load_student, save_student
from xtremedistil_tf.run.pipeline import student_fingerprint
from xtremedistil_tf.run.workdir import WorkDir
from xtremedistil_tf.students.crf_student import (
    build_bilstm_crf_student,
    build_transformer_crf_student,
    student_crf_constraints,
)
from xtremedistil_tf.teachers.crf_head import CRFTokenTeacher
from xtremedistil_tf.teachers.finetune import predict_piece_tags
from xtremedistil_tf.teachers.model import load_encoder, load_tokenizer
from xtremedistil_tf.transfer.cache import load_manifest, padded_batch, padding_values, read_sharded
from xtremedistil_tf.transfer.multigrained import write_multigrained_outputs

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
VOCAB = TagVocab(LABELS)
PER, LOC = "abcdefghijklm", "nopqrstuvwxyz"  # one-letter names and cities: single pieces of the tiny vocab
FILLERS = ["the", "in", "of", "to", "and", "at", "on", "is", "was"] + [str(d) for d in range(10)]
MAX_LEN = 16


def letter_sentences(n, seed, labeled=True):
    """26 entity words: too many for ~12 labeled sentences to cover, easy for a teacher that knows them."""
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(int(rng.integers(4, 9))):
            r = rng.random()
            if r < 0.25:
                tokens.append(str(rng.choice(list(PER))))
                tags.append("B-PER")
            elif r < 0.5:
                tokens.append(str(rng.choice(list(LOC))))
                tags.append("I-LOC" if tags and tags[-1] in ("B-LOC", "I-LOC") else "B-LOC")
            else:
                tokens.append(str(rng.choice(FILLERS)))
                tags.append("O")
        sentences.append(Sentence(tokens, tags if labeled else None))
    return sentences


class RuleTeacher(CRFTokenTeacher):
    """A CRF teacher that knows the toy rule: its logits are a lookup of the piece id, and its
    transitions prefer I-LOC after a LOC. Not certain: I-LOC beats B-LOC after a LOC by a small
    margin, so the k-best paths split the mass and the residual is not 0."""

    def __init__(self, encoder, tokenizer):
        super().__init__(encoder, VOCAB, "IOB2", MAX_LEN, dropout=0.0, embedding_dropout=0.0)
        table = np.zeros([tokenizer.vocab_size, len(VOCAB)], np.float32)
        table[:, VOCAB.x_id] = 3.0  # continuation pieces; every entity word here is one piece
        for word, tag in [(w, "O") for w in FILLERS] + [(w, "B-PER") for w in PER] + [(w, "B-LOC") for w in LOC]:
            row = table[tokenizer.convert_tokens_to_ids(word)]
            row[:] = 0.0
            row[VOCAB.id(tag)] = 3.0
            if tag == "B-LOC":
                # I-LOC wins after a LOC only through the 1.5 transition bonus, by 0.5: unsure.
                row[VOCAB.id("I-LOC")] = 2.0
        table[tokenizer.cls_token_id, VOCAB.id("[CLS]")] = 5.0
        table[tokenizer.sep_token_id, VOCAB.id("[SEP]")] = 5.0
        self.table = tf.constant(table)

    def call(self, inputs, training=False):
        # A small deterministic ripple over (piece, position, tag) so that no two paths tie
        # exactly: the order of tied k-best paths is arbitrary.
        ids = tf.cast(inputs["input_ids"], tf.float32)[..., None]
        positions = tf.cast(tf.range(tf.shape(ids)[1]), tf.float32)[None, :, None]
        tags = tf.range(len(VOCAB), dtype=tf.float32)[None, None, :]
        return tf.gather(self.table, inputs["input_ids"]) + 0.05 * tf.sin(1.3 * ids + 0.7 * positions + 2.1 * tags)

    def call_with_hidden(self, inputs, layer):
        logits = self.call(inputs)
        return logits, tf.zeros_like(logits[..., :2])


@pytest.fixture(scope="module")
def teacher(tiny_bert_dir):
    tokenizer = load_tokenizer(str(tiny_bert_dir))
    rule = RuleTeacher(load_encoder(str(tiny_bert_dir), random_init=True), tokenizer)
    rule.build_for_length()
    raw = np.zeros([len(VOCAB)] * 2, np.float32)
    raw[VOCAB.id("B-LOC"), VOCAB.id("I-LOC")] = raw[VOCAB.id("I-LOC"), VOCAB.id("I-LOC")] = 1.5
    raw[VOCAB.id("[CLS]"), VOCAB.id("I-LOC")] = -3.0  # a window of a whole sentence starts outside an entity
    rule.crf.raw_transitions.assign(raw)
    return rule, tokenizer


@pytest.fixture(scope="module")
def data(teacher, tmp_path_factory):
    """12 labeled + 300 unlabeled windows cached with K=5 surrogates; dev and test sets."""
    rule, tokenizer = teacher
    labeled, unlabeled = letter_sentences(12, seed=1), letter_sentences(300, seed=2, labeled=False)
    windows = encode(labeled + unlabeled, tokenizer, VOCAB, MAX_LEN)
    cache = tmp_path_factory.mktemp("mg") / "transfer"
    write_multigrained_outputs(rule, windows, cache, k=5, fingerprint={"test": 1}, shard_size=200, progress=False)
    dev, test = letter_sentences(60, seed=3), letter_sentences(150, seed=4)
    return {"labeled": labeled, "windows": windows, "cache": cache, "dev": dev, "test": test,
            "dev_windows": encode(dev, tokenizer, VOCAB, MAX_LEN)}


def f1_of(predict, tokenizer, sentences):
    """Entity F1 of `predict(windows) -> piece tags` on labeled sentences."""
    windows = encode(sentences, tokenizer, VOCAB, MAX_LEN)
    return entity_scores([s.tags for s in sentences], decode(windows, predict(windows), VOCAB))["f1"]


def test_cache_holds_the_teachers_surrogates(teacher, data):
    rule, _ = teacher
    windows = data["windows"]
    cached = next(iter(padded_batch(read_sharded(data["cache"]), len(windows), padding_values(data["cache"]),
                                    length=MAX_LEN)))
    manifest = load_manifest(data["cache"])
    assert manifest["fingerprint"] == {"test": 1, "kbest": 5}
    assert manifest["features"]["kbest_tags"] == {"dtype": "uint8", "shape": [5, None], "ragged_axis": 1, "pad": 0}
    assert "hidden" not in manifest["features"]   # no multi-grained loss reads it
    lengths = windows.attention_mask.sum(1)
    direct = rule.surrogate_fn(5)(rule({"input_ids": windows.input_ids, "attention_mask": windows.attention_mask}),
                                  rule.transitions.numpy(), lengths)
    # Computed on each batch's real length and padded back: the same as over the full width.
    np.testing.assert_array_equal(cached["kbest_tags"].numpy(), direct["kbest_tags"])
    np.testing.assert_allclose(cached["kbest_probs"].numpy(), direct["kbest_probs"], atol=1e-6)
    np.testing.assert_allclose(cached["marginals"].numpy(), direct["marginals"], atol=1e-6)
    np.testing.assert_array_equal(cached["kbest_tags"].numpy()[:, 0], predict_piece_tags(rule, windows))
    probs = cached["kbest_probs"].numpy()
    np.testing.assert_allclose(probs.sum(1) + cached["residual"].numpy(), 1.0, atol=1e-5)
    # The teacher is unsure (B-LOC vs I-LOC), so the k-best list matters: mass beyond the top path.
    assert probs[:, 1].mean() > 0.05 and probs[:, 0].mean() < 0.95
    with pytest.raises(ConfigError, match="kbest"):  # another K never reuses the cache
        write_multigrained_outputs(rule, windows, data["cache"], k=3, fingerprint={"test": 1}, progress=False)
    with pytest.raises(ConfigError, match="between 1 and 15"):
        write_multigrained_outputs(rule, windows, data["cache"], k=16, fingerprint={"test": 1}, progress=False)


def test_hard_targets_are_gold_for_labeled_rows_and_top1_for_unlabeled():
    pad = VOCAB.pad_id
    labels = np.array([[5, 0, 1, 6, pad], [pad, pad, pad, pad, pad], [5, 3, 6, pad, pad]], np.int32)
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], np.int32)
    kbest = np.zeros([3, 2, 5], np.int32)
    kbest[:, 0] = [[5, 3, 4, 6, 0], [5, 1, 0, 6, 0], [5, 4, 6, 0, 0]]
    got = hard_targets(labels, mask, kbest, pad).numpy()
    np.testing.assert_array_equal(got, [labels[0], kbest[1, 0], labels[2]])


def _student(vocab_size, seed):
    tf.keras.utils.set_random_seed(seed)
    # Trainable random embeddings: the rule teacher's BERT embeddings are random (std 0.02), so
    # copying them (TE) would only hand the student near-zero inputs.
    return build_bilstm_crf_student(vocab_size, len(VOCAB), student_crf_constraints(VOCAB, "IOB2"),
                                    embedding_dim=16, hidden=32, dropout=0.1)


@pytest.fixture(scope="module")
def runs(teacher, data, tmp_path_factory):
    """The vanilla BiLSTM+CRF on the 12 labeled sentences vs +SEQ (hard + seq_ce, K=5, uncertainty) + DA."""
    rule, tokenizer = teacher
    evaluate = make_crf_dev_f1(data["dev_windows"], [s.tags for s in data["dev"]], VOCAB)
    labeled = encode(data["labeled"], tokenizer, VOCAB, MAX_LEN)
    vocab_size = tokenizer.vocab_size
    # Same student, same seed; the vanilla run gets many more (cheap, 1-batch) epochs to converge.
    vanilla = _student(vocab_size, 0)
    vanilla_history = train_multigrained(
        vanilla, windows_dataset(labeled), None, MultiGrainedConfig(("hard",), epochs=150, batch_size=12,
                                                                    learning_rate=1e-2, patience=40),
        VOCAB.pad_id, evaluate)
    distilled = _student(vocab_size, 0)
    log_dir = tmp_path_factory.mktemp("tensorboard")
    history = train_multigrained(
        distilled, read_sharded(data["cache"]), None,
        MultiGrainedConfig(("hard", "seq_ce"), "uncertainty", kbest=5, epochs=6, batch_size=16, learning_rate=5e-3,
                           patience=3, log_dir=str(log_dir)),
        VOCAB.pad_id, evaluate)
    return vanilla, vanilla_history, distilled, history, log_dir


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_surrogates_on_unlabeled_text_beat_the_few_labels(teacher, data, runs):
    rule, tokenizer = teacher
    vanilla, vanilla_history, distilled, history, _ = runs
    teacher_f1 = f1_of(lambda w: predict_piece_tags(rule, w), tokenizer, data["test"])
    vanilla_f1, distilled_f1 = (f1_of(lambda w, s=s: predict_tags_crf(s, w), tokenizer, data["test"])
                                for s in (vanilla, distilled))
    assert teacher_f1 > 0.99
    assert distilled_f1 > vanilla_f1 + 0.15, (teacher_f1, vanilla_f1, distilled_f1)
    assert distilled_f1 > 0.85
    # Best weights restored: the test-time model is the best dev epoch's.
    assert f1_of(lambda w: predict_tags_crf(distilled, w), tokenizer, data["dev"]) == pytest.approx(history.best_score)
    assert vanilla_history.best_epoch > 0 and vanilla_history.epochs[-1]["dev_loss"] is None


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_uncertainty_lambdas_are_learned_and_logged(runs):
    history = runs[3]
    lambdas = history.lambdas()
    assert lambdas.shape == (len(history.epochs), 2)
    assert np.all(lambdas > 0) and np.abs(np.log(lambdas[-1])).max() > 0.05
    # lambda_i -> 1 / (2 L_i): the loss that stays larger ends with the smaller weight.
    last = history.epochs[-1]["losses"]
    order = np.argsort([last["hard"], last["seq_ce"]])
    assert lambdas[-1][order[0]] > lambdas[-1][order[1]]
    assert all(e["dev_f1"] is not None for e in history.epochs)


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_tensorboard_gets_every_loss_lambda_and_rate_per_epoch(runs):
    history = runs[3]
    scalars = read_scalars(runs[4])
    epochs = list(range(1, len(history.epochs) + 1))
    for name in ("hard", "seq_ce"):
        assert [s for s, _ in scalars[f"loss/{name}"]] == epochs
        np.testing.assert_allclose([v for _, v in scalars[f"lambda/{name}"]],
                                   [e["lambdas"][name] for e in history.epochs], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in scalars["dev_f1"]], [e["dev_f1"] for e in history.epochs], rtol=1e-6)
    assert [v for _, v in scalars["learning_rate"]] == pytest.approx([5e-3] * len(epochs))


def test_every_loss_trains_a_transformer_crf_student_with_equal_weighting(teacher, data):
    rule, _ = teacher
    tf.keras.utils.set_random_seed(1)
    student = build_transformer_crf_student(rule.word_embeddings().shape[0], len(VOCAB),
                                            student_crf_constraints(VOCAB, "IOB2"), embedding_dim=16, depth=1,
                                            heads=2, ffn=32, max_length=MAX_LEN, dropout=0.0)
    before = student.get_layer("crf").raw_transitions.numpy().copy()
    losses = ("hard", "seq_ce", "seq_fuzzy", "token_em", "token_pos")
    history = train_multigrained(student, read_sharded(data["cache"]).take(64), windows_dataset(data["dev_windows"]),
                                 MultiGrainedConfig(losses, "equal", kbest=3, epochs=2, batch_size=32,
                                                    learning_rate=1e-2, patience=None, run_eagerly=True),
                                 VOCAB.pad_id)
    first, last = history.epochs[0]["losses"], history.epochs[-1]["losses"]
    assert set(first) == set(losses) and all(np.isfinite(v) and v >= 0 for v in first.values())
    assert sum(last.values()) < sum(first.values())
    assert history.epochs[-1]["lambdas"] == dict.fromkeys(losses, 1.0)
    # Without an evaluate_fn the dev NLL of the gold tags selects the epoch.
    assert history.best_score == -min(e["dev_loss"] for e in history.epochs) and history.best_epoch > 0
    assert not np.allclose(student.get_layer("crf").raw_transitions.numpy(), before)
    # Forbidden moves stay forbidden however the raw transitions moved.
    assert student.get_layer("crf").transitions.numpy()[VOCAB.id("O"), VOCAB.id("I-LOC")] == ops.FORBIDDEN


def test_token_losses_are_eq10_cross_entropy_unless_token_loss_is_kl(teacher, data):
    """What the training step computes: token_em / token_pos are Eq. 10's CE by default; with
    token_loss="kl" each is lower by the teacher's mean entropy over the real tokens."""
    rule, tokenizer = teacher
    student = _student(tokenizer.vocab_size, 0)
    config = MultiGrainedConfig(("hard", "token_em", "token_pos"), batch_size=16)
    cache = read_sharded(data["cache"]).skip(4)   # labeled and unlabeled rows
    batch = next(iter(mg._stream(cache, mg._needed_keys(config.losses, list(cache.element_spec)), config,
                                 shuffle=False)))
    outputs = student({k: batch[k] for k in mg.INPUT_KEYS}, training=False)
    transitions = student.get_layer("crf").transitions
    values = {kind: [float(v) for v in mg._loss_values(config.losses, outputs, batch, transitions, VOCAB.pad_id,
                                                         kind)] for kind in ("ce", "kl")}
    real = batch["attention_mask"].numpy().astype(bool)
    logits = batch["logits"].numpy().astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q = batch["marginals"].numpy().astype(np.float64)
    emissions = outputs["logits"].numpy().astype(np.float64)
    log_s = emissions - emissions.max(-1, keepdims=True)
    log_s -= np.log(np.exp(log_s).sum(-1, keepdims=True))
    np.testing.assert_allclose(values["ce"][1], -(p * log_s).sum(-1)[real].mean(), rtol=1e-4)
    entropy = {"token_em": -(p * np.log(p)).sum(-1)[real].mean(),
               "token_pos": -np.where(q > 0, q * np.log(np.maximum(q, 1e-300)), 0.0).sum(-1)[real].mean()}
    assert values["ce"][0] == values["kl"][0]   # hard is not a token loss
    for i, name in enumerate(config.losses[1:], start=1):
        np.testing.assert_allclose(values["ce"][i] - values["kl"][i], entropy[name], rtol=1e-3, atol=1e-5)
    assert entropy["token_em"] > 0.05


def test_token_loss_joins_the_fingerprint_of_students_with_token_losses(tmp_path):
    def fingerprint(**kwargs):
        return {"student": student_fingerprint(MultiGrainedConfig(**kwargs))}

    assert fingerprint(losses=("hard", "token_pos"))["student"]["token_loss"] == "ce"
    assert fingerprint(losses=("hard", "token_em"), token_loss="kl")["student"]["token_loss"] == "kl"
    # Without a token loss it changes nothing, so those work dirs still match.
    assert "token_loss" not in fingerprint(losses=("hard", "seq_ce"))["student"]
    assert "token_loss" not in student_fingerprint(DistilConfig())   # an XtremeDistil student
    # A student whose token loss was the KL before the flag existed (no token_loss recorded) is refused.
    work = WorkDir(tmp_path / "w")
    old = fingerprint(losses=("hard", "token_em"))
    del old["student"]["token_loss"]
    work.run_step("student", old, lambda tmp: {})
    with pytest.raises(ConfigError, match="another configuration.*token_loss"):
        work.is_done("student", fingerprint(losses=("hard", "token_em")))
    for kind in ("ce", "kl"):
        work.run_step(f"student-{kind}", fingerprint(losses=("hard", "token_em"), token_loss=kind), lambda tmp: {})
    with pytest.raises(ConfigError, match="token_loss"):
        work.is_done("student-kl", fingerprint(losses=("hard", "token_em")))
    assert work.is_done("student-ce", fingerprint(losses=("token_em", "hard")))


def test_config_and_data_errors(data):
    with pytest.raises(ConfigError, match="losses"):
        MultiGrainedConfig(("hard", "kl"))
    with pytest.raises(ConfigError, match="between 1 and 15"):
        MultiGrainedConfig(kbest=0)
    labeled_only = windows_dataset(data["dev_windows"])
    matrix = np.random.default_rng(0).normal(size=[100, 4]).astype(np.float32)
    student = build_bilstm_crf_student(100, len(VOCAB), embedding_dim=4, hidden=4, embeddings=matrix,
                                       freeze_embeddings=True)
    # TE: the teacher's matrix, copied and frozen.
    np.testing.assert_array_equal(student.get_layer("word_embedding").get_weights()[0], matrix)
    assert all("word_embedding" not in v.name for v in student.trainable_variables)
    with pytest.raises(ConfigError, match="kbest_tags"):
        train_multigrained(student, labeled_only, labeled_only, MultiGrainedConfig(("hard", "seq_ce")), VOCAB.pad_id)
    with pytest.raises(ConfigError, match="only 5 paths"):
        train_multigrained(student, read_sharded(data["cache"]), labeled_only, MultiGrainedConfig(kbest=7),
                           VOCAB.pad_id)


def test_a_checkpoint_of_the_loop_before_the_engine_is_refused_in_one_line(data, tmp_path):
    """The pre-engine loop saved {epochs, best_epoch, best_score, stale}; the engine cannot continue it
    (it would retrain from epoch 0 and then fail on the old history), so it says what to do instead."""
    student = _student(100, 0)
    old = EpochCheckpoint(tmp_path / "checkpoint")
    old.save({"student": student}, {"epochs": [{"epoch": 1, "train_loss": 1.0}], "best_epoch": 1, "best_score": 0.5,
                                    "stale": 0})
    labeled_only = windows_dataset(data["dev_windows"])
    with pytest.raises(ConfigError, match="from before it ran on the engine.*delete that dir"):
        train_multigrained(student, labeled_only, labeled_only, MultiGrainedConfig(("hard",)), VOCAB.pad_id,
                           checkpoint=EpochCheckpoint(tmp_path / "checkpoint"))


# A .keras and a SavedModel round trip of the trained CRF student: in the slow tier, and CI runs it (Makefile
# CI_SLOW_TESTS); tests/test_export_formats.py's CRF student dir is the default tier's saved CRF student.
@pytest.mark.slow
def test_saved_student_reloads_with_identical_viterbi(teacher, data, runs, tmp_path):
    rule, tokenizer = teacher
    student = runs[2]
    windows = encode(data["test"], tokenizer, VOCAB, MAX_LEN)
    expected = predict_tags_crf(student, windows)
    student.save(str(tmp_path / "student.keras"))
    reloaded = tf.keras.models.load_model(str(tmp_path / "student.keras"), compile=False)
    np.testing.assert_array_equal(predict_tags_crf(reloaded, windows), expected)
    # The SavedModel round trip: save_student writes one (model/) and load_student reads it back.
    save_student(tmp_path / "student", student, "bilstm", tokenizer, VOCAB, "IOB2", MAX_LEN, decoder="crf")
    assert json.loads((tmp_path / "student" / "student.json").read_text())["decoder"] == "crf"
    model, meta, _ = load_student(tmp_path / "student")
    assert meta.decoder == "crf"
    np.testing.assert_array_equal(predict_tags_crf(model, windows), expected)


def test_the_best_weights_slot_holds_the_uncertainty_weights_beside_the_students(tmp_path):
    """The engine's best-so-far slot (engine/resume.WeightsSlot) copies a multi-grained step's weights variable to
    variable, its uncertainty weights included (MultiGrainedStep.weight_variables, in get_weights' order): a later
    epoch's changes are undone by restore_into, and the slot is what a checkpoint of it holds."""
    config = MultiGrainedConfig(losses=("hard", "seq_ce"), weighting="uncertainty")
    step = mg.MultiGrainedStep(_student(30, 0), config, pad_id=0)
    assert len(step.weighting.weights) == 1 and step.weighting.weights[0].shape == (2,)   # one log variance a loss
    assert len(step.weight_variables()) == len(step.get_weights()) == len(step.student.weights) + 1
    best = step.get_weights()
    slot = WeightsSlot(step)
    step.set_weights([w + 1.5 for w in best])
    slot.restore_into(step)
    for got, want in zip(step.get_weights(), best, strict=True):
        np.testing.assert_array_equal(got, want)
    step.set_weights([w - 2.0 for w in best])
    slot.capture(step)
    step.set_weights(best)
    tf.train.Checkpoint(best=slot).write(str(tmp_path / "best"))
    other = WeightsSlot(step)
    tf.train.Checkpoint(best=other).read(str(tmp_path / "best")).assert_consumed()
    other.restore_into(step)
    assert [float(v) for v in step.weighting.get_weights()[0].ravel()] == [
        float(v) - 2.0 for v in best[len(step.student.weights)].ravel()]
    np.testing.assert_array_equal(step.student.get_weights()[0], best[0] - 2.0)
