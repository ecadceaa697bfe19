"""Strategies as data, the staged loop's order, best-weights restore, and a toy D4.2 distillation."""
import numpy as np
import pytest
import tensorflow as tf
from conftest import TOY_LABELS, toy_ner_sentences
from helpers import predict_tags

from xtremedistil_tf.data.alignment import TagVocab, decode, encode
from xtremedistil_tf.data.scoring import entity_scores
from xtremedistil_tf.engine.callbacks import BestSoFar
from xtremedistil_tf.engine.loop import Engine, FitOptions
from xtremedistil_tf.engine.resume import EpochCheckpoint, SharedStages
from xtremedistil_tf.errors import INTERRUPT, ConfigError
from xtremedistil_tf.methods.staged import DistilConfig, make_dev_f1, stages_key, train_student
from xtremedistil_tf.methods.strategies import STRATEGIES, get_strategy
from xtremedistil_tf.methods.student_run import teacher_labeled
from xtremedistil_tf.run.ablate import ALL_STRATEGIES
from xtremedistil_tf.students import build_bilstm_student, svd_reduce

TEACHER_HIDDEN = 16
EMBEDDING_DIM = 12
MAX_LEN = 16
NUM_TAGS = len(TOY_LABELS) + 4  # + X, [CLS], [SEP], [PAD]


def _teacher_outputs(windows, num_tags, seed):
    """A hand-made teacher that knows the toy rule: logits peak at the gold piece tag, and the
    hidden state is a fixed random code of the tag plus noise."""
    rng = np.random.default_rng(seed)
    code = np.random.default_rng(0).normal(size=(num_tags, TEACHER_HIDDEN)).astype(np.float32)
    onehot = np.eye(num_tags, dtype=np.float32)[windows.label_ids]
    logits = 6.0 * onehot - 3.0 + 0.3 * rng.normal(size=onehot.shape).astype(np.float32)
    hidden = onehot @ code + 0.1 * rng.normal(size=onehot.shape[:2] + (TEACHER_HIDDEN,)).astype(np.float32)
    return logits, hidden


def _dataset(windows, tag_vocab, seed, labeled=True, batch_size=32):
    logits, hidden = _teacher_outputs(windows, len(tag_vocab), seed)
    labels = windows.label_ids if labeled else np.full_like(windows.label_ids, tag_vocab.pad_id)
    data = {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask,
            "label_ids": labels, "logits": logits, "hidden": hidden}
    return tf.data.Dataset.from_tensor_slices(data).batch(batch_size)


@pytest.fixture(scope="module")
def toy(tiny_tokenizer):
    return toy_data(tiny_tokenizer)


def toy_data(tiny_tokenizer):
    tag_vocab = TagVocab(TOY_LABELS)
    splits = {name: toy_ner_sentences(n, seed=seed) for name, n, seed in
              (("train", 40, 11), ("transfer", 320, 12), ("dev", 60, 13), ("test", 80, 14))}
    windows = {name: encode(s, tiny_tokenizer, tag_vocab, MAX_LEN) for name, s in splits.items()}
    return {
        "tag_vocab": tag_vocab, "sentences": splits, "windows": windows,
        "vocab_size": len(tiny_tokenizer),
        "train": _dataset(windows["train"], tag_vocab, 1, batch_size=16),
        "transfer": _dataset(windows["transfer"], tag_vocab, 2, labeled=False),
        "dev": _dataset(windows["dev"], tag_vocab, 3),
        "teacher_embeddings": _teacher_word_embeddings(windows["transfer"], len(tiny_tokenizer), 2),
    }


def _teacher_word_embeddings(windows, vocab_size, seed):
    """The hand-made teacher's word-embedding matrix [V, H_T]: each piece's mean hidden state
    (random for pieces the transfer set never shows)."""
    _, hidden = _teacher_outputs(windows, NUM_TAGS, seed)
    matrix = np.random.default_rng(seed).normal(size=(vocab_size, TEACHER_HIDDEN)).astype(np.float32)
    real = windows.attention_mask == 1
    ids = windows.input_ids[real]
    for piece in np.unique(ids):
        matrix[piece] = hidden[real][ids == piece].mean(axis=0)
    return matrix


