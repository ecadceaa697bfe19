"""Fine-tuning a token-classification teacher: AdamW, warm-up then linear decay, optional
layer-wise learning-rate decay, early stopping on dev entity F1 with best-weights restore."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf.decoding import WordDecoder
from xtremedistil_tf.data.alignment import Windows, encode, predict_by_length
from xtremedistil_tf.data.batching import group_by_length
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.data.scoring import tag_scores
from xtremedistil_tf.engine.distribute import scope_of
from xtremedistil_tf.engine.loop import Engine, FitOptions, GroupsStep, apply_gradients, replica_share
from xtremedistil_tf.engine.resume import DEFAULT_SEED, EpochCheckpoint
from xtremedistil_tf.engine.schedules import warmup_adamw
from xtremedistil_tf.engine.tensorboard import ScalarLog, current_learning_rate
from xtremedistil_tf.losses import registry


_LAYER_RE = re.compile(r"layer_\._(\d+)/")


# How a fresh head's kernel starts: Glorot uniform (Keras' default) or BERT's truncated normal
# with the encoder's initializer_range (0.02).
HEAD_INITS = ("glorot", "bert")
# What a token teacher is trained on: the first piece of each word (the word's label), or every
# real piece with continuation pieces as X and the [CLS]/[SEP] markers (the papers' 11 tags).
SUPERVISIONS = ("first_piece", "all_pieces")


@dataclass
class FinetuneConfig:
    """The teacher's fine-tuning recipe. The defaults are the measured best on WikiAnn en with
    all-MiniLM-L6-v2 at 1 and 3 epochs (docs/benchmarks.md, "Teacher recipe"); `recipe_for`
    gives the CRF head its own defaults (the multi-grained paper's)."""
    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 5e-5
    # The freshly initialised head learns far faster than the pretrained encoder can: at the
    # encoder's rate it barely moves in one epoch (issue 15: 70.2 against 78.9 test F1).
    # None means the encoder's rate.
    head_learning_rate: Optional[float] = 1e-3
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    # Multiply the rate by this per layer going down from the top (0.9 in the multi-grained
    # paper); 1.0 turns layer-wise decay off.
    layer_decay: float = 1.0
    head_init: str = "glorot"
    # first_piece: the loss reads each word's first piece only, as the reference loop and most
    # hub checkpoints do (+1.47 test F1 over the papers' all_pieces on WikiAnn en at 1 epoch,
    # docs/benchmarks.md "Teacher recipe"); its cache marks those pieces, and the student's logit
    # loss counts only them (transfer/outputs.py). all_pieces also trains X, [CLS] and [SEP].
    supervision: str = "first_piece"
    patience: int = 2
    seed: int = DEFAULT_SEED
    max_steps_per_epoch: Optional[int] = None
    # Batches of windows of similar length (data/batching.group_by_length: this many batches' windows
    # sorted at a time); 0: batches of randomly mixed lengths.
    group_by_length: int = 0
    progress: bool = True
    # > 0: each batch's gradient from micro-batches of this many windows, one after another (TeacherStep): the same
    # update (up to dropout masks and rounding) holding one micro-batch's activations, what bounds a base-sized
    # teacher's memory (docs/benchmarks.md 5.2). An execution setting: no part of the teacher step's fingerprint.
    micro_batch_size: int = 0

    def __post_init__(self):
        if self.head_init not in HEAD_INITS:
            raise ConfigError(f"head_init={self.head_init!r}; expected one of {', '.join(HEAD_INITS)}")
        if self.supervision not in SUPERVISIONS:
            raise ConfigError(f"supervision={self.supervision!r}; expected one of {', '.join(SUPERVISIONS)}")

    def to_dict(self) -> dict:
        return asdict(self)


# The multi-grained paper's teacher (Sec. 5.2, Table 6): layer-wise decay 0.9 going down, the
# logits and the CRF at 1e-3; a CRF scores whole tag sequences, so it trains on every piece.
CRF_RECIPE = {"head_learning_rate": 1e-3, "layer_decay": 0.9, "supervision": "all_pieces"}


def recipe_for(head: str, **explicit) -> FinetuneConfig:
    """The recipe of a teacher head (softmax or crf): FinetuneConfig's defaults, the CRF's own
    (CRF_RECIPE) for a CRF head, then the `explicit` settings (None values are left to the
    defaults). A CRF head cannot be trained on first pieces only (its NLL needs a tag at every
    piece): asking for it is a ConfigError."""
    explicit = {k: v for k, v in explicit.items() if v is not None}
    if head == "crf":
        if explicit.get("supervision", "all_pieces") != "all_pieces":
            raise ConfigError(f"--teacher_supervision={explicit['supervision']} cannot train a CRF head: its "
                              "sequence NLL needs a tag at every piece; use all_pieces (the default for crf)")
        return FinetuneConfig(**{**CRF_RECIPE, **explicit})
    return FinetuneConfig(**explicit)


@dataclass
class FinetuneResult:
    history: List[Dict] = field(default_factory=list)
    best_epoch: int = -1
    best_dev_f1: float = -1.0


def trim_to_longest(batch: Dict[str, tf.Tensor], keys: Optional[Sequence[str]] = None) -> Dict[str, tf.Tensor]:
    """Drop the padding columns no row of the batch uses (sentences are mostly far shorter
    than max_seq_length, so this is most of the compute).

    `keys`: the [B, T, ...] entries to cut; by default every entry of rank >= 2 (per-sentence
    entries such as a class id [B] stay whole)."""
    length = tf.reduce_max(tf.reduce_sum(batch["attention_mask"], axis=1))
    length = tf.maximum(length, 1)
    if keys is None:
        keys = [k for k, v in batch.items() if v.shape.rank >= 2]
    return {k: v[:, :length] if k in keys else v for k, v in batch.items()}


def windows_dataset(windows: Windows, batch_size: int, shuffle: bool, seed: int = 0,
                    reshuffle: bool = True, group: int = 0) -> tf.data.Dataset:
    return arrays_dataset({"input_ids": windows.input_ids, "attention_mask": windows.attention_mask,
                           "label_ids": windows.label_ids}, batch_size, shuffle, seed, reshuffle, group)


def arrays_dataset(data: Dict[str, np.ndarray], batch_size: int, shuffle: bool, seed: int = 0,
                   reshuffle: bool = True, group: int = 0) -> tf.data.Dataset:
    """Batches of `data` (arrays with one row per example), trimmed to each batch's longest row;
    shuffled anew at every iteration (`reshuffle`), or always in the order `seed` gives; with `group`,
    batches of rows of similar length (data/batching.group_by_length)."""
    ds = tf.data.Dataset.from_tensor_slices(data)
    n = len(next(iter(data.values())))
    if shuffle:
        ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=reshuffle)
    batches = group_by_length(ds, batch_size, group, seed, reshuffle) if group else ds.batch(batch_size)
    return batches.map(trim_to_longest).prefetch(tf.data.AUTOTUNE)


