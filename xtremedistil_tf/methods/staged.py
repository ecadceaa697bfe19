"""The staged fit loop: runs any strategy of methods/strategies.py on a student.

For each stage, for each unfreeze step: freeze every layer, unfreeze the layers of this step and
of all earlier steps of the stage, compile a fresh Adam with cosine decay (1e-3 -> 1e-8 over the
step's epochs), train `epochs_per_layer` epochs with `model.fit`, and restore the weights with the
lowest dev loss (the step's starting weights included; dev, never test). Each step is recorded
(stage, unfrozen layers, dev losses, dev F1) for Table 4-style reports.

Data: batched tf.data datasets of dicts with `input_ids`, `attention_mask` [B, T] and the targets a
stage needs: `label_ids` [B, T] (CE), `logits` [B, T, N] (logit loss), `hidden` [B, T, H_T]
(representation loss). The dev set must carry the targets of every stage (teacher outputs on dev
included) because each step is selected by that stage's loss on dev. A joint stage over both
sources (D1, D2, D3.x stage 2) draws one transfer batch and one train batch per step; the transfer
set drives the epoch and the train set repeats.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf.decoding import DEFAULT_DECODE, WordDecoder
from xtremedistil_tf.data.alignment import CompiledPerStudent, Windows, predict_by_length
from xtremedistil_tf.data.scoring import entity_scores
from xtremedistil_tf.engine.distribute import scope_of
from xtremedistil_tf.engine.loop import Engine, FitOptions, replica_share
from xtremedistil_tf.engine.resume import DEFAULT_SEED, EpochCheckpoint, SharedStages
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses import registry
from xtremedistil_tf.losses.xtremedistil import DEFAULT_REPRESENTATION_LOSS, TEACHER_MASK
from xtremedistil_tf.methods.strategies import Stage, Strategy, get_strategy
from xtremedistil_tf.students.models import CASE_EMBEDDING, CASE_INPUT, StudentArch, encoder_layer_name, reads_case
from xtremedistil_tf.data.batching import group_by_length
from xtremedistil_tf.teachers.finetune import trim_to_longest
from xtremedistil_tf.transfer.cache import padded_batch

log = logging.getLogger(__name__)

INPUT_KEYS = ("input_ids", "attention_mask")
# An input of students that read word shapes (students.models.reads_case): in the batches when the data has it.
OPTIONAL_INPUT_KEYS = (CASE_INPUT,)
EvaluateFn = Callable[[tf.keras.Model, str], float]


@dataclass
class DistilConfig:
    """An XtremeDistil student: its architecture, what its heads read (students.models), the
    strategy and each step's schedule (Adam, cosine decay from `learning_rate` to
    `min_learning_rate` over `epochs_per_layer` epochs). `pad_id` (the TagVocab's [PAD] id: CE
    skips PAD-tagged pieces; `student_run.distil_config` sets it), `verbose` and `run_eagerly` say
    how a run executes, not what it makes (compare=False: left out of the fingerprint)."""

    method: str = field(default="xtremedistil", init=False)
    arch: StudentArch = field(default_factory=StudentArch)
    heads_on: str = "projection"     # one of students.models.HEADS_ON
    strategy: str = "D4.2"
    epochs_per_layer: int = 10
    patience: Optional[int] = 3
    batch_size: int = 512            # paper: 512
    learning_rate: float = 1e-3
    min_learning_rate: float = 1e-8
    alpha: float = 1.0  # Eq. 7 weights: CE, representation, logits
    beta: float = 1.0
    gamma: float = 1.0
    representation_loss: str = DEFAULT_REPRESENTATION_LOSS
    seed: int = DEFAULT_SEED  # epoch seeds (data order, dropout) derive from it: engine/resume.py
    # Unlabeled transfer sentences the transfer stages read: N evenly spaced ones of the cache (the
    # labeled ones always), bin/ablate --transfer_sizes; None: all (left out of the fingerprint then).
    transfer_sentences: Optional[int] = None
    # Training batches of similar length (data/batching.group_by_length: this many batches' windows sorted
    # at a time); 0: batches of randomly mixed lengths (left out of the fingerprint then).
    group_by_length: int = 0
    # Word dropout: each training batch's words (a word's first piece and its continuations) replaced whole by the
    # unknown piece, each with this probability, labeled and transfer windows alike (dev untouched), the teacher's
    # targets kept (student_run.WordDropout); 0: off (left out of the fingerprint then).
    word_dropout: float = 0.0
    pad_id: Optional[int] = field(default=None, compare=False)
    verbose: int = field(default=0, compare=False)
    # Every step compiles a fresh model, so graph tracing is paid per step; for tiny students on a
    # CPU (tests, smoke runs) eager execution is faster overall.
    run_eagerly: bool = field(default=False, compare=False)

    def weight(self, value) -> float:
        """A loss term's weight: a number, or the name of one of alpha/beta/gamma."""
        if isinstance(value, str):
            if value not in ("alpha", "beta", "gamma"):
                raise ConfigError(f"unknown loss weight {value!r}; use alpha, beta, gamma or a number")
            return float(getattr(self, value))
        return float(value)


