"""The dual-training objective, its variants and the training loop (paper 3.4).

    L = CE_student + CE_teacher + alpha * L_projection

CE_student: the student's masked-LM cross-entropy on its own segmentation. CE_teacher: the teacher's,
on the dual segmentation, each masked word predicted in its own vocabulary. Both are means over masked
pieces. The teacher is trained too (its encoder at a lower rate: it is pretrained, while its MLM head,
the student-table up-projection and the student-vocabulary bias are new).

Variants (the paper's Table 2 rows):
    NoKD                      student MLM only (no teacher)
    DualTrain                 + teacher MLM on dual inputs, sharing the student's embeddings
    DualTrain+SharedProjDown  + alpha * down-projection loss (student space)
    DualTrain+SharedProjUp    + alpha * up-projection loss (teacher space)

Optimiser: AdamW from tf_keras (decoupled weight decay, no decay on LayerNorm/bias), warm-up then linear
decay. tf_keras 2.21 has no LAMB (it was in tensorflow-addons, end of life and broken on TF >= 2.16);
at a batch of 32 on CPU, LAMB's layer-wise trust ratio (meant for batches of 4096) buys nothing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from xtremedistil_tf.engine.loop import Engine, FitOptions, GroupsStep, replica_share
from xtremedistil_tf.engine.resume import EpochCheckpoint
from xtremedistil_tf.engine.schedules import warmup_adamw
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses.shared_projection import SharedProjections, pair_variables
from xtremedistil_tf.losses.xtremedistil import cross_entropy
from xtremedistil_tf.methods.subwords.dual import DualSentence, Specials, build_batch
from xtremedistil_tf.methods.subwords.models import DualTeacher, encoder_variables, gather_masked, mlm_logits, word_embeddings

VARIANTS: Dict[str, tuple] = {            # name -> (dual training, projection direction)
    "NoKD": (False, None),
    "DualTrain": (True, None),
    "DualTrain+SharedProjDown": (True, "down"),
    "DualTrain+SharedProjUp": (True, "up"),
}

STUDENT_KEYS = ("s_ids", "s_attn", "s_labels")
TEACHER_KEYS = ("t_ids", "t_is_student", "t_attn", "t_labels")


@dataclass
class DistilLMConfig:
    variant: str = "DualTrain+SharedProjUp"
    p: float = 0.5                   # probability that the teacher reads a word in the student segmentation
    alpha: float = 1.0               # weight of the projection loss
    mask_prob: float = 0.15          # words masked per sentence
    max_len: int = 64
    batch_size: int = 32
    steps: int = 300
    learning_rate: float = 1e-3      # student, projections and the teacher's new parts
    teacher_learning_rate: float = 5e-5
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    seed: int = 42

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant={self.variant!r}; expected one of {', '.join(VARIANTS)}")

    @property
    def dual(self) -> bool:
        return VARIANTS[self.variant][0]

    @property
    def projection(self) -> Optional[str]:
        return VARIANTS[self.variant][1]

    def as_dict(self) -> dict:
        return asdict(self)


class DualTrainer:
    """Owns the student, the dual teacher (None for NoKD), the projections and the optimisers; its
    `step` is the Keras model the engine fits (`train`). Built in the distribution strategy's scope
    when there is one, like the models."""

    def __init__(self, student, teacher: Optional[DualTeacher], cfg: DistilLMConfig, run_eagerly: bool = False):
        if cfg.dual and teacher is None:
            raise ValueError(f"variant {cfg.variant} needs a teacher")
        self.student, self.teacher, self.cfg = student, (teacher if cfg.dual else None), cfg
        self.projections = None
        if cfg.projection:
            s_layers = student.config.num_hidden_layers
            t_layers = teacher.teacher.config.num_hidden_layers
            pairs = pair_variables(encoder_variables(student), encoder_variables(teacher.teacher), s_layers, t_layers)
            self.projections = SharedProjections(pairs, cfg.projection, seed=cfg.seed)
        self.keys = STUDENT_KEYS + (TEACHER_KEYS if self.teacher is not None else ())
        # tests: tracing the step costs ~40 s, more than a few eager steps
        self.step = _DualStep(self, run_eagerly)
        spec = {k: tf.TensorSpec([None, None], tf.int32) for k in self.keys}
        self._update = self.update if run_eagerly else tf.function(self.update, input_signature=[spec])

    def _groups(self):
        cfg = self.cfg
        warmup = int(cfg.warmup_fraction * cfg.steps)
        fast = list(self.student.trainable_variables)
        if self.teacher is not None:
            fast += self.teacher.new_variables
        if self.projections is not None:
            fast += self.projections.matrices
        groups = [(warmup_adamw(cfg.learning_rate, cfg.steps, warmup, cfg.weight_decay), fast)]
        if self.teacher is not None:
            groups.append((warmup_adamw(cfg.teacher_learning_rate, cfg.steps, warmup, cfg.weight_decay),
                           encoder_variables(self.teacher.teacher)))
        return groups

    def losses(self, batch: Dict[str, tf.Tensor], training: bool = False) -> Dict[str, tf.Tensor]:
        """The objective's terms and their total (scalars)."""
        return self._terms(batch, training)[0]

    def _terms(self, batch, training: bool):
        """(the terms and their total, what each term averages over)."""
        out = self.student.bert(input_ids=batch["s_ids"], attention_mask=batch["s_attn"], training=training)
        hidden, labels = gather_masked(out.last_hidden_state, batch["s_labels"])
        counts = {"student": tf.cast(tf.size(labels), tf.float32)}
        terms = {"student": cross_entropy(mlm_logits(self.student, hidden), labels)}   # registry "mlm", Eq. 3
        if self.teacher is not None:
            loss, count, _ = self.teacher.masked_loss(batch, word_embeddings(self.student), training=training)
            counts["teacher"] = tf.cast(count, tf.float32)
            terms["teacher"] = loss / tf.maximum(counts["teacher"], 1.0)
        if self.projections is not None:
            terms["projection"] = self.projections.loss()
            counts["projection"] = tf.constant(1.0)  # no data: 1/R of it on each replica
        weights = {"projection": self.cfg.alpha}
        terms["total"] = tf.add_n([weights.get(k, 1.0) * v for k, v in terms.items()]) if len(terms) > 1 \
            else terms["student"]
        return terms, {k: (weights.get(k, 1.0), c) for k, c in counts.items()}

    def update(self, batch: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        """One optimisation step on one batch (each replica's terms weighted by their shares of the
        global batch); returns the batch's terms."""
        with tf.GradientTape() as tape:
            terms, counts = self._terms(batch, training=True)
            loss = tf.add_n([w * terms[k] * replica_share(c) for k, (w, c) in counts.items()])
        self.step.minimize(tape, loss)
        return terms

    def train_step(self, batch: Dict[str, np.ndarray]) -> Dict[str, float]:
        """`update` on one batch of arrays; the terms as floats."""
        return {k: float(v) for k, v in self._update({k: tf.constant(batch[k]) for k in self.keys}).items()}

    def objects(self) -> dict:
        """What a checkpoint holds (engine/resume.py)."""
        models = {"student": self.student, "teacher": self.teacher, "projections": self.projections}
        return {**{k: v for k, v in models.items() if v is not None}, **self.step.optimizers()}


class _DualStep(GroupsStep):
    """The dual-training step the engine fits: `DualTrainer.update`, and each term's epoch mean."""

    def __init__(self, trainer: DualTrainer, run_eagerly: bool):
        names = ["student"] + (["teacher"] if trainer.teacher is not None else []) + \
            (["projection"] if trainer.projections is not None else [])
        super().__init__((*names, "loss"), run_eagerly=run_eagerly)
        self.trainer = trainer
        self.use_groups(trainer._groups())

    def train_step(self, batch):
        terms = self.trainer.update(batch)
        terms["loss"] = terms.pop("total")
        return self.track(terms)


def batches(corpus: Sequence[DualSentence], cfg: DistilLMConfig, student_spec: Specials, teacher_spec: Specials,
            seed: Optional[int] = None):
    """Endless training batches: shuffled passes over `corpus` (the rest of a pass that cannot fill a
    batch is skipped), dual segmentation when cfg.dual; shuffling and masking drawn from `seed`
    (default cfg.seed)."""
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    while True:
        order = rng.permutation(len(corpus))
        for start in range(0, len(order) - cfg.batch_size + 1, cfg.batch_size):
            chosen = [corpus[i] for i in order[start:start + cfg.batch_size]]
            yield build_batch(chosen, rng, student_spec, teacher_spec, p=cfg.p, mask_prob=cfg.mask_prob,
                              max_len=cfg.max_len, train=True, with_teacher=cfg.dual)


def train(trainer: DualTrainer, corpus: Sequence[DualSentence], student_spec: Specials, teacher_spec: Specials,
          progress: bool = True, log_every: int = 50, checkpoint: Optional[EpochCheckpoint] = None,
          distribution: Optional[tf.distribute.Strategy] = None,
          callbacks: Sequence[tf.keras.callbacks.Callback] = ()) -> List[dict]:
    """cfg.steps optimisation steps on the engine, an engine epoch per `log_every` steps. An engine
    epoch is not a pass over `corpus`: its batches (and masks) are the start of a stream of its own,
    `batches(..., seed=epoch_seed(cfg.seed, epoch))`, `corpus` freshly shuffled, so sentences are
    drawn without repeats within an epoch (when `corpus` holds at least an epoch's sentences) but
    independently across epochs. Returns each epoch's mean
    loss terms with the step reached and the elapsed seconds. `checkpoint`: saved after every
    epoch, resumed from by a rerun; `distribution`: the strategy the models and `trainer` were
    built under (batches are global); `callbacks`: Keras callbacks of every epoch's fit."""
    cfg = trainer.cfg
    if len(corpus) < cfg.batch_size:  # `batches` would never yield one
        raise ConfigError(f"{len(corpus)} training sentences cannot fill one batch of {cfg.batch_size}: lower "
                          "--batch_size or give more text")
    spec = {k: tf.TensorSpec([None, None], tf.int32) for k in trainer.keys}

    def train_for(seed: int, epoch: int) -> tf.data.Dataset:
        steps = min(log_every, cfg.steps - epoch * log_every)
        source = batches(corpus, cfg, student_spec, teacher_spec, seed)
        return tf.data.Dataset.from_generator(lambda: ({k: b[k] for k in trainer.keys} for b in source),
                                              output_signature=spec).take(steps)

    models = [m for m in (trainer.student, trainer.teacher and trainer.teacher.teacher) if m is not None]
    engine = Engine(checkpoint, seed=cfg.seed, name=f"distil_lm {cfg.variant}", verbose=progress,
                    callbacks=callbacks, distribution=distribution)
    engine.fit(trainer.step, FitOptions(train_for, -(-cfg.steps // log_every), target=trainer.student,
                                        objects=trainer.objects(), reseed=models))
    history, seconds = [], 0.0
    for epoch, logs in enumerate(engine.epochs):
        seconds += logs.pop("seconds")
        history.append({"step": min((epoch + 1) * log_every, cfg.steps), "seconds": round(seconds, 1),
                        **{k: v for k, v in logs.items() if k != "loss"}, "total": logs["loss"]})
    return history


def eval_batches(corpus: Sequence[DualSentence], student_spec: Specials, teacher_spec: Specials,
                 mask_prob: float = 0.15, max_len: int = 64, batch_size: int = 64, seed: int = 0):
    """Fixed held-out batches: the same masked words for every model evaluated (all inputs [MASK])."""
    rng = np.random.default_rng(seed)
    return [build_batch(corpus[i:i + batch_size], rng, student_spec, teacher_spec, mask_prob=mask_prob,
                        max_len=max_len, train=False, with_teacher=False)
            for i in range(0, len(corpus), batch_size)]


def masked_word_accuracy(student, batches_: Sequence[Dict[str, np.ndarray]], compiled: bool = True) -> dict:
    """Accuracy of the student's masked-LM predictions on held-out batches.

    piece_accuracy: masked pieces predicted exactly; word_accuracy: masked words whose every piece is
    predicted exactly (the paper's masked word prediction, for words of several pieces)."""
    def predict(batch):
        out = student.bert(input_ids=batch["s_ids"], attention_mask=batch["s_attn"], training=False)
        hidden, labels, words = gather_masked(out.last_hidden_state, batch["s_labels"], batch["s_word"])
        return tf.argmax(mlm_logits(student, hidden), -1, output_type=tf.int32), labels, words

    if compiled:
        predict = tf.function(predict, input_signature=[
            {k: tf.TensorSpec([None, None], tf.int32) for k in STUDENT_KEYS + ("s_word",)}])

    pieces = correct = 0
    word_ok: Dict[tuple, bool] = {}
    for b, batch in enumerate(batches_):
        pred, labels, words = (t.numpy() for t in predict({k: tf.constant(batch[k]) for k in
                                                           STUDENT_KEYS + ("s_word",)}))
        hit = pred == labels
        pieces += len(hit)
        correct += int(hit.sum())
        for w, h in zip(words, hit):
            word_ok[(b, int(w))] = word_ok.get((b, int(w)), True) and bool(h)
    return {"piece_accuracy": correct / max(pieces, 1), "word_accuracy": sum(word_ok.values()) / max(len(word_ok), 1),
            "masked_pieces": pieces, "masked_words": len(word_ok)}