def supervised_windows(windows: Windows, tag_vocab, supervision: str) -> Windows:
    """`windows` with the labels the teacher trains on: all of them (`all_pieces`), or only each
    word's first piece (`first_piece`: X, [CLS] and [SEP] become [PAD], which the loss skips)."""
    if supervision == "all_pieces":
        return windows
    labels = np.where(windows.label_ids < len(tag_vocab.labels), windows.label_ids, tag_vocab.pad_id)
    return dataclasses.replace(windows, label_ids=labels.astype(windows.label_ids.dtype))


def layer_depth(variable_name: str, num_layers: int) -> int:
    """Depth below the top of a variable: 0 for the head and the last encoder layer, L for
    the embeddings. Variables of unknown place (e.g. a pooler) count as top."""
    match = _LAYER_RE.search(variable_name)
    if match:
        return num_layers - 1 - int(match.group(1))
    if "embeddings" in variable_name:
        return num_layers
    return 0


def parameter_groups(teacher, config: FinetuneConfig, total_steps: int):
    """(optimizer, variables) pairs: one AdamW per learning rate.

    Layer-wise decay needs one optimizer per depth because Adam's update is invariant to a
    rescaled gradient; scaling the gradients would change nothing.
    """
    warmup = int(config.warmup_fraction * total_steps)
    head_vars = teacher.head_variables
    head_ids = {id(v) for v in head_vars}
    by_depth: Dict[int, list] = {}
    for v in teacher.encoder.trainable_variables:
        # The pooler feeds nothing a token head uses, so it gets no gradient.
        if id(v) not in head_ids and "pooler" not in v.name:
            by_depth.setdefault(layer_depth(v.name, teacher.num_layers), []).append(v)
    groups = []
    for depth, variables in sorted(by_depth.items()):
        groups.append((warmup_adamw(config.learning_rate * config.layer_decay ** depth, total_steps, warmup,
                              config.weight_decay), variables))
    head_lr = config.head_learning_rate or config.learning_rate
    groups.append((warmup_adamw(head_lr, total_steps, warmup, config.weight_decay), head_vars))
    return groups