@dataclass
class StepRecord:
    """One unfreeze step: what was trainable and how dev loss / F1 went."""

    stage: int  # 1-based
    stage_name: str
    unfrozen: Tuple[str, ...]  # layers that joined the trainable set at this step
    trainable: Tuple[str, ...]  # every trainable layer during this step
    initial_val_loss: float
    val_losses: List[float]
    best_epoch: Optional[int]  # 1-based; 0 when no epoch beat the starting weights
    best_val_loss: float
    dev_f1: Optional[float] = None


@dataclass
class StagedHistory:
    strategy: str
    steps: List[StepRecord] = field(default_factory=list)

    def sequence(self) -> List[Tuple[int, Tuple[str, ...]]]:
        """(stage, unfrozen layers) in the order the loop ran them."""
        return [(s.stage, s.unfrozen) for s in self.steps]

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "steps": [asdict(s) for s in self.steps]}


class _StageModel(tf.keras.Model):
    """Trains a student on one stage's weighted loss terms (custom train/test steps).

    Batches are {source: batch dict}; the student runs once per source. Every term's running mean
    is weighted by its counted positions, so `loss` on dev is the exact position-weighted mean of
    each term (not a mean of batch means), combined with the stage's weights.
    """

    def __init__(self, student: tf.keras.Model, terms: Sequence[tuple], pad_id: int):
        super().__init__()
        # A view that also exposes the softmax head's pre-softmax scores, for a stable CE.
        outputs = dict(student.output)
        outputs["scores"] = student.get_layer("softmax").output
        self.view = tf.keras.Model(student.input, outputs)
        self.terms = list(terms)  # (name, registry.Loss, source, weight)
        self.pad_id = pad_id
        self.trackers = {name: tf.keras.metrics.Mean(name=name) for name, *_ in self.terms}

    @property
    def metrics(self):
        return list(self.trackers.values())

    def _update(self, data, training: bool):
        outs = {src: self.view({k: batch[k] for k in self.view.input}, training=training)
                for src, batch in data.items()}
        total = 0.0
        for name, loss, source, weight in self.terms:
            batch = data[source]
            mask = self._mask(batch, loss, outs[source][loss.prediction[0]])
            value = loss(outs[source], batch, mask)
            count = loss.count(mask)
            self.trackers[name].update_state(value, sample_weight=count)
            total += weight * (value * replica_share(count) if training else value)
        return total

    def _mask(self, batch, loss, output):
        """The loss's counted positions (registry): real tokens (every row for sentence outputs),
        labeled ones for CE, for token logits those the teacher was trained on (`teacher_mask`)."""
        attention = batch["attention_mask"] if output.shape.rank == 3 \
            else tf.ones_like(batch["attention_mask"][:, 0])
        return loss.mask({**batch, "attention_mask": attention}, self.pad_id)

    def _results(self):
        results = {name: self.trackers[name].result() for name, *_ in self.terms}
        results["loss"] = tf.add_n([w * results[name] for name, *_, w in self.terms])
        return results

    def train_step(self, data):
        with tf.GradientTape() as tape:
            loss = self._update(data, training=True)
        # minimize scales and unscales the loss when compile wrapped the optimizer in a
        # LossScaleOptimizer (it does under mixed_float16: engine/precision.py).
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return self._results()

    def test_step(self, data):
        self._update(data, training=False)
        return self._results()


def batched(ds: tf.data.Dataset, batch_size: int, shuffle_buffer: int = 0, seed: int = 0,
            reshuffle: bool = True, padding: Optional[Dict] = None, group: int = 0) -> tf.data.Dataset:
    """Per-example dicts -> shuffled (when `shuffle_buffer` > 0; reshuffled at every iteration when
    `reshuffle`, else always in the order `seed` gives) batches (paper: 512), each padded to its longest
    window (the cache stores windows at their real length) with `padding`'s value per key (default 0;
    the cache's `padding_values`); with `group`, of windows of similar length (`group_by_length`).
    Padding columns no row of a stage's keys uses are dropped later."""
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=reshuffle)
    if group:
        return group_by_length(ds, batch_size, group, seed=seed, reshuffle=reshuffle, padding=padding)
    return padded_batch(ds, batch_size, padding)