def _student(toy, seed=0, svd_init=True, **kwargs):
    tf.keras.utils.set_random_seed(seed)
    embeddings = svd_reduce(toy["teacher_embeddings"], EMBEDDING_DIM) if svd_init else None
    return build_bilstm_student(toy["vocab_size"], NUM_TAGS, embedding_dim=EMBEDDING_DIM, hidden=16,
                                teacher_hidden=TEACHER_HIDDEN, embeddings=embeddings, **kwargs)


def _config(toy, **overrides):
    # A larger learning rate than the paper's 1e-3 so that one epoch per step learns the toy task.
    return DistilConfig(pad_id=toy["tag_vocab"].pad_id, learning_rate=2e-2, run_eagerly=True, seed=0, **overrides)


# The paper's orders: Table 3 (stages and losses), Table 4 (D4.2 unfreezing, top-down).
BODY = ("projection", "bilstm", "word_embedding")
PAPER_ORDER = {
    "D0": [(1, ("softmax",) + BODY)],
    "D0-S": [(1, ("softmax",) + BODY)],
    "D1": [(1, ("softmax", "logits") + BODY)],
    "D2": [(1, ("softmax", "logits") + BODY)],
    "D3.1": [(1, BODY), (2, ("logits", "softmax") + BODY)],
    "D3.2": [(1, BODY), (2, ("logits", "softmax")), (2, ("projection",)), (2, ("bilstm",)),
             (2, ("word_embedding",))],
    "D4.1": [(1, BODY), (2, ("logits",) + BODY), (3, ("softmax",) + BODY)],
    "D4.2": [(1, BODY), (2, ("logits",)), (2, ("projection",)), (2, ("bilstm",)), (2, ("word_embedding",)),
             (3, ("softmax",)), (3, ("projection",)), (3, ("bilstm",)), (3, ("word_embedding",))],
}
PAPER_LOSSES = {
    "D0": [{("ce", "train")}], "D0-S": [{("ce", "train")}],
    "D1": [{("ce", "train"), ("logits", "transfer")}],
    "D2": [{("ce", "train"), ("logits", "transfer"), ("representation", "transfer")}],
    "D3.1": [{("representation", "transfer")}, {("ce", "train"), ("logits", "transfer")}],
    "D3.2": [{("representation", "transfer")}, {("ce", "train"), ("logits", "transfer")}],
    "D4.1": [{("representation", "transfer")}, {("logits", "transfer")}, {("ce", "train")}],
    "D4.2": [{("representation", "transfer")}, {("logits", "transfer")}, {("ce", "train")}],
}


def test_registry_matches_paper_tables():
    assert sorted(n for n, s in STRATEGIES.items() if s.paper) == sorted(PAPER_ORDER)
    for name, strategy in STRATEGIES.items():
        if not strategy.paper:
            continue
        steps = [(i, step) for i, stage in enumerate(strategy.stages, 1) for step in stage.unfreeze]
        assert steps == PAPER_ORDER[name], name
        losses = [{(t.loss, t.source) for t in stage.terms} for stage in strategy.stages]
        assert losses == PAPER_LOSSES[name], name
    assert STRATEGIES["D0"].per_language and not STRATEGIES["D0-S"].per_language
    d2 = STRATEGIES["D2"].stages[0]
    assert {t.loss: t.weight for t in d2.terms} == {"ce": "alpha", "representation": "beta", "logits": "gamma"}
    d42 = STRATEGIES["D4.2"].stages
    assert [s.eval_head for s in d42] == [None, "logits", "softmax"]


