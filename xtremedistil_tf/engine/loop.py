"""The epoch loop every training method runs on (teacher fine-tuning, the staged loop, multi-grained
KD, KD-NAS distillation, subwords dual training).

A method supplies its step as a Keras `Model` whose `train_step`/`test_step` compute its loss (and a
compiled optimizer, or its own optimizer groups: `apply_groups`), and a `FitOptions` saying what to
train and keep: `engine.fit(step, FitOptions(train_for, epochs, target=student, ...))`. The engine
owns the rest:
- each epoch's seed, `epoch_seed(seed, *where, epoch)`: the data order (`train_for(seed)` gives the
  epoch's batches) and the dropout streams (`reseed_epoch`) are functions of it alone;
- best-so-far selection on the dev loss (`BestSoFar`; the starting weights compete, `patience` epochs
  without improvement stop) and the best weights left in the model; without a dev set, the last weights;
- a checkpoint after every epoch of {the method's objects, best weights, the caller's position and the
  epoch position}, and the restore of a killed run's checkpoint by the rerun (engine/resume.py);
- the epoch line, the progress bar, the finite-loss check, and under tf.distribute the batches
  sharded by element (each global batch is the one a single device sees: engine/distribute.py).
`replica_share` and `apply_groups` are the pieces of a step that distribution and loss scaling touch.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

from xtremedistil_tf.console import epoch_line
from xtremedistil_tf.engine.callbacks import BatchBar, BestSoFar
from xtremedistil_tf.engine.distribute import shard_by_data
from xtremedistil_tf.engine.precision import all_finite, needs_loss_scaling
from xtremedistil_tf.engine.resume import EpochCheckpoint, WeightsSlot, epoch_seed, reseed_epoch
from xtremedistil_tf.errors import ConfigError, TrainingDiverged, raise_if_interrupted

log = logging.getLogger(__name__)


# The losses of an epoch's log that must stay finite, and what the refusal calls them.
FINITE_LOSSES = (("loss", "training loss"), ("val_loss", "dev loss"))


def check_finite_loss(logs: Dict[str, float], step: str, epoch) -> None:
    """Stop a training step whose training or dev loss became NaN or infinite (raised before the
    epoch is checkpointed or selected, so neither a diverged epoch nor its NaN is ever kept)."""
    for key, what in FINITE_LOSSES:
        if key in logs and not math.isfinite(logs[key]):
            raise TrainingDiverged(step, what, logs[key], epoch)


class _StopOnInterrupt(tf.keras.callbacks.Callback):
    """Ends the fit at the next batch after a Ctrl-C whose KeyboardInterrupt was lost (errors.INTERRUPT)."""

    def on_train_batch_end(self, batch, logs=None):
        raise_if_interrupted()


@dataclass(frozen=True)
class FitOptions:
    """What one `Engine.fit` trains and keeps, besides the step (the Keras model it fits).

    What to train: `train_for(seed, epoch)` gives an epoch's batches (epoch 0-based, counted
    within this fit); `epochs` of them, each at most `steps_per_epoch` batches (None: the whole
    dataset); `reseed`: every model whose dropout is reseeded each epoch (None: `target` only; give
    them all when there are others with dropout, e.g. a teacher trained alongside).
    What to keep: `target` is the model whose weights are selected (None: the step itself). It is
    an option, not part of the step, because the step is any Keras model whose `train_step`
    computes the method's loss, often a wrapper around the student; which weights the fit keeps is
    the caller's choice. `dev`: batches whose `step.evaluate` loss selects the epoch; `score()`:
    selects instead, higher is better (dev F1, recorded in each epoch's log as `score_name`);
    with neither, no selection: the last epoch's weights stay. The starting weights compete unless
    `baseline` is False; `patience` epochs without improvement stop the fit (None: never).
    Checkpoints: `objects` is what a checkpoint holds besides the best weights (the student, the
    optimizers); `state` the caller's JSON-able position saved with it; `where` the caller's
    position in the run (e.g. stage, step), which each epoch's seed also depends on
    (`epoch_seed(seed, *where, epoch)`); `context` names it in the epoch lines and messages.
    `after_epoch(epoch, log)`: called with each epoch's log (1-based epoch), e.g. TensorBoard scalars."""

    train_for: Callable[[int, int], tf.data.Dataset]
    epochs: int
    target: Optional[tf.keras.Model] = None
    dev: Optional[tf.data.Dataset] = None
    steps_per_epoch: Optional[int] = None
    reseed: Optional[Sequence[tf.keras.Model]] = None
    score: Optional[Callable[[], float]] = None
    score_name: str = "dev_f1"
    baseline: bool = True
    patience: Optional[int] = None
    objects: Mapping[str, object] = field(default_factory=dict)
    state: Optional[dict] = None
    where: Sequence[int] = ()
    context: str = ""
    after_epoch: Optional[Callable[[int, Dict[str, float]], None]] = None


class Engine:
    """The epochs of one run: `fit(step, FitOptions(...))` trains a method's step for some epochs
    (the staged loop calls it once per unfreeze step), `save` marks a boundary between fits,
    `restore` loads a killed run's last checkpoint when no fit is left to take it.

    `checkpoint`: where the run's checkpoints go (None: nowhere); `position` is what the latest one
    holds (None for a fresh run) until a `fit` or `restore` has loaded it. `name` starts the epoch
    lines ("[student] ... epoch 3/10"); `verbose` shows a progress bar; `callbacks` go to every fit
    (Keras callbacks); `distribution`: the tf.distribute strategy the models were built under."""

    def __init__(self, checkpoint: Optional[EpochCheckpoint] = None, *, seed: int = 0, name: str = "student",
                 verbose: bool = False, callbacks: Sequence[tf.keras.callbacks.Callback] = (),
                 distribution: Optional[tf.distribute.Strategy] = None):
        self.checkpoint = checkpoint or EpochCheckpoint(None)
        self.seed, self.name, self.verbose, self.callbacks = seed, name, verbose, list(callbacks)
        self.distribution = distribution
        # Batches counted in the last epoch over each stage's data (FitOptions.where[:1]): the progress bar's total
        # where the data's length is unknown (BatchBar).
        self._batches: Dict[tuple, int] = {}
        self.position = self.checkpoint.position()
        # Every epoch's logs (the model's metrics, dev ones as val_*) and seconds, over all fits of
        # the run, the epochs of killed processes included.
        self.epochs: List[Dict[str, float]] = list((self.position or {}).get("epochs", []))
        self._best: Optional[WeightsSlot] = None

    def _fit_input(self, ds):
        """A fit's batches as Keras gets them: under tf.distribute sharded by element; the autotuner off."""
        if ds is None:
            return None
        return without_autotune(ds if self.distribution is None else shard_by_data(ds))

    def restore(self, objects: Dict[str, object]) -> Optional[dict]:
        """Load the latest checkpoint into `objects` if it is still pending; returns its epoch
        position (None at a boundary between fits, or when nothing was pending)."""
        if self.position is None:
            return None
        self.checkpoint.restore(objects)
        position, self.position = self.position, None
        return position.get("step")

    def save(self, objects: Dict[str, object], state: dict, tracker: Optional[BestSoFar] = None) -> None:
        """A checkpoint of `objects` and the JSON-able `state`; with `tracker`, mid-fit: its best
        weights and position too."""
        if not self.checkpoint.enabled:
            return
        self.checkpoint.save({**objects, **({"best": self._best} if self._best is not None else {})},
                             {**state, "step": tracker.state() if tracker else None, "epochs": self.epochs})

    def fit(self, step: tf.keras.Model, options: FitOptions) -> BestSoFar:
        """Train the compiled `step` (the method's Keras model: its `train_step`/`test_step` compute
        the loss) for `options.epochs` epochs (fewer when patience stops it), as `options` says
        (FitOptions). Returns the tracker: every epoch's dev loss (-score; train loss without
        either), the best one; the best weights are left in `options.target` (the step itself when None)."""
        o = options
        target = step if o.target is None else o.target
        score, score_name, objects, state = o.score, o.score_name, dict(o.objects), o.state or {}
        if self.distribution is not None:
            # Metric results are already over all replicas (Keras merges them); summing them again
            # over replicas would multiply the logged losses by R.
            step.distribute_reduction_method = "first"
        selects = o.dev is not None or score is not None
        if selects and self.checkpoint.enabled and self._best is None:
            self._best = WeightsSlot(target)
        resumed = self.restore({**objects, **({"best": self._best} if self._best is not None else {})})
        dev = self._fit_input(o.dev)
        # With checkpoints the best weights live in the checkpoint's slot only (a second copy as arrays would hold
        # a base-sized teacher's 0.4 GiB again); without, as arrays.
        keep = (lambda: self._best.capture(target)) if self._best is not None else target.get_weights
        if resumed:
            tracker = BestSoFar.from_state(resumed, o.patience, self._best)
        elif selects and o.baseline:
            initial = -score() if score else float(step.evaluate(dev, verbose=0, return_dict=True)["loss"])
            tracker = BestSoFar(o.patience, baseline=initial, weights=keep())
        else:
            tracker = BestSoFar(o.patience)
        for epoch in range(len(tracker.values), o.epochs):
            if tracker.stopped:
                break
            seed = epoch_seed(self.seed, *o.where, epoch)
            reseed_epoch(o.reseed or [target], seed)
            started = time.time()
            # One fit call per epoch (for exact resume): Keras' own "Epoch k/k" lines would mislead,
            # so the bar and the epoch line are the engine's, counted over this fit's epochs.
            label = f"{o.context + ' ' if o.context else ''}epoch {epoch + 1}/{o.epochs}"
            counted = tuple(o.where[:1])
            bar = [BatchBar(f"[{self.name}] {label}", self._batches.get(counted))] if self.verbose else []
            logs = step.fit(self._fit_input(o.train_for(seed, epoch)), validation_data=dev, initial_epoch=epoch,
                            epochs=epoch + 1, steps_per_epoch=o.steps_per_epoch,
                            callbacks=self.callbacks + bar + [_StopOnInterrupt()],
                            verbose=0).history
            if bar:
                self._batches[counted] = bar[0].count
            loss = logs["loss"][-1]
            record = {k: float(v[-1]) for k, v in logs.items()}
            at = f"{epoch + 1}{f' ({o.context})' if o.context else ''}"   # the epoch, for a divergence's message
            check_finite_loss(record, self.name, at)
            if score is not None:
                record[score_name] = float(score())
                if not math.isfinite(record[score_name]):
                    raise TrainingDiverged(self.name, f"dev score ({score_name})", record[score_name], at)
            value = -record[score_name] if score else record.get("val_loss", loss)
            tracker.update(value, keep if selects else lambda: None)
            seconds = time.time() - started
            log.info(epoch_line(self.name, epoch + 1, o.epochs, seconds, o.context, loss=loss,
                                dev_loss=record.get("val_loss"), **({score_name: record[score_name]} if score else {})))
            if o.after_epoch is not None:
                o.after_epoch(epoch + 1, record)
            self.epochs.append({**record, "seconds": round(seconds, 1)})
            self.save(objects, state, tracker)
        if isinstance(tracker.best_weights, WeightsSlot):
            tracker.best_weights.restore_into(target)
        elif tracker.best_weights is not None:
            target.set_weights(tracker.best_weights)
        return tracker


def without_autotune(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with tf.data's autotuner off: each AUTOTUNE parallelism becomes the core count, and the batches
    and their order stay the same (every map is deterministic). Keras makes a new iterator at every
    epoch's fit, and deleting one waits for the autotuner's current optimisation pass: 1.7-2 s for one
    deletion in four on a quiet 2-core machine, 2-13 s per epoch beside training (docs/benchmarks.md 1.6)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def replica_share(count) -> tf.Tensor:
    """This replica's share of the global batch's `count` (summed over replicas) while a
    tf.distribute strategy trains, else 1. A replica's mean loss times its share, summed over
    replicas by the optimizer, is the loss's mean over the global batch."""
    if not tf.distribute.has_strategy():
        return tf.constant(1.0)
    context = tf.distribute.get_replica_context()
    return tf.math.divide_no_nan(count, context.all_reduce(tf.distribute.ReduceOp.SUM, count))


def apply_groups(tape: tf.GradientTape, loss, groups, scaler=None) -> None:
    """Minimise `loss` (computed under `tape`) with one optimizer per group of variables
    (`groups`: (optimizer, variables) pairs); variables that get no gradient are left alone.

    `scaler`: a LossScaleOptimizer wrapping the first group's optimizer (`loss_scaler`), under
    mixed_float16: one dynamic loss scale serves every group; it sees an overflow in any group
    (the first group's gradients are made non-finite when any are), skips its update and lowers
    the scale, and the other groups skip that step too."""
    if scaler:
        with tape:  # the scaling is part of what the tape differentiates
            loss = scaler.get_scaled_loss(loss)
    apply_gradients(tape.gradient(loss, [v for _, group in groups for v in group]), groups, scaler)


def apply_gradients(grads, groups, scaler=None) -> None:
    """`apply_groups`' second half: `grads` (of the loss `scaler` scaled, if any; one per variable of `groups` in
    order, None for none) applied, one optimizer per group."""
    finite = None
    if scaler:
        grads = scaler.get_unscaled_gradients(grads)
        finite = all_finite(grads)
        size = len(groups[0][1])
        grads = [poison(g, finite) for g in grads[:size]] + list(grads[size:])
    start = 0
    for index, (optimizer, group) in enumerate(groups):
        pairs = list(zip(grads[start:start + len(group)], group))
        start += len(group)
        given = [(g, v) for g, v in pairs if g is not None]
        if scaler and index == 0:
            scaler.apply_gradients(pairs)  # it leaves variables without a gradient alone
        elif given and not scaler:
            optimizer.apply_gradients(given)
        elif given:
            tf.cond(finite, lambda opt=optimizer, given=given: _applied(opt, given), lambda: tf.constant(False))


def loss_scaler(groups):
    """A LossScaleOptimizer over the first group's optimizer under mixed_float16 (None otherwise),
    with every group's slots built (they must exist before `apply_groups` runs inside tf.cond, and
    before a checkpoint is restored into them)."""
    if needs_loss_scaling() and len(groups) > 1 and tf.distribute.has_strategy():
        raise ConfigError("--mixed_precision=mixed_float16 under --distribution needs one optimizer, and this "
                          "method has several sharing one loss scale, which TensorFlow's LossScaleOptimizer cannot "
                          "do across replicas: use mixed_bfloat16 or float32")
    for optimizer, group in groups:
        optimizer.build(group)
    return tf.keras.mixed_precision.LossScaleOptimizer(groups[0][0]) if needs_loss_scaling() else None


def _applied(optimizer, pairs):
    optimizer.apply_gradients(pairs)
    return tf.constant(True)


def poison(gradient, finite):
    """`gradient` where `finite`, NaN elsewhere (an IndexedSlices keeps its sparsity)."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(poison(gradient.values, finite), gradient.indices, gradient.dense_shape)
    return tf.where(finite, gradient, tf.constant(float("nan"), gradient.dtype))


class GroupsStep(tf.keras.Model):
    """Base of a method's step that updates its own optimizer groups (a Keras `Model` the engine
    fits): `minimize(tape, loss)` applies them (`apply_groups`, one loss scale under
    mixed_float16), `track(values, weight)` keeps each named value's epoch mean (`loss` among
    them; weighted means are exact over replicas too), `optimizers()` is what a checkpoint holds
    of the groups. Subclasses set `groups` with `use_groups` and write `train_step`."""

    def __init__(self, names: Sequence[str], run_eagerly: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.trackers = {name: tf.keras.metrics.Mean(name=name) for name in names}
        self.groups, self.scaler = [], None
        self.compile(run_eagerly=run_eagerly)

    @property
    def metrics(self):
        return list(self.trackers.values())

    def use_groups(self, groups) -> None:
        """(optimizer, variables) pairs; made, like the step, in the distribution strategy's scope."""
        self.groups, self.scaler = groups, loss_scaler(groups)

    def minimize(self, tape: tf.GradientTape, loss) -> None:
        apply_groups(tape, loss, self.groups, self.scaler)

    def track(self, values: Dict[str, tf.Tensor], weight=None) -> Dict[str, tf.Tensor]:
        for name, value in values.items():
            self.trackers[name].update_state(value, sample_weight=weight)
        return {name: tracker.result() for name, tracker in self.trackers.items()}

    def optimizers(self) -> Dict[str, object]:
        return {"optimizers": [optimizer for optimizer, _ in self.groups],
                **({"loss_scale": self.scaler} if self.scaler is not None else {})}
