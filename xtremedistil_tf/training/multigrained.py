"""Multi-grained distillation of a CRF teacher into a CRF student (Zhou et al., NAACL 2021).

One training stream of per-example dicts (`input_ids`, `attention_mask` [T] and the targets the
enabled losses need):
- the labeled windows alone (`label_ids` [T]): the vanilla BiLSTM+CRF with losses=("hard",);
- the teacher-output cache of `teachers/multigrained_outputs.py` (`label_ids`, `logits` [T, N],
  `kbest_tags` [K, T], `kbest_probs` [K], `kbest_valid` [K], `marginals` [T, N]) over the labeled
  windows, plus unlabeled ones for DA (their `label_ids` are [PAD] tags).

Losses (`losses/sequence.py`, looked up in `losses/registry.py`), by name:
    hard       L_hard (Eq. 7): CRF NLL of the gold tags of labeled windows and of the teacher's
               top-1 path of unlabeled ones (the paper's "Top-1 sequence as hard label"); without
               surrogates in the stream, unlabeled windows are skipped
    seq_ce     L_Seq-ce (Eq. 4-5), k-best CE with the residual term
    seq_fuzzy  L_Seq-fuzzy (Eq. 6)
    token_em   L_Token-em (Eq. 10 on the emissions)
    token_pos  L_Token-pos (Eq. 10 on the CRF marginals)
               both Eq. 10's cross-entropy, or the KL with token_loss="kl" (losses/sequence.py)
combined by `layers.uncertainty.loss_weighting(config.weighting, n)` (Eq. 9), whose lambdas are
trained with the student by the same optimizer. Early stopping on dev F1 (Viterbi, `make_crf_dev_f1`)
or, without an evaluate_fn, on the dev NLL of the gold tags; the best epoch's weights (student and
lambdas) are restored.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from xtremedistil_tf.console import epoch_line
from xtremedistil_tf.data.alignment import CompiledPerStudent, TagVocab, Windows, decode, predict_by_length
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.evaluate import entity_scores
from xtremedistil_tf.layers.uncertainty import LOSS_WEIGHTINGS, loss_weighting
from xtremedistil_tf.losses import registry, sequence
from xtremedistil_tf.losses.sequence import hard_targets
from xtremedistil_tf.students.models import StudentArch
from xtremedistil_tf.teachers.multigrained_outputs import check_kbest
from xtremedistil_tf.engine.distribute import scope_of, shard_by_data
from xtremedistil_tf.engine.loop import check_finite_loss, replica_share
from xtremedistil_tf.engine.precision import with_loss_scaling
from xtremedistil_tf.engine.resume import EpochCheckpoint, WeightsSlot, epoch_seed, reseed_epoch
from xtremedistil_tf.engine.tensorboard import ScalarLog, current_learning_rate

log = logging.getLogger(__name__)

LOSSES = registry.names(registry.MULTI_GRAINED)
TOKEN_LEVEL = tuple(name for name in LOSSES if registry.variants(name))   # the losses `token_loss` (ce | kl) shapes
INPUT_KEYS = ("input_ids", "attention_mask")
# The time axis of each key of a batch, for trimming the padding no row of a batch uses.
TIME_AXIS = {"input_ids": 1, "attention_mask": 1, "label_ids": 1, "logits": 1, "marginals": 1, "kbest_tags": 2}

EvaluateFn = Callable[[tf.keras.Model], float]


@dataclass
class MultiGrainedConfig:
    """A multi-grained student (paper grid, Table 6: batch {16..128}, lr {1e-3, 5e-4}): its
    architecture, loss terms (default the paper's SEQ, Eq. 8), their weighting, the token losses'
    form, K of the k-best surrogates, whether unlabeled transfer windows join (DA; student_run),
    and the schedule. `run_eagerly`, `progress` and `log_dir` say how a run executes, not what it
    makes (compare=False: left out of the fingerprint)."""

    losses: Tuple[str, ...] = ("hard", "seq_ce", "seq_fuzzy")
    weighting: str = "uncertainty"   # uncertainty | equal
    token_loss: str = sequence.DEFAULT_TOKEN_LOSS   # ce (Eq. 10) | kl, of token_em and token_pos
    kbest: int = 5                   # K of the k-best surrogates used (<= the cache's K)
    epochs: int = 30
    batch_size: int = 32
    learning_rate: float = 1e-3
    patience: Optional[int] = 5      # epochs without a better dev score; None: never stop early
    seed: int = 42
    clipnorm: Optional[float] = 5.0  # global gradient norm clip (LSTMs on a CRF NLL spike early)
    shuffle_buffer: int = 50_000
    use_unlabeled: bool = True
    arch: StudentArch = field(default_factory=StudentArch)
    method: str = field(default="multigrained", init=False)
    # Tracing the step (BiLSTM + CRF scans + their gradients) costs tens of seconds on a CPU; for
    # tiny students (tests, smoke runs) running eagerly is faster overall.
    run_eagerly: bool = field(default=False, compare=False)
    progress: bool = field(default=False, compare=False)        # a progress bar per epoch
    log_dir: Optional[str] = field(default=None, compare=False)  # TensorBoard scalars per epoch (engine/tensorboard.py)

    def __post_init__(self):
        self.losses = tuple(self.losses)
        unknown = [name for name in self.losses if name not in LOSSES]
        if unknown or not self.losses or len(set(self.losses)) != len(self.losses):
            raise ConfigError(f"losses {self.losses} must be distinct names from {LOSSES}")
        if self.weighting not in LOSS_WEIGHTINGS:
            raise ConfigError(f"weighting {self.weighting!r}; expected one of {tuple(LOSS_WEIGHTINGS)}")
        self.kbest = check_kbest(self.kbest)
        sequence.check_token_loss(self.token_loss)


@dataclass
class MultiGrainedHistory:
    """Per epoch: train loss (weighted total), each loss's mean, the lambdas, dev loss / F1."""

    losses: Tuple[str, ...]
    epochs: List[Dict] = field(default_factory=list)
    best_epoch: int = 0  # 1-based; 0 = the starting weights were never beaten
    best_score: float = -math.inf  # dev F1, or minus the dev loss

    def lambdas(self) -> np.ndarray:
        """[epochs, num_losses] learned weights, one row per epoch."""
        return np.array([[e["lambdas"][name] for name in self.losses] for e in self.epochs])

    def to_dict(self) -> dict:
        return asdict(self)


def _loss_values(names, outputs, batch, transitions, pad_id: int, token_loss: str) -> List[tf.Tensor]:
    """One scalar per enabled loss, in `names` order, for a trimmed batch and the student's outputs.
    L_hard learns the gold tags of labeled rows and the teacher's top-1 path of unlabeled ones when
    the batch has surrogates, and only the labeled rows otherwise (registry.rows_with_target)."""
    outputs = {**outputs, "transitions": transitions}
    if "kbest_tags" in batch:
        batch = {**batch, "label_ids": hard_targets(batch["label_ids"], batch["attention_mask"], batch["kbest_tags"],
                                                    pad_id)}
    losses = [registry.get(name, token_loss) for name in names]
    return [loss(outputs, batch, loss.mask(batch, pad_id)) for loss in losses]


def _needed_keys(losses: Sequence[str], have: Sequence[str]) -> List[str]:
    keys = list(INPUT_KEYS)
    for name in losses:
        keys += [k for k in registry.get(name).target if k not in keys]
    if "hard" in losses and "kbest_tags" in have and "kbest_tags" not in keys:
        keys.append("kbest_tags")
    missing = [k for k in keys if k not in have]
    if missing:
        raise ConfigError(f"losses {tuple(losses)} need {missing} in the training set, which has {sorted(have)} "
                          "(sequence and token losses need the multi-grained teacher-output cache)")
    return keys


def _trim(batch: Dict[str, tf.Tensor], kbest: int) -> Dict[str, tf.Tensor]:
    """Drop padding columns no row uses (at least 2: CRF scans need a step) and k-best slots past
    `kbest` (the first k of a K-best list are the k-best list)."""
    length = tf.maximum(tf.reduce_max(tf.reduce_sum(tf.cast(batch["attention_mask"], tf.int32), axis=1)), 2)
    out = {}
    for key, value in batch.items():
        if key in ("kbest_tags", "kbest_probs", "kbest_valid"):
            value = value[:, :kbest]
        axis = TIME_AXIS.get(key)
        out[key] = value if axis is None else tf.gather(value, tf.range(length), axis=axis)
    return out


def _stream(ds: tf.data.Dataset, keys: Sequence[str], config: MultiGrainedConfig, shuffle: bool,
            seed: Optional[int] = None):
    """Per-example dicts -> trimmed batches of `keys`; shuffled in the order `seed` fixes (one
    epoch's order, engine/resume.py), or reshuffled at every iteration from `config.seed`."""
    ds = ds.map(lambda ex: {k: ex[k] for k in keys})
    if shuffle:
        ds = ds.shuffle(config.shuffle_buffer, seed=config.seed if seed is None else seed,
                        reshuffle_each_iteration=seed is None)
    return ds.batch(config.batch_size).map(lambda b: _trim(b, config.kbest)).prefetch(tf.data.AUTOTUNE)


def _relaxed(element_spec: Dict[str, tf.TensorSpec]) -> Dict[str, tf.TensorSpec]:
    """The batch signature with unknown batch and time dims, so one trace serves every batch."""
    specs = {}
    for key, spec in element_spec.items():
        shape = spec.shape.as_list()
        shape[0] = None
        if key in TIME_AXIS:
            shape[TIME_AXIS[key]] = None
        specs[key] = tf.TensorSpec(shape, spec.dtype)
    return specs


def _check_kbest(ds: tf.data.Dataset, config: MultiGrainedConfig) -> None:
    cached = ds.element_spec.get("kbest_tags")
    if cached is not None and cached.shape[0] is not None and cached.shape[0] < config.kbest:
        raise ConfigError(f"kbest={config.kbest} but the teacher-output cache holds only {cached.shape[0]} "
                          "paths per window; rebuild it with a larger --kbest")


def _loss_counts(names, batch, pad_id: int) -> tf.Tensor:
    """[num_losses] what each loss of `_loss_values` averages over in this batch (the registry's
    count: rows for the sequence losses, real positions for the token losses). A replica's share of
    the global batch's count weights its loss (`_Steps`)."""
    return tf.stack([loss.count(loss.mask(batch, pad_id)) for loss in map(registry.get, names)])


class _Steps:
    """The compiled train and dev steps of one run (the student, its weighting layer, Adam).

    Under a tf.distribute strategy each replica trains on its slice of the global batch: its loss
    terms are weighted by its share of what each term averages over (`_loss_counts`, summed over
    replicas), and the weighting's regulariser counts once over all replicas, so the gradients the
    optimizer sums over replicas are the single-device gradients of the global batch."""

    def __init__(self, student, weighting, config: MultiGrainedConfig, pad_id: int, train_spec, distribution=None):
        self.student, self.weighting, self.config, self.pad_id = student, weighting, config, pad_id
        self.distribution = distribution
        self.crf = student.get_layer("crf")
        self.variables = student.trainable_variables + weighting.trainable_variables
        with scope_of(distribution):
            self.optimizer = with_loss_scaling(tf.keras.optimizers.Adam(config.learning_rate,
                                                                        global_clipnorm=config.clipnorm))
            # Slots exist before a checkpoint is restored into them (engine/resume.py).
            getattr(self.optimizer, "inner_optimizer", self.optimizer).build(self.variables)
        dev_spec = {k: tf.TensorSpec([None, None], tf.int32) for k in (*INPUT_KEYS, "label_ids")}
        if distribution is not None:
            self.train = tf.function(self._distributed_train)
            self.dev_nll = tf.function(self._dev_nll, input_signature=[dev_spec])
        elif config.run_eagerly:
            self.train, self.dev_nll = self._train, self._dev_nll
        else:
            self.train = tf.function(self._train, input_signature=[train_spec])
            self.dev_nll = tf.function(self._dev_nll, input_signature=[dev_spec])

    def _train(self, batch):
        with tf.GradientTape() as tape:
            outputs = self.student({k: batch[k] for k in INPUT_KEYS}, training=True)
            values = tf.stack(_loss_values(self.config.losses, outputs, batch, self.crf.transitions, self.pad_id,
                                           self.config.token_loss))
            total = self.weighting(values)
        self.optimizer.minimize(total, self.variables, tape=tape)
        return total, values

    def _replica_train(self, batch):
        context = tf.distribute.get_replica_context()
        share = replica_share(_loss_counts(self.config.losses, batch, self.pad_id))
        replicas = float(context.num_replicas_in_sync)
        with tf.GradientTape() as tape:
            outputs = self.student({k: batch[k] for k in INPUT_KEYS}, training=True)
            values = tf.stack(_loss_values(self.config.losses, outputs, batch, self.crf.transitions,
                                           self.pad_id, self.config.token_loss)) * share
            # The weighting is linear in the losses plus a regulariser (weighting of zeros):
            # keep 1/R of the regulariser per replica.
            total = self.weighting(values) - (1.0 - 1.0 / replicas) * self.weighting(tf.zeros_like(values))
        self.optimizer.minimize(total, self.variables, tape=tape)
        return total, values

    def _distributed_train(self, batch):
        """One global batch (a distributed dataset's element): (total, loss values) of the batch."""
        total, values = self.distribution.run(self._replica_train, args=(batch,))
        reduce = self.distribution.reduce
        return (reduce(tf.distribute.ReduceOp.SUM, total, axis=None),
                reduce(tf.distribute.ReduceOp.SUM, values, axis=None))

    def _dev_nll(self, batch):
        """(sum of gold NLLs over the labeled rows, their count)."""
        outputs = self.student({k: batch[k] for k in INPUT_KEYS}, training=False)
        hard = registry.get("hard")
        mask = hard.mask(batch, self.pad_id)
        count = hard.count(mask)
        return hard({**outputs, "transitions": self.crf.transitions}, batch, mask) * count, count


def _dev_loss(steps: _Steps, dev: Optional[tf.data.Dataset]) -> Optional[float]:
    if dev is None:
        return None
    total, count = 0.0, 0.0
    for batch in dev:
        nll, n = steps.dev_nll({k: tf.cast(batch[k], tf.int32) for k in (*INPUT_KEYS, "label_ids")})
        total, count = total + float(nll), count + float(n)
    return total / count if count else None


def _run_epoch(steps: _Steps, train: tf.data.Dataset, names, epoch: int) -> Tuple[float, Dict[str, float]]:
    totals, values = [], []
    batches = int(train.cardinality()) if isinstance(train, tf.data.Dataset) else -1  # -1: unknown, distributed
    bar = tqdm(train, total=batches if batches >= 0 else None, unit="batch", disable=not steps.config.progress,
               desc=f"student epoch {epoch}/{steps.config.epochs}")
    for batch in bar:
        total, per_loss = steps.train(batch)
        totals.append(float(total))
        values.append(per_loss.numpy())
        bar.set_postfix(loss=f"{np.mean(totals[-50:]):.4f}")
    means = np.mean(values, axis=0)
    return float(np.mean(totals)), {name: float(v) for name, v in zip(names, means)}


def train_multigrained(student: tf.keras.Model, train_ds: tf.data.Dataset, dev_ds: Optional[tf.data.Dataset],
                       config: MultiGrainedConfig, pad_id: int, evaluate_fn: Optional[EvaluateFn] = None,
                       checkpoint: Optional[EpochCheckpoint] = None,
                       distribution: Optional[tf.distribute.Strategy] = None) -> MultiGrainedHistory:
    """Train a CRF student (`students/crf_student.py`) in place; returns the per-epoch history.

    train_ds: per-example dicts (see the module docstring), shuffled and batched here, each epoch
    in the order `resume.epoch_seed(config.seed, epoch)` gives.
    dev_ds: per-example dicts with gold `label_ids` (None: select on `evaluate_fn` alone).
    pad_id: the TagVocab's [PAD] id (marks unlabeled windows). evaluate_fn(student) -> dev F1
    selects the epoch when given (e.g. `make_crf_dev_f1`); otherwise the dev NLL does.
    checkpoint: saved after every epoch (student, lambdas, Adam, best weights, the history); a run
    whose checkpoint dir holds one continues after its last epoch (engine/resume.py).
    distribution: a tf.distribute strategy the student was built under; batches are global.
    """
    if evaluate_fn is None and dev_ds is None:
        raise ConfigError("train_multigrained needs a dev set or an evaluate_fn to select the best epoch")
    checkpoint = checkpoint or EpochCheckpoint(None)
    tf.keras.utils.set_random_seed(config.seed)
    _check_kbest(train_ds, config)
    keys = _needed_keys(config.losses, list(train_ds.element_spec))

    def train_for(epoch: int):
        seed = epoch_seed(config.seed, epoch)
        reseed_epoch([student], seed)
        batches = _stream(train_ds, keys, config, shuffle=True, seed=seed)
        return batches if distribution is None else distribution.experimental_distribute_dataset(
            shard_by_data(batches))

    dev = None if dev_ds is None else _stream(dev_ds, [*INPUT_KEYS, "label_ids"], config, shuffle=False)
    with scope_of(distribution):
        weighting = loss_weighting(config.weighting, len(config.losses))
        weighting.build(tf.TensorShape([len(config.losses)]))
    spec = _relaxed(_stream(train_ds, keys, config, shuffle=False).element_spec)
    steps = _Steps(student, weighting, config, pad_id, spec, distribution)
    history = MultiGrainedHistory(config.losses)
    scalars = ScalarLog(config.log_dir)
    best_weights, stale = _snapshot(student, weighting), 0
    best = WeightsSlot(best_weights[0] + best_weights[1]) if checkpoint.enabled else None
    objects = {"student": student, "weighting": weighting, "optimizer": steps.optimizer, "best": best}
    position = checkpoint.position()
    if position:
        checkpoint.restore(objects)
        history = MultiGrainedHistory(config.losses, position["epochs"], position["best_epoch"], position["best_score"])
        stale = position["stale"]
        restored = best.numpy()
        best_weights = restored[:len(best_weights[0])], restored[len(best_weights[0]):]
    else:
        history.best_score = _score(steps, dev, evaluate_fn)[2]
    for epoch in range(len(history.epochs) + 1, config.epochs + 1):
        if config.patience is not None and stale >= config.patience:
            break
        started = time.time()
        train_loss, means = _run_epoch(steps, train_for(epoch), config.losses, epoch)
        check_finite_loss(train_loss, "student", epoch)
        dev_loss, dev_f1, score = _score(steps, dev, evaluate_fn)
        record = {"epoch": epoch, "train_loss": train_loss, "losses": means, "dev_loss": dev_loss, "dev_f1": dev_f1,
                  "lambdas": dict(zip(config.losses, map(float, weighting.lambdas.numpy())))}
        history.epochs.append(record)
        scalars.write(epoch, {"train_loss": train_loss, "dev_loss": dev_loss, "dev_f1": dev_f1,
                              "learning_rate": current_learning_rate(steps.optimizer),
                              **{f"loss/{k}": v for k, v in means.items()},
                              **{f"lambda/{k}": v for k, v in record["lambdas"].items()}})
        log.info(epoch_line("student", epoch, config.epochs, time.time() - started, loss=train_loss, dev_loss=dev_loss,
                            dev_f1=dev_f1))
        log.debug("multi-grained epoch %d: losses %s, lambdas %s", epoch, means, record["lambdas"])
        if score > history.best_score:
            history.best_score, history.best_epoch, stale = score, epoch, 0
            best_weights = _snapshot(student, weighting)
        else:
            stale += 1
        if checkpoint.enabled:
            best.assign(best_weights[0] + best_weights[1])
            checkpoint.save(objects, {"epochs": history.epochs, "best_epoch": history.best_epoch,
                                      "best_score": history.best_score, "stale": stale})
    student.set_weights(best_weights[0])
    weighting.set_weights(best_weights[1])
    return history


def _snapshot(student, weighting):
    return student.get_weights(), weighting.get_weights()


def _score(steps: _Steps, dev, evaluate_fn) -> Tuple[Optional[float], Optional[float], float]:
    """(dev loss, dev F1, selection score: F1 when there is an evaluate_fn, else -dev loss)."""
    dev_loss = _dev_loss(steps, dev)
    dev_f1 = None if evaluate_fn is None else float(evaluate_fn(steps.student))
    score = dev_f1 if dev_f1 is not None else -dev_loss
    return dev_loss, dev_f1, score if math.isfinite(score) else -math.inf


def crf_tags_fn(student: tf.keras.Model):
    """Viterbi tags [B, T] int32 of a CRF student, one compiled function for any B and T."""
    crf = student.get_layer("crf")
    spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[{"input_ids": spec, "attention_mask": spec}])
    def tags(batch):
        potentials = student(batch, training=False)["potentials"]
        return crf.decode(potentials, tf.reduce_sum(batch["attention_mask"], axis=1))[0]

    return tags