def test_d42_kd_is_d42_with_soft_targets_in_its_labels_stage():
    """Not in the paper: D4.2's stages and unfreezing, its last stage adding the teacher's soft targets on the same
    labeled windows as the gold labels; bin/ablate's default list stays Table 3's."""
    kd, d42 = STRATEGIES["D4.2-KD"], STRATEGIES["D4.2"]
    assert not kd.paper and "D4.2-KD" not in ALL_STRATEGIES and ALL_STRATEGIES[-1] == "D4.2"
    assert [s.unfreeze for s in kd.stages] == [s.unfreeze for s in d42.stages]
    assert kd.stages[:2] == d42.stages[:2]
    assert {(t.loss, t.source, t.weight) for t in kd.stages[2].terms} == {("ce", "train", 1.0), ("soft", "train", 1.0)}
    assert kd.stages[2].eval_head == "softmax" and kd.stages[2].sources == ("train",)


def test_unknown_strategy_names_the_choices():
    with pytest.raises(ValueError, match="D4.2"):
        get_strategy("D5")


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_toy_d42_run_follows_paper_order_and_beats_chance(toy):
    student = _student(toy)
    config = _config(toy, epochs_per_layer=1)
    dev_f1 = make_dev_f1(toy["windows"]["dev"], [s.tags for s in toy["sentences"]["dev"]], toy["tag_vocab"])
    history = train_student("D4.2", student, toy["train"], toy["transfer"], toy["dev"], config,
                            evaluate_fn=dev_f1)
    assert history.sequence() == PAPER_ORDER["D4.2"]
    # Restoring the best weights (starting weights included) means no step ends worse than it began.
    for step in history.steps:
        assert step.best_val_loss <= step.initial_val_loss
        assert step.best_val_loss == pytest.approx(min([step.initial_val_loss] + step.val_losses))
    assert [s.dev_f1 is None for s in history.steps] == [True] + [False] * 8
    assert history.steps[-1].dev_f1 > 0.8
    # Every layer is trainable again after the run.
    assert all(layer.trainable for layer in student.layers)

    test = toy["windows"]["test"]
    predicted = decode(test, predict_tags(student, test), toy["tag_vocab"])
    f1 = entity_scores([s.tags for s in toy["sentences"]["test"]], predicted)["f1"]
    assert f1 > 0.8  # chance (a random tag per word) is far below 0.2 here


class _SpoilLastEpoch(tf.keras.callbacks.Callback):
    """Records the weights after every epoch, and wrecks them at the start of the last one."""

    def __init__(self, epochs):
        super().__init__()
        self.epochs, self.snapshots, self.val_losses = epochs, [], []

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epochs - 1:
            rng = np.random.default_rng(0)
            self.model.set_weights([w + 5.0 * rng.normal(size=w.shape) for w in self.model.get_weights()])

    def on_epoch_end(self, epoch, logs=None):
        self.snapshots.append([w.copy() for w in self.model.get_weights()])
        self.val_losses.append(logs["val_loss"])


def test_loop_restores_best_epoch_after_a_worse_last_epoch(toy):
    student = _student(toy, seed=1)
    epochs = 3
    spoiler = _SpoilLastEpoch(epochs)
    config = _config(toy, epochs_per_layer=epochs, patience=None)
    history = train_student("D0-S", student, toy["train"], None, toy["dev"], config, callbacks=[spoiler])
    best = int(np.argmin(spoiler.val_losses))
    assert best < epochs - 1 and spoiler.val_losses[-1] > spoiler.val_losses[best]
    assert history.steps[0].best_epoch == best + 1
    for restored, expected in zip(student.get_weights(), spoiler.snapshots[best]):
        np.testing.assert_array_equal(restored, expected)


