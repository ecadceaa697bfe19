"""Multi-grained distillation of a CRF teacher into a CRF student (Zhou et al., NAACL 2021).

One training stream of per-example dicts (`input_ids`, `attention_mask` [T] and the targets the
enabled losses need):
- the labeled windows alone (`label_ids` [T]): the vanilla BiLSTM+CRF with losses=("hard",);
- the teacher-output cache of `transfer/multigrained.py` (`label_ids`, `logits` [T, N],
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
combined by `losses.uncertainty.loss_weighting(config.weighting, n)` (Eq. 9), whose lambdas are
trained with the student by the same optimizer. The epochs run on the engine (`Engine.fit` of a
`MultiGrainedStep`: per-epoch seeds, checkpoints and exact resume, tf.distribute, loss scaling).
Early stopping on dev F1 (Viterbi, `make_crf_dev_f1`) or, without an evaluate_fn, on the dev NLL of
the gold tags; the best epoch's weights (student and lambdas) are restored.
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.alignment import CompiledPerStudent, TagVocab, Windows, decode, predict_by_length
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.data.scoring import entity_scores
from xtremedistil_tf.losses.uncertainty import LOSS_WEIGHTINGS, loss_weighting
from xtremedistil_tf.losses import registry, sequence
from xtremedistil_tf.losses.sequence import hard_targets
from xtremedistil_tf.students.models import StudentArch
from xtremedistil_tf.transfer.cache import padded_batch
from xtremedistil_tf.transfer.multigrained import check_kbest
from xtremedistil_tf.engine.distribute import scope_of
from xtremedistil_tf.engine.loop import Engine, FitOptions, GroupsStep, replica_share
from xtremedistil_tf.engine.resume import EpochCheckpoint
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
            seed: Optional[int] = None, pad_id: int = 0):
    """Per-example dicts -> trimmed batches of `keys`, each padded to its longest window (label_ids
    with `pad_id`, as the cache pads them; the rest with 0); shuffled in the order `seed` fixes (one
    epoch's order, engine/resume.py), or reshuffled at every iteration from `config.seed`."""
    ds = ds.map(lambda ex: {k: ex[k] for k in keys})
    if shuffle:
        ds = ds.shuffle(config.shuffle_buffer, seed=config.seed if seed is None else seed,
                        reshuffle_each_iteration=seed is None)
    return padded_batch(ds, config.batch_size, {"label_ids": pad_id}).map(
        lambda b: _trim(b, config.kbest)).prefetch(tf.data.AUTOTUNE)


def _check_kbest(ds: tf.data.Dataset, config: MultiGrainedConfig) -> None:
    cached = ds.element_spec.get("kbest_tags")
    if cached is not None and cached.shape[0] is not None and cached.shape[0] < config.kbest:
        raise ConfigError(f"kbest={config.kbest} but the teacher-output cache holds only {cached.shape[0]} "
                          "paths per window; rebuild it with a larger --kbest")


def _loss_counts(names, batch, pad_id: int) -> tf.Tensor:
    """[num_losses] what each loss of `_loss_values` averages over in this batch (the registry's
    count: rows for the sequence losses, real positions for the token losses). A replica's share of
    the global batch's count weights its loss (`MultiGrainedStep`)."""
    return tf.stack([loss.count(loss.mask(batch, pad_id)) for loss in map(registry.get, names)])


class MultiGrainedStep(GroupsStep):
    """The step the engine fits (engine/loop.py): the student, its loss weighting (Eq. 9) and one
    Adam over both (`clipnorm` on the global gradient norm; one loss scale under mixed_float16).
    `train_step` minimises the weighted losses and logs each loss's mean, the weighted total
    (`loss`) and the lambdas after the step (`lambda_<loss>`); `test_step` logs the dev NLL of the
    gold tags (`loss`, the exact mean over the labeled rows). Its weights, what the engine selects
    and restores, are the student's and the weighting's.

    Under a tf.distribute strategy each replica trains on its slice of the global batch: its loss
    terms are weighted by its share of what each term averages over (`_loss_counts`, summed over
    replicas), and the weighting's regulariser counts once over all replicas, so the gradients the
    optimizer sums over replicas are the single-device gradients of the global batch; the logged
    means are those of the global batches too."""

    def __init__(self, student: tf.keras.Model, config: MultiGrainedConfig, pad_id: int):
        super().__init__((*config.losses, "loss"), run_eagerly=config.run_eagerly)
        self.student, self.names, self.pad_id, self.token_loss = student, config.losses, pad_id, config.token_loss
        self.weighting = loss_weighting(config.weighting, len(config.losses))
        self.weighting.build(tf.TensorShape([len(config.losses)]))
        self.use_groups([(tf.keras.optimizers.Adam(config.learning_rate, global_clipnorm=config.clipnorm),
                          student.trainable_variables + self.weighting.trainable_variables)])

    def weight_variables(self) -> list:
        """What `get_weights` reads and the best-so-far slot copies (engine/resume.weight_variables)."""
        return self.student.weights + self.weighting.weights

    def get_weights(self):
        return self.student.get_weights() + self.weighting.get_weights()

    def set_weights(self, weights):
        size = len(self.student.weights)
        self.student.set_weights(weights[:size])
        self.weighting.set_weights(weights[size:])

    def objects(self) -> Dict[str, object]:
        """What a checkpoint holds besides the best weights (engine/resume.py)."""
        return {"student": self.student, "weighting": self.weighting, **self.optimizers()}

    def train_step(self, batch):
        shares = replica_share(_loss_counts(self.names, batch, self.pad_id)) * tf.ones([len(self.names)])
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        with tf.GradientTape() as tape:
            outputs = self.student({k: batch[k] for k in INPUT_KEYS}, training=True)
            values = tf.stack(_loss_values(self.names, outputs, batch, self.student.get_layer("crf").transitions,
                                           self.pad_id, self.token_loss))
            total = self.weighting(values * shares)
            if replicas > 1:
                # The weighting is linear in the losses plus a regulariser (its value at zero
                # losses): keep 1/R of the regulariser per replica.
                total -= (1.0 - 1.0 / replicas) * self.weighting(tf.zeros_like(values))
        self.minimize(tape, total)
        # Weighted by its shares, each replica's part sums over the replicas to the global batch's value.
        for index, name in enumerate(self.names):
            self.trackers[name].update_state(values[index], sample_weight=shares[index])
        self.trackers["loss"].update_state(total * replicas, sample_weight=1.0 / replicas)
        lambdas = self.weighting.lambdas
        return {**{name: tracker.result() for name, tracker in self.trackers.items()},
                **{f"lambda_{name}": lambdas[index] for index, name in enumerate(self.names)}}

    def test_step(self, batch):
        batch = {k: tf.cast(batch[k], tf.int32) for k in (*INPUT_KEYS, "label_ids")}
        outputs = self.student({k: batch[k] for k in INPUT_KEYS}, training=False)
        hard = registry.get("hard")
        mask = hard.mask(batch, self.pad_id)
        nll = hard({**outputs, "transitions": self.student.get_layer("crf").transitions}, batch, mask)
        self.trackers["loss"].update_state(nll, sample_weight=hard.count(mask))
        return {"loss": self.trackers["loss"].result()}


def _record(names: Sequence[str], epoch: int, logs: Dict[str, float]) -> Dict:
    """A history record (`MultiGrainedHistory.epochs`) of one epoch's engine log."""
    return {"epoch": epoch, "train_loss": logs["loss"], "losses": {name: logs[name] for name in names},
            "dev_loss": logs.get("val_loss"), "dev_f1": logs.get("dev_f1"),
            "lambdas": {name: logs[f"lambda_{name}"] for name in names}}


def train_multigrained(student: tf.keras.Model, train_ds: tf.data.Dataset, dev_ds: Optional[tf.data.Dataset],
                       config: MultiGrainedConfig, pad_id: int, evaluate_fn: Optional[EvaluateFn] = None,
                       checkpoint: Optional[EpochCheckpoint] = None,
                       distribution: Optional[tf.distribute.Strategy] = None,
                       callbacks: Sequence[tf.keras.callbacks.Callback] = ()) -> MultiGrainedHistory:
    """Train a CRF student (`students/crf_student.py`) in place on the engine (`MultiGrainedStep`
    fitted by `Engine.fit`); returns the per-epoch history.

    train_ds: per-example dicts (see the module docstring), shuffled and batched here, each epoch
    in the order its engine seed (`resume.epoch_seed(config.seed, epoch)`, 0-based) gives.
    dev_ds: per-example dicts with gold `label_ids` (None: select on `evaluate_fn` alone).
    pad_id: the TagVocab's [PAD] id (marks unlabeled windows). evaluate_fn(student) -> dev F1
    selects the epoch when given (e.g. `make_crf_dev_f1`); otherwise the dev NLL does.
    checkpoint: saved after every epoch (student, lambdas, Adam, best weights, the epochs' logs); a
    run whose checkpoint dir holds one continues after its last epoch (engine/resume.py).
    distribution: a tf.distribute strategy the student was built under; batches are global.
    callbacks: Keras callbacks of every epoch's fit.
    """
    if evaluate_fn is None and dev_ds is None:
        raise ConfigError("train_multigrained needs a dev set or an evaluate_fn to select the best epoch")
    if checkpoint is not None and "best_score" in (checkpoint.position() or {}):
        raise ConfigError(f"{checkpoint.directory} holds a checkpoint of the multi-grained loop from before it ran on "
                          "the engine, which cannot be resumed; delete that dir to train this student again")
    tf.keras.utils.set_random_seed(config.seed)
    _check_kbest(train_ds, config)
    keys = _needed_keys(config.losses, list(train_ds.element_spec))
    dev = None if dev_ds is None else _stream(dev_ds, [*INPUT_KEYS, "label_ids"], config, shuffle=False, pad_id=pad_id)
    with scope_of(distribution):
        step = MultiGrainedStep(student, config, pad_id)
    engine = Engine(checkpoint, seed=config.seed, verbose=config.progress, callbacks=callbacks,
                    distribution=distribution)
    scalars = ScalarLog(config.log_dir)

    def after_epoch(epoch: int, logs: Dict[str, float]) -> None:
        record = _record(config.losses, epoch, logs)
        scalars.write(epoch, {"train_loss": record["train_loss"], "dev_loss": record["dev_loss"],
                              "dev_f1": record["dev_f1"], "learning_rate": current_learning_rate(step.groups[0][0]),
                              **{f"loss/{k}": v for k, v in record["losses"].items()},
                              **{f"lambda/{k}": v for k, v in record["lambdas"].items()}})
        log.debug("multi-grained epoch %d: losses %s, lambdas %s", epoch, record["losses"], record["lambdas"])

    tracker = engine.fit(step, FitOptions(
        lambda seed, _: _stream(train_ds, keys, config, shuffle=True, seed=seed, pad_id=pad_id),
        config.epochs, dev=dev,
        objects=step.objects(), patience=config.patience,
        score=None if evaluate_fn is None else lambda: evaluate_fn(student), after_epoch=after_epoch))
    return MultiGrainedHistory(config.losses, [_record(config.losses, epoch, logs)
                                               for epoch, logs in enumerate(engine.epochs, start=1)],
                               tracker.best_epoch or 0, -tracker.best)


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