class TeacherStep(GroupsStep):
    """The fine-tuning step of any teacher head, on its own loss (`teacher.loss`), one optimizer per
    group (`engine.apply_groups`: under mixed_float16 one dynamic loss scale serves every group).
    Under a tf.distribute strategy each replica weights its loss by its share of the global batch's
    count (`loss_count`), so the summed gradients are the single-device update of the global batch."""

    def __init__(self, teacher, groups, micro_batch_size: int = 0):
        super().__init__(("loss",))
        self.teacher = teacher
        self.micro_batch_size = micro_batch_size
        self.use_groups(groups)
        # The micro-batches' summed gradients, added in place (a loop variable would hold two sums at once). Not
        # tracked by a checkpoint (the engine saves the model and the optimizers); per replica under a strategy.
        self._sums = [tf.Variable(tf.zeros_like(v), trainable=False, name="gradient_sum",
                                  synchronization=tf.VariableSynchronization.ON_READ,
                                  aggregation=tf.VariableAggregation.SUM)
                      for _, group in groups for v in group] if micro_batch_size else []

    def update(self, batch):
        if self.micro_batch_size:
            return self._update_in_parts(batch)
        with tf.GradientTape() as tape:
            loss = self.teacher.loss(batch, training=True)
            if tf.distribute.has_strategy():
                loss_ = loss * replica_share(loss_count(self.teacher, batch))
            else:
                loss_ = loss
        self.minimize(tape, loss_)
        return loss

    def _update_in_parts(self, batch):
        """The same update from micro-batches of `micro_batch_size` rows, one after another (a while loop of one
        iteration at a time), their gradients summed: only one micro-batch's activations are held at once. Each
        part's loss (a mean over its count) is weighted by its share of the batch's count, so the sum is the
        batch's gradient; only dropout masks and float rounding differ."""
        variables = [v for _, group in self.groups for v in group]
        count = tf.cast(loss_count(self.teacher, batch), tf.float32)
        share = tf.cast(replica_share(count), tf.float32) if tf.distribute.has_strategy() else 1.0
        rows = tf.shape(batch["input_ids"])[0]
        size = self.micro_batch_size

        def part(i, loss_sum):
            piece = {k: v[i * size:(i + 1) * size] for k, v in batch.items()}
            with tf.GradientTape() as tape:
                weight = tf.cast(loss_count(self.teacher, piece), tf.float32) / tf.maximum(count, 1.0)
                loss = tf.cast(self.teacher.loss(piece, training=True), tf.float32) * weight
                scaled = self.scaler.get_scaled_loss(loss * share) if self.scaler else loss * share
            for index, (total, g) in enumerate(zip(self._sums, tape.gradient(scaled, variables))):
                if g is None:
                    untouched.add(index)   # known when the body is traced: no part gives it a gradient
                else:
                    total.assign_add(tf.convert_to_tensor(g))
            return i + 1, loss_sum + loss

        untouched = set()
        for total in self._sums:
            total.assign(tf.zeros_like(total))
        _, loss = tf.while_loop(lambda i, _: i * size < rows, part, (tf.constant(0), tf.constant(0.0)),
                                parallel_iterations=1)
        # As in one pass: a variable without a gradient is left alone (no zero gradient for AdamW to decay it by).
        apply_gradients([None if index in untouched else total.read_value() for index, total in enumerate(self._sums)],
                        self.groups, self.scaler)
        return loss

    def train_step(self, batch):
        return self.track({"loss": self.update(batch)})


def make_train_step(teacher, groups, micro_batch_size: int = 0):
    """`TeacherStep.update` as one compiled function of a token batch (input_ids, attention_mask and
    label_ids, all [B, T]); `.loss_scaler` is the LossScaleOptimizer (None without loss scaling)."""
    spec = tf.TensorSpec([None, None], tf.int32)
    step = TeacherStep(teacher, groups, micro_batch_size)
    train_step = tf.function(step.update, input_signature=[
        {"input_ids": spec, "attention_mask": spec, "label_ids": spec}])
    train_step.loss_scaler = step.scaler
    return train_step


def loss_count(teacher, batch) -> tf.Tensor:
    """What `teacher.loss(batch)` averages over: labeled pieces (token head), labeled windows (CRF
    head), labeled texts (sentence classes, label_ids [B]). A replica's share of the global
    batch's count weights its loss under a distribution strategy."""
    entry = registry.get(teacher.LOSS)
    return entry.count(entry.mask(batch, teacher.tag_vocab.pad_id))


