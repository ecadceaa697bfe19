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

import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from xtremedistil_tf.losses.shared_projection import SharedProjections, pair_variables
from xtremedistil_tf.losses.xtremedistil import cross_entropy
from xtremedistil_tf.subwords.dual import DualSentence, Specials, build_batch
from xtremedistil_tf.subwords.models import DualTeacher, encoder_variables, gather_masked, mlm_logits, word_embeddings
from xtremedistil_tf.teachers.finetune import warmup_adamw

VARIANTS: Dict[str, tuple] = {            # name -> (dual training, projection direction)
    "NoKD": (False, None),
    "DualTrain": (True, None),
    "DualTrain+SharedProjDown": (True, "down"),
    "DualTrain+SharedProjUp": (True, "up"),
}

STUDENT_KEYS = ("s_ids", "s_attn", "s_labels")
TEACHER_KEYS = ("t_ids", "t_is_student", "t_attn", "t_labels")


@dataclass
class DistillLMConfig:
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
    """Owns the student, the dual teacher (None for NoKD), the projections and the optimisers."""

    def __init__(self, student, teacher: Optional[DualTeacher], cfg: DistillLMConfig, run_eagerly: bool = False):
        if cfg.dual and teacher is None:
            raise ValueError(f"variant {cfg.variant} needs a teacher")
        self.student, self.teacher, self.cfg = student, (teacher if cfg.dual else None), cfg
        self.projections = None
        if cfg.projection:
            s_layers = student.config.num_hidden_layers
            t_layers = teacher.teacher.config.num_hidden_layers
            pairs = pair_variables(encoder_variables(student), encoder_variables(teacher.teacher), s_layers, t_layers)
            self.projections = SharedProjections(pairs, cfg.projection, seed=cfg.seed)
        self.groups = self._groups()
        self.variables = [v for _, vs in self.groups for v in vs]
        self._step = None
        self.run_eagerly = run_eagerly   # tests: tracing the step costs ~40 s, more than a few eager steps

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
        out = self.student.bert(input_ids=batch["s_ids"], attention_mask=batch["s_attn"], training=training)
        hidden, labels = gather_masked(out.last_hidden_state, batch["s_labels"])
        terms = {"student": cross_entropy(mlm_logits(self.student, hidden), labels)}   # registry "mlm", Eq. 3
        total = terms["student"]
        if self.teacher is not None:
            loss, count, _ = self.teacher.masked_loss(batch, word_embeddings(self.student), training=training)
            terms["teacher"] = loss / tf.maximum(tf.cast(count, tf.float32), 1.0)
            total += terms["teacher"]
        if self.projections is not None:
            terms["projection"] = self.projections.loss()
            total += self.cfg.alpha * terms["projection"]
        terms["total"] = total
        return terms

    def _make_step(self):
        keys = STUDENT_KEYS + (TEACHER_KEYS if self.teacher is not None else ())
        spec = {k: tf.TensorSpec([None, None], tf.int32) for k in keys}

        @tf.function(input_signature=[spec])
        def step(batch):
            with tf.GradientTape() as tape:
                terms = self.losses(batch, training=True)
            grads = tape.gradient(terms["total"], self.variables)
            i = 0
            for optimizer, variables in self.groups:
                pairs = [(g, v) for g, v in zip(grads[i:i + len(variables)], variables) if g is not None]
                optimizer.apply_gradients(pairs)
                i += len(variables)
            return terms
        return step.python_function if self.run_eagerly else step

    def train_step(self, batch: Dict[str, np.ndarray]) -> Dict[str, float]:
        if self._step is None:
            self._step = self._make_step()
        keys = STUDENT_KEYS + (TEACHER_KEYS if self.teacher is not None else ())
        terms = self._step({k: tf.constant(batch[k]) for k in keys})
        return {k: float(v) for k, v in terms.items()}


def batches(corpus: Sequence[DualSentence], cfg: DistillLMConfig, student_spec: Specials, teacher_spec: Specials):
    """Endless training batches: shuffled epochs over `corpus`, dual segmentation when cfg.dual."""
    rng = np.random.default_rng(cfg.seed)
    while True:
        order = rng.permutation(len(corpus))
        for start in range(0, len(order) - cfg.batch_size + 1, cfg.batch_size):
            chosen = [corpus[i] for i in order[start:start + cfg.batch_size]]
            yield build_batch(chosen, rng, student_spec, teacher_spec, p=cfg.p, mask_prob=cfg.mask_prob,
                              max_len=cfg.max_len, train=True, with_teacher=cfg.dual)


def train(trainer: DualTrainer, corpus: Sequence[DualSentence], student_spec: Specials, teacher_spec: Specials,
          progress: bool = True, log_every: int = 50) -> List[dict]:
    """cfg.steps optimisation steps with a progress bar; returns the loss terms every `log_every` steps
    (averaged over those steps) with the elapsed seconds."""
    from tqdm import tqdm

    cfg = trainer.cfg
    history, window = [], []
    start = time.time()
    source = batches(corpus, cfg, student_spec, teacher_spec)
    bar = tqdm(range(cfg.steps), desc=f"distil_lm {cfg.variant}", disable=not progress, dynamic_ncols=True)
    for step in bar:
        window.append(trainer.train_step(next(source)))
        if (step + 1) % log_every == 0 or step + 1 == cfg.steps:
            mean = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
            history.append({"step": step + 1, "seconds": round(time.time() - start, 1), **mean})
            bar.set_postfix({k: f"{v:.3f}" for k, v in mean.items()})
            window = []
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