def _resolve_terms(stage: Stage, config: DistilConfig) -> List[tuple]:
    return [(f"{term.loss}_{term.source}", registry.get(term.loss, config.representation_loss), term.source,
             config.weight(term.weight)) for term in stage.terms]


def _needed_keys(stage: Stage, source: Optional[str] = None) -> List[str]:
    keys = list(INPUT_KEYS)
    for term in stage.terms:
        target, = registry.get(term.loss).target
        if (source is None or term.source == source) and target not in keys:
            keys.append(target)
    return keys


def _select(ds: tf.data.Dataset, keys: Sequence[str], what: str, stage: Stage) -> tf.data.Dataset:
    have = set(ds.element_spec)
    missing = [k for k in keys if k not in have]
    if missing:
        raise ConfigError(f"stage '{stage.name}' needs {missing} in the {what} set, which has "
                          f"{sorted(have)} (the dev set needs teacher outputs for distillation stages)")
    if "logits" in keys and TEACHER_MASK in have:
        keys = [*keys, TEACHER_MASK]
    keys = [*keys, *(k for k in OPTIONAL_INPUT_KEYS if k in have and k not in keys)]
    # Sentence-level targets ([B] classes, [B, C] logits, [B, H] states) have no time axis to trim.
    time_keys = (*INPUT_KEYS, *OPTIONAL_INPUT_KEYS) if _sentence_level(ds) else None

    def select_and_trim(batch):
        return trim_to_longest({k: batch[k] for k in keys}, time_keys)

    return ds.map(select_and_trim)


def _sentence_level(ds: tf.data.Dataset) -> bool:
    """Whether the batches carry one label per text ([B]) rather than per piece ([B, T])."""
    spec = ds.element_spec
    return "label_ids" in spec and spec["label_ids"].shape.rank < spec["input_ids"].shape.rank


def _for_epoch(source, seed: int):
    """An epoch's batches: `source(seed)` for a per-epoch source (see `train_student`), else the
    dataset itself."""
    return source(seed) if callable(source) else source


def _train_data(stage: Stage, sources: Dict[str, object], seed: int = 0) -> tf.data.Dataset:
    """One epoch of a stage's batches of {source: batch}."""
    parts = {}
    for src in stage.sources:
        if sources[src] is None:
            raise ConfigError(f"stage '{stage.name}' trains on the {src} set, but none was given")
        parts[src] = _select(_for_epoch(sources[src], seed), _needed_keys(stage, src), src, stage)
    if len(parts) == 1:
        (src, ds), = parts.items()
        train = ds.map(lambda b: {src: b})
    else:
        train = tf.data.Dataset.zip((parts["transfer"], parts["train"].repeat())).map(
            lambda t, l: {"transfer": t, "train": l})
    return train.prefetch(tf.data.AUTOTUNE)


def _dev_data(stage: Stage, dev_ds: tf.data.Dataset) -> tf.data.Dataset:
    """The dev batches of a stage, as {source: batch} for each of its sources."""
    dev = _select(dev_ds, _needed_keys(stage), "dev", stage)
    return dev.map(lambda b: {src: b for src in stage.sources}).prefetch(tf.data.AUTOTUNE)


def _count_batches(ds: tf.data.Dataset) -> int:
    n = int(ds.cardinality())
    if n >= 0:
        return n
    return int(ds.reduce(np.int64(0), lambda count, _: count + 1))


def _set_trainable(student: tf.keras.Model, names: Sequence[str]) -> None:
    student.trainable = True
    for layer in student.layers:
        layer.trainable = layer.name in names


def _resolve_layers(step: Sequence[str], student: tf.keras.Model) -> Tuple[str, ...]:
    """Strategy layer names -> the student's (`bilstm` means its sequence layer)."""
    body = encoder_layer_name(student)
    have = {layer.name for layer in student.layers}
    # A student's word-shape embedding trains with its word embeddings.
    also = {"bilstm": (body,), "word_embedding": ("word_embedding", CASE_EMBEDDING)}
    names = tuple(n for name in step for n in also.get(name, (name,)) if n in have or n == name)
    missing = [n for n in names if n not in have]
    if missing:
        raise ConfigError(f"student {student.name} has no layer(s) {missing} named by the schedule")
    return names