class _Counter(tf.keras.callbacks.Callback):
    """Epochs and batches trained, over every fit of a run."""

    def __init__(self):
        super().__init__()
        self.epochs = self.batches = 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_strategies_beginning_alike_train_their_shared_stage_once(toy, tmp_path):
    """D4.1 after D3.1 with one SharedStages starts from D3.1's representation stage and ends as a
    D4.1 that trained it itself; another key or other stages take nothing."""
    def run(strategy, name, shared=None):
        student = _student(toy, seed=4, dropout=0.0)   # no dropout: in-process runs repeat exactly
        counter = _Counter()
        history = train_student(strategy, student, toy["train"], toy["transfer"], toy["dev"],
                                _config(toy, epochs_per_layer=1), callbacks=[counter],
                                checkpoint=EpochCheckpoint(tmp_path / name), shared=shared)
        return student.get_weights(), history, counter.epochs

    shared = SharedStages(tmp_path / "shared", key={"student": "toy", "seed": 4})
    reference, reference_history, _ = run("D4.1", "reference")
    _, d31, d31_epochs = run("D3.1", "d31", shared)
    assert d31_epochs == 2 and len(list((tmp_path / "shared").iterdir())) == 1
    weights, history, epochs = run("D4.1", "d41", shared)
    assert epochs == 2   # stages 2 and 3 only: stage 1 came from D3.1
    assert history.steps[0] == d31.steps[0] and history.sequence() == reference_history.sequence()
    for got, want in zip(history.steps, reference_history.steps):
        np.testing.assert_allclose(got.val_losses, want.val_losses, rtol=1e-5)
    for got, want in zip(weights, reference):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # A run of another key (another seed, say) takes nothing; a prefix of other stages neither.
    prefix = stages_key(get_strategy("D3.1").stages[:1])
    other = EpochCheckpoint(tmp_path / "other")
    assert SharedStages(tmp_path / "shared", key={"student": "toy", "seed": 5}).take(other, [prefix]) == 0
    assert shared.take(other, [stages_key(get_strategy("D4.2").stages[:2])]) == 0 and other.latest() is None
    assert shared.take(other, [prefix]) == 1 and other.latest() is not None


def test_a_ctrl_c_whose_exception_was_lost_stops_training_at_the_next_batch(toy):
    """The commands' SIGINT handler also sets errors.INTERRUPT (Python drops a KeyboardInterrupt
    raised inside a __del__): the engine then stops after the batch it is on."""
    counter = _Counter()
    INTERRUPT.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            train_student("D0-S", _student(toy), toy["train"], None, toy["dev"], _config(toy, epochs_per_layer=2),
                          callbacks=[counter])
    finally:
        INTERRUPT.clear()
    assert counter.batches == 1


def test_best_so_far_patience_stops_and_keeps_starting_weights():
    start = [np.ones(3, np.float32)]
    tracker = BestSoFar(patience=2, baseline=-1.0, weights=start)  # nothing can beat it
    assert not tracker.update(0.5, lambda: [np.zeros(3, np.float32)])
    assert not tracker.stopped
    assert not tracker.update(float("nan"), lambda: [np.zeros(3, np.float32)])  # NaN never improves
    assert tracker.stopped and tracker.values[0] == 0.5 and tracker.best_epoch == 0
    assert tracker.best_weights is start
    # A checkpoint's copy (the state and the weights) carries on where it stopped.
    again = BestSoFar.from_state(tracker.state(), 2, start)
    assert again.stopped and again.best == -1.0 and again.best_epoch == 0 and again.best_weights is start
    improving = BestSoFar(patience=2)
    assert improving.update(0.5, lambda: "epoch 1") and improving.update(0.4, lambda: "epoch 2")
    assert not improving.update(0.45, lambda: "epoch 3")
    assert improving.best_epoch == 2 and improving.best_weights == "epoch 2" and improving.wait == 1


def test_joint_strategy_draws_both_sources_and_weights_terms(toy):
    student = _student(toy, seed=2)
    config = _config(toy, epochs_per_layer=1, alpha=1.0, gamma=0.0)
    history = train_student("D1", student, toy["train"], toy["transfer"], toy["dev"], config)
    assert history.sequence() == PAPER_ORDER["D1"]
    with pytest.raises(ValueError, match="transfer"):
        train_student("D1", student, toy["train"], None, toy["dev"], config)


def test_config_without_pad_id_is_refused_in_one_line(toy):
    config = _config(toy, epochs_per_layer=1)
    config.pad_id = None  # DistilConfig's default: student_run.distil_config sets it from the tag vocabulary
    with pytest.raises(ConfigError, match=r"^DistilConfig.pad_id is None; train_student expects the tag vocabulary's "
                                          r"\[PAD\] id"):
        train_student("D4.2", _student(toy), toy["train"], toy["transfer"], toy["dev"], config)