def predict_piece_tags(teacher, windows: Windows, batch_size: int = 64) -> np.ndarray:
    """Predicted tag id per piece (argmax, or Viterbi for a CRF teacher), [W, L].
    Windows are batched by length to skip padding."""
    return predict_by_length(windows, teacher.predict_tags_fn(), batch_size)


def word_label_probs(teacher, windows: Windows, batch_size: int = 64) -> Tuple[np.ndarray, np.ndarray]:
    """From one forward pass of a softmax token teacher over `windows`: the softmax over the word labels at
    every piece, marker columns 0 ([W, L, tags] float32, what crf.decoding.WordDecoder reads), and the
    teacher's own tag ids ([W, L], `predict_piece_tags`'s)."""
    labels, tags = len(teacher.tag_vocab.labels), len(teacher.tag_vocab)
    spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[{"input_ids": spec, "attention_mask": spec}])
    def probs_and_tags(batch):
        logits, own = teacher.logits_and_tags(batch)
        probs = tf.pad(tf.nn.softmax(tf.cast(logits[..., :labels], tf.float32)), [[0, 0], [0, 0], [0, tags - labels]])
        return tf.concat([probs, tf.cast(own, tf.float32)[..., None]], -1)  # the tag id rides in one more column

    out = predict_by_length(windows, probs_and_tags, batch_size)
    return out[..., :-1], out[..., -1].astype(np.int32)


def teacher_word_tags_by_decode(teacher, windows: Windows, scheme: str, decodes: Sequence[Optional[str]],
                                batch_size: int = 64) -> Dict[Optional[str], List[List[str]]]:
    """{decode: each sentence's word tags} for each of `decodes` (`teacher_word_tags`'s `decode`), from one
    forward pass over `windows`."""
    decodes = list(dict.fromkeys(decodes))
    if hasattr(teacher, "crf"):
        for decode in decodes:
            if decode not in (None, "constrained"):
                raise ConfigError(f"--decode={decode}: a CRF teacher decodes with its CRF's Viterbi; --decode=argmax "
                                  "is for softmax taggers")
        tags = teacher.decode_words(windows, predict_piece_tags(teacher, windows, batch_size))
        return {decode: tags for decode in decodes}
    decoders = {d: WordDecoder(teacher.tag_vocab.tags, teacher.tag_vocab.labels, scheme, d)
                for d in decodes if d is not None}
    if not decoders:
        return {None: teacher.decode_words(windows, predict_piece_tags(teacher, windows, batch_size))}
    probs, own = word_label_probs(teacher, windows, batch_size)
    return {d: teacher.decode_words(windows, own) if d is None else decoders[d].decode_windows(windows, probs)[0]
            for d in decodes}


def teacher_word_tags(teacher, windows: Windows, scheme: str, decode: Optional[str] = None,
                      batch_size: int = 64) -> List[List[str]]:
    """Each sentence's word tags from a token teacher. `decode` None: the teacher's own decoding
    (argmax over the word labels at each word's first piece; a CRF head's Viterbi; a checkpoint's
    argmax column through its label map). "constrained" / "argmax": decoded as a softmax student is
    (crf.decoding.WordDecoder over the softmax of the word labels' logits), so a teacher and its
    students can be scored with one decoder; a CRF head decodes with its own Viterbi only."""
    return teacher_word_tags_by_decode(teacher, windows, scheme, [decode], batch_size)[decode]