def _optimizer(config: DistilConfig, total_steps: int):
    schedule = tf.keras.optimizers.schedules.CosineDecay(
        config.learning_rate, decay_steps=max(1, total_steps),
        alpha=config.min_learning_rate / config.learning_rate)
    return tf.keras.optimizers.Adam(learning_rate=schedule)


def _step_model(student, terms, config, batches, trainable, distribution=None):
    """The student wrapped for one unfreeze step, compiled with a fresh optimizer (built, so that a
    checkpoint's slots can be restored into it). Under a distribution strategy the wrapper, its
    metrics and the optimizer are made in the strategy's scope."""
    _set_trainable(student, trainable)
    with scope_of(distribution):
        model = _StageModel(student, terms, config.pad_id)
        model.compile(optimizer=_optimizer(config, batches * config.epochs_per_layer),
                      run_eagerly=config.run_eagerly)
        model.optimizer.build(model.trainable_variables)
    return model


def train_student(strategy_name: str, student: tf.keras.Model, train_ds, transfer_ds, dev_ds: tf.data.Dataset,
                  config: DistilConfig, callbacks: Sequence[tf.keras.callbacks.Callback] = (),
                  evaluate_fn: Optional[EvaluateFn] = None, checkpoint: Optional[EpochCheckpoint] = None,
                  distribution: Optional[tf.distribute.Strategy] = None,
                  shared: Optional[SharedStages] = None) -> StagedHistory:
    """Run a registered strategy on `student` in place; returns the per-step record.

    `train_ds`, `transfer_ds`: batched datasets, or per-epoch sources `seed -> dataset` (e.g.
    `student_run.staged_sources`) whose order is a function of the epoch's seed
    (`engine.epoch_seed(config.seed, stage, step, epoch)`): what makes a resumed run repeat the
    uninterrupted one exactly. Each unfreeze step is one `Engine.fit`. `checkpoint`: saved after
    every epoch and every finished step; a run given a checkpoint dir that holds one continues
    from it (engine/resume.py).
    `evaluate_fn(student, head)` (e.g. `make_dev_f1(...)`) gives dev F1 after each step of a stage
    that has a tagger (`head` is "softmax" or "logits"). Layers frozen on entry (e.g. teacher
    embeddings built with freeze_embeddings=True) stay frozen, and a step that would unfreeze only
    those is skipped. On return every other layer is trainable again. `distribution`: a
    tf.distribute strategy the student was built under (engine/distribute.py); batches are global.
    `shared` (with a `checkpoint`): a fresh run starts after the longest prefix of its stages that an
    earlier run with the same `shared` key kept, and keeps its own prefixes for later runs.
    """
    strategy: Strategy = get_strategy(strategy_name)
    if config.pad_id is None:
        raise ConfigError("DistilConfig.pad_id is None; train_student expects the tag vocabulary's [PAD] id, the label "
                          "its losses skip: DistilConfig(pad_id=tag_vocab.pad_id) (student_run.distil_config sets it)")
    prefixes = [stages_key(strategy.stages[:k]) for k in range(len(strategy.stages) - 1, 0, -1)]
    taken = shared.take(checkpoint, prefixes) if shared is not None and checkpoint is not None else 0
    if taken:
        which = "stage 1 continues" if taken == 1 else f"stages 1-{taken} continue"
        log.info("[student] %s: %s (%s) from an earlier student with the same settings and stages (%s)",
                 strategy.name, which, ", ".join(stage.name for stage in strategy.stages[:taken]), shared.directory)
    engine = Engine(checkpoint, seed=config.seed, verbose=bool(config.verbose), callbacks=callbacks,
                    distribution=distribution)
    entry_frozen = {layer.name for layer in student.layers if layer.weights and not layer.trainable}
    history = StagedHistory(strategy.name)
    if engine.position:
        history.steps = [_record(r) for r in engine.position["history"]]
    sources = {"train": train_ds, "transfer": transfer_ds}

    def state() -> dict:
        return {"history": [asdict(s) for s in history.steps]}

    try:
        run = 0  # unfreeze steps run so far, over all stages
        for stage_index, stage in enumerate(strategy.stages, start=1):
            terms = _resolve_terms(stage, config)
            batches = None
            trainable: List[str] = []
            for step_index, step in enumerate(stage.unfreeze):
                new = [n for n in _resolve_layers(step, student) if n not in entry_frozen]
                if not new:
                    continue
                trainable += new
                run += 1
                if run <= len(history.steps):
                    continue  # finished before the run was killed
                if batches is None:
                    batches = _count_batches(_train_data(stage, sources))
                model = _step_model(student, terms, config, batches, trainable, distribution)
                context = (f"{strategy.name} stage {stage_index}/{len(strategy.stages)} ({stage.name}) step "
                           f"{step_index + 1}/{len(stage.unfreeze)} +{'+'.join(new)}")
                tracker = engine.fit(model, FitOptions(
                    lambda seed, _: _train_data(stage, sources, seed), config.epochs_per_layer, target=student,
                    dev=_dev_data(stage, dev_ds), patience=config.patience,
                    objects={"student": student, "optimizer": model.optimizer}, state=state(),
                    where=(stage_index, step_index), context=context))
                f1 = evaluate_fn(student, stage.eval_head) if evaluate_fn and stage.eval_head else None
                history.steps.append(StepRecord(
                    stage_index, stage.name, tuple(new), tuple(trainable), tracker.baseline, tracker.values,
                    tracker.best_epoch, tracker.best, f1))
                engine.save({"student": student}, state())
                log.info("[student] %s: dev loss %.4g -> %.4g (best epoch %s)%s", context, tracker.baseline,
                         tracker.best, tracker.best_epoch, "" if f1 is None else f", dev F1 {100 * f1:.2f}")
            if shared is not None and batches is not None and stage_index < len(strategy.stages):
                shared.keep(engine.checkpoint, stages_key(strategy.stages[:stage_index]))
        engine.restore({"student": student})  # every step had finished: the checkpoint holds the final student
    finally:
        _set_trainable(student, [layer.name for layer in student.layers if layer.name not in entry_frozen])
    return history