def predict_tags_crf(student: tf.keras.Model, windows: Windows, batch_size: int = 64, tags_fn=None) -> np.ndarray:
    """Viterbi tag id per piece [W, L] (zeros past each length); windows are batched by length.
    Pass `tags_fn=crf_tags_fn(student)` to reuse one compiled function across calls."""
    return predict_by_length(windows, tags_fn or crf_tags_fn(student), batch_size)


def make_crf_dev_f1(windows: Windows, gold_tags: Sequence[Sequence[str]], tag_vocab: TagVocab,
                    scheme: str = "IOB2", batch_size: int = 64) -> EvaluateFn:
    """An `evaluate_fn`: entity F1 on dev words of the student's Viterbi tags."""
    tags_fns = CompiledPerStudent(crf_tags_fn)

    def dev_f1(student: tf.keras.Model) -> float:
        tags = predict_tags_crf(student, windows, batch_size, tags_fns(student))
        return entity_scores(gold_tags, decode(windows, tags, tag_vocab), scheme)["f1"]

    return dev_f1


def windows_dataset(windows: Windows) -> tf.data.Dataset:
    """Per-example dicts (input_ids, attention_mask, label_ids) of encoded windows, for the
    labeled-only stream (vanilla BiLSTM+CRF) or a dev set."""
    return tf.data.Dataset.from_tensor_slices({"input_ids": windows.input_ids, "attention_mask": windows.attention_mask,
                                               "label_ids": windows.label_ids})