def evaluate_teacher_by_decode(teacher, tokenizer, sentences: Sequence[Sentence], scheme: str,
                               decodes: Sequence[Optional[str]], batch_size: int = 64,
                               seen=None) -> Dict[Optional[str], Dict]:
    """{decode: entity scores of the teacher's word-level predictions on labeled sentences} for each of
    `decodes` (`teacher_word_tags`), from one forward pass; `seen` (scoring.train_entities): also on seen and
    unseen names (scoring.tag_scores)."""
    windows = encode(sentences, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    return {decode: tag_scores(sentences, predicted, scheme, seen)
            for decode, predicted in teacher_word_tags_by_decode(teacher, windows, scheme, decodes, batch_size).items()}


def evaluate_teacher(teacher, tokenizer, sentences: Sequence[Sentence], scheme: str,
                     batch_size: int = 64, decode: Optional[str] = None, seen=None) -> Dict:
    """Entity scores of the teacher's word-level predictions on labeled sentences (`decode`:
    `teacher_word_tags`; `seen`: `evaluate_teacher_by_decode`)."""
    return evaluate_teacher_by_decode(teacher, tokenizer, sentences, scheme, [decode], batch_size, seen)[decode]


def finetune(teacher, tokenizer, train: Sequence[Sentence], dev: Sequence[Sentence], scheme: str,
             config: FinetuneConfig, log_dir: Optional[str] = None, checkpoint: Optional[EpochCheckpoint] = None,
             distribution: Optional[tf.distribute.Strategy] = None,
             callbacks: Sequence[tf.keras.callbacks.Callback] = ()) -> FinetuneResult:
    """Train the teacher; after each epoch score dev, keep the best weights, stop after
    `patience` epochs without improvement, and leave the best weights in the teacher.
    Each epoch's order is a function of the seed and the epoch (exact resume from `checkpoint`)."""
    if config.supervision != "all_pieces" and hasattr(teacher, "crf"):
        raise ConfigError(f"supervision={config.supervision} cannot train a CRF head (recipe_for('crf') gives its recipe)")
    tf.keras.utils.set_random_seed(config.seed)
    windows = supervised_windows(encode(train, tokenizer, teacher.tag_vocab, teacher.max_seq_length),
                                 teacher.tag_vocab, config.supervision)

    def dataset(seed: int) -> tf.data.Dataset:
        return windows_dataset(windows, config.batch_size, shuffle=True, seed=seed, reshuffle=False,
                               group=config.group_by_length)

    return train_with_early_stopping(teacher, dataset, len(windows),
                                     lambda: evaluate_teacher(teacher, tokenizer, dev, scheme)["all"]["f1"], config,
                                     log_dir=log_dir, checkpoint=checkpoint, distribution=distribution,
                                     callbacks=callbacks)


def train_with_early_stopping(teacher, dataset, num_examples: int, dev_f1: Callable[[], float],
                              config: FinetuneConfig, log_dir: Optional[str] = None,
                              checkpoint: Optional[EpochCheckpoint] = None,
                              distribution: Optional[tf.distribute.Strategy] = None,
                              callbacks: Sequence[tf.keras.callbacks.Callback] = ()) -> FinetuneResult:
    """The fine-tuning loop of any teacher head, on the engine (engine/loop.py): epochs over
    `dataset` (batches of the teacher's inputs and label_ids; or a function `seed -> batches` giving each
    epoch's order from `engine.epoch_seed(config.seed, epoch)`), `dev_f1()` after each, best
    weights kept, `patience` epochs without gain stop it. `log_dir`: TensorBoard scalars (train
    loss, dev F1, learning rates) per epoch. `checkpoint`: saved after every epoch (teacher, every
    optimizer, the loss scale, best weights, history); a run whose checkpoint dir holds one
    continues after it. `distribution`: a tf.distribute strategy the teacher was built under;
    batches are global. `callbacks`: Keras callbacks of every epoch's fit (of the step model)."""
    steps = -(-num_examples // config.batch_size)
    if config.max_steps_per_epoch:
        steps = min(steps, config.max_steps_per_epoch)
    with scope_of(distribution):
        groups = parameter_groups(teacher, config, steps * config.epochs)
        step = TeacherStep(teacher, groups, config.micro_batch_size)
    scalars = ScalarLog(log_dir)

    def write_scalars(epoch: int, record: dict) -> None:
        # groups: one per encoder depth from the top (0), then the head.
        scalars.write(epoch, {"train_loss": record["loss"], "dev_f1": record["dev_f1"],
                              "learning_rate/top_layer": current_learning_rate(groups[0][0]),
                              "learning_rate/head": current_learning_rate(groups[-1][0])})

    engine = Engine(checkpoint, seed=config.seed, name="teacher", verbose=config.progress, callbacks=callbacks,
                    distribution=distribution)
    tracker = engine.fit(step, FitOptions(
        lambda seed, _: (dataset(seed) if callable(dataset) else dataset).take(steps), config.epochs, target=teacher,
        score=dev_f1, baseline=False, patience=config.patience, objects={"teacher": teacher, **step.optimizers()},
        after_epoch=write_scalars))
    history = [{"epoch": epoch, "train_loss": record["loss"], "dev_f1": record["dev_f1"]}
               for epoch, record in enumerate(engine.epochs, start=1)]
    return FinetuneResult(history, tracker.best_epoch or -1, -tracker.best if tracker.best_epoch else -1.0)