def stages_key(stages: Sequence[Stage]) -> list:
    """What a prefix of stages trains, for SharedStages: each stage's name, loss terms and steps."""
    return [asdict(stage) for stage in stages]


def _record(data: dict) -> StepRecord:
    """A StepRecord read back from a checkpoint's position (JSON lists back to tuples)."""
    return StepRecord(**{**data, "unfrozen": tuple(data["unfrozen"]), "trainable": tuple(data["trainable"])})


HEAD_OUTPUTS = {"softmax": "probs", "logits": "logits"}


def head_argmax_fn(student: tf.keras.Model, head: str = "softmax"):
    """A compiled {"input_ids", "attention_mask"} [B, T] -> argmax over the last axis of the
    `softmax` (probs) or `logits` head: tags [B, T] of a tagger, classes [B] of a classifier."""
    key = HEAD_OUTPUTS.get(head)
    if key is None:
        raise ConfigError(f"head must be 'softmax' or 'logits', got {head!r}")
    return tf.function(lambda batch: tf.argmax(student(batch, training=False)[key], axis=-1, output_type=tf.int32),
                       input_signature=[_input_signature(student)])


def _input_signature(student: tf.keras.Model) -> dict:
    """{"input_ids", "attention_mask"} [B, T] int32 specs, and "case_ids" for a student that reads them."""
    spec = tf.TensorSpec([None, None], tf.int32)
    keys = (*INPUT_KEYS, CASE_INPUT) if reads_case(student) else INPUT_KEYS
    return {key: spec for key in keys}


def head_probs_fn(student: tf.keras.Model, head: str = "softmax"):
    """A compiled {"input_ids", "attention_mask"} [B, T] -> tag probabilities [B, T, tags] float32 of
    the `softmax` head (probs) or of the `logits` regressor (through a softmax)."""
    if head not in HEAD_OUTPUTS:
        raise ConfigError(f"head must be 'softmax' or 'logits', got {head!r}")

    def probs(batch):
        out = student(batch, training=False)
        return tf.cast(out["probs"] if head == "softmax" else tf.nn.softmax(out["logits"]), tf.float32)

    return tf.function(probs, input_signature=[_input_signature(student)])


def make_dev_f1(windows: Windows, gold_tags: Sequence[Sequence[str]], tag_vocab, scheme: str = "IOB2",
                batch_size: int = 64, decode: str = DEFAULT_DECODE) -> EvaluateFn:
    """An `evaluate_fn` for `train_student`: entity F1 on dev words of a student's head, its word tags
    decoded as the saved student's are (crf.decoding.WordDecoder, `decode`: constrained by default),
    so the F1 after a strategy's last step is the student's dev F1 in the pipeline's scores."""
    probs_fns = CompiledPerStudent(head_probs_fn)
    decoder = WordDecoder(tag_vocab.tags, tag_vocab.labels, scheme, decode)

    def dev_f1(student: tf.keras.Model, head: str) -> float:
        probs = predict_by_length(windows, probs_fns(student, head), batch_size, case=reads_case(student))
        return entity_scores(gold_tags, decoder.decode_windows(windows, probs)[0], scheme)["f1"]

    return dev_f1