def test_dev_without_teacher_outputs_is_refused(toy):
    dev = toy["dev"].map(lambda b: {k: b[k] for k in ("input_ids", "attention_mask", "label_ids")})
    config = _config(toy, epochs_per_layer=1)
    with pytest.raises(ValueError, match="hidden"):
        train_student("D4.2", _student(toy), toy["train"], toy["transfer"], dev, config)


def _first_piece_teacher(toy, garbage: float):
    """toy's transfer set with a first-piece teacher's `teacher_mask`; the logits at the other
    pieces (continuation, [CLS], [SEP]: never trained) replaced by `garbage`."""
    windows = toy["windows"]["transfer"]
    first = (windows.word_index >= 0).astype(np.int32)
    logits, hidden = _teacher_outputs(windows, len(toy["tag_vocab"]), 2)
    logits = np.where(first[..., None] == 1, logits, np.float32(garbage))
    return {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask,
            "label_ids": np.full_like(windows.label_ids, toy["tag_vocab"].pad_id), "logits": logits,
            "hidden": hidden, "teacher_mask": first}


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_logit_loss_counts_only_what_a_first_piece_teacher_was_trained_on(toy, masked):
    """With the cache's teacher_mask, the teacher's logits at pieces it never learned do not move
    the student: garbage there trains the same weights; without the mask they would."""
    weights = []
    for garbage in (0.0, 1e3):
        data = _first_piece_teacher(toy, garbage)
        if not masked:
            del data["teacher_mask"]
        transfer = tf.data.Dataset.from_tensor_slices(data).batch(32)
        student = _student(toy, seed=4)
        train_student("D1", student, toy["train"], transfer, toy["dev"], _config(toy, epochs_per_layer=1))
        weights.append(student.get_weights())
    same = all(np.allclose(a, b, atol=1e-5) for a, b in zip(*weights))
    assert same == masked
    assert (toy["windows"]["transfer"].word_index < 0)[toy["windows"]["transfer"].attention_mask == 1].any()


def test_teacher_argmax_labels_skip_the_pieces_a_first_piece_teacher_never_learned(toy):
    data = _first_piece_teacher(toy, 0.0)
    pad = toy["tag_vocab"].pad_id
    example = next(iter(teacher_labeled(tf.data.Dataset.from_tensor_slices(data), pad, ("label_ids",))))
    first = data["teacher_mask"][0] == 1
    expected = np.where(first, np.argmax(data["logits"][0], axis=-1), pad)
    np.testing.assert_array_equal(example["label_ids"].numpy(), expected)
    assert (expected != pad).sum() == first.sum() > 0


def test_every_fit_gets_its_batches_with_the_autotuner_off_and_unchanged():
    """engine.loop.without_autotune: Keras deletes each epoch's iterator, and with tf.data's autotuner on the
    deletion waited for its optimisation pass (2-13 s per epoch); the engine turns it off for train and dev
    batches, which stay the same batches in the same order."""
    seen = []

    class Recording(tf.keras.Sequential):
        def fit(self, x=None, validation_data=None, **kwargs):
            seen.append((x, validation_data))
            return super().fit(x, validation_data=validation_data, **kwargs)

    model = Recording([tf.keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer="sgd", loss="mse")
    pairs = tf.data.Dataset.range(12).map(lambda i: (tf.fill([2], tf.cast(i, tf.float32)), tf.ones([1])),
                                          num_parallel_calls=tf.data.AUTOTUNE)
    train = pairs.shuffle(12, seed=3, reshuffle_each_iteration=False).batch(4)
    Engine(name="toy").fit(model, FitOptions(lambda seed, epoch: train, 2, dev=pairs.batch(5)))
    assert len(seen) == 2
    for given, dev in seen:
        assert not given.options().autotune.enabled and not dev.options().autotune.enabled
        assert [b[0].numpy().tolist() for b in given] == [b[0].numpy().tolist() for b in train]
        assert [b[0].numpy().tolist() for b in dev] == [b[0].numpy().tolist() for b in pairs.batch(5)]
    assert pairs.options().autotune.enabled is not False  # the caller's dataset is left as it was
