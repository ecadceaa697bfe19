"""bin/export: a saved student -> a TF Serving model directory <export_dir>/<model_name>/<version>/.

    bin/export --work_dir=runs/demo                      # runs/demo/student -> runs/demo/export/ner/<next>
    bin/export --student_dir=s --export_dir=models --model_name=ner --version=3
    bin/export --work_dir=runs/demo --prune_vocab       # serve only the pieces the training data uses
    bin/export --work_dir=runs/demo --format=onnx --quantize=dynamic_int8   # runs/demo/export/ner-onnx-dynamic_int8/
    bin/export --work_dir=runs/demo --format=tflite --xla_lengths=32,128    # runs/demo/export/ner-tflite/
    bin/export --work_dir=runs/demo --quantize=bfloat16   # a SavedModel in bfloat16 (CPUs with AVX512-BF16/AMX)
    bin/export --work_dir=runs/demo --decode=argmax     # softmax students: each word's best tag, unconstrained
    bin/export --work_dir=runs/demo --teacher [--quantize=dynamic_int8]   # the run's teacher in ONNX:
                                                        # runs/demo/export/ner-teacher-onnx[-dynamic_int8]/
"""
from __future__ import annotations

import os
from pathlib import Path

from absl import flags

from xtremedistil_tf.cli.common import command, define_common_flags, int_list
from xtremedistil_tf.damage import RETRAIN, reading
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export.formats import check_format
from xtremedistil_tf.export.formats import export as export_model
from xtremedistil_tf.export.teacher import check_teacher_dir
from xtremedistil_tf.export.teacher import export_teacher as write
from xtremedistil_tf.run.lock import reading_lock

FLAGS = flags.FLAGS

flags.DEFINE_bool("teacher", False, "Export the run's fine-tuned teacher (--teacher_dir) to ONNX instead of the "
                  "student: ids in, tags out; --quantize=none or dynamic_int8 (docs/serving.md).")
flags.DEFINE_string("teacher_dir", "", "--teacher: the saved teacher (default: <work_dir>/teacher/model).")
flags.DEFINE_string("student_dir", "", "Saved student directory (default: <work_dir>/student).")
flags.DEFINE_string("export_dir", "", "Base directory of served models (default: <work_dir>/export).")
flags.DEFINE_string("model_name", "ner", "Model name: TF Serving's --model_name and the URL path.")
flags.DEFINE_integer("version", 0, "Version directory to write (0: one above the highest present).")
flags.DEFINE_bool("overwrite", False, "Replace an existing version directory.")
flags.DEFINE_bool("prune_vocab", False, "Serve only the word pieces the student's training data uses "
                  "(--prune_corpus; default: <work_dir>/data/train.jsonl and transfer.jsonl). docs/serving.md.")
flags.DEFINE_list("prune_corpus", [], "Texts whose pieces are kept by --prune_vocab: JSON lines with \"tokens\" "
                  "(a work dir's data/*.jsonl) or plain text, one text a line.")
flags.DEFINE_integer("prune_min_count", 1, "--prune_vocab keeps pieces seen at least this many times.")
flags.DEFINE_bool("prune_keep_characters", True, "--prune_vocab also keeps every one-character piece, so unseen "
                  "words split into characters rather than [UNK].")

flags.DEFINE_list("xla_lengths", [], "BiLSTM students: window lengths in pieces (with [CLS]/[SEP]), e.g. 32,64,128, "
                  "at which the BiLSTM runs unrolled under XLA (the fastest graph at batch 32; docs/serving.md). "
                  "Longer windows use the fused kernel. TF Serving needs --xla_cpu_compilation_enabled=true. "
                  "--format=tflite: the fixed window lengths of its signatures (default: the student's max_seq_length).")
flags.DEFINE_enum("format", "saved_model", ["saved_model", "onnx", "tflite"],
                  "saved_model: TF Serving (<export_dir>/<model_name>/<version>/); onnx, tflite: "
                  "<export_dir>/<model_name>-<format>[-<quantize>]/ with tokenizer.json and predict.py (docs/serving.md).")
flags.DEFINE_enum("decode", "constrained", ["constrained", "argmax"],
                  "Softmax students' word tags: constrained (the most probable sequence the tag scheme allows, "
                  "so no I-PER after O) or argmax (each word's best tag on its own). Recorded in the export's "
                  "export.json; CRF students always use their CRF's Viterbi (docs/serving.md).")
flags.DEFINE_string("quantize", "none", "none, dynamic_int8 (onnx, tflite), float16 (tflite) or bfloat16 "
                    "(saved_model, on CPUs with AVX512-BF16/AMX).")

define_common_flags()


def _dirs():
    """(student_dir, export_dir) from the flags, defaulting into --work_dir."""
    work = Path(FLAGS.work_dir) if FLAGS.work_dir else None
    student = FLAGS.student_dir or (work / "student" if work else "")
    export = FLAGS.export_dir or (work / "export" if work else "")
    if not student or not export:
        raise ConfigError("pass --work_dir, or both --student_dir and --export_dir")
    if FLAGS.version < 0:
        raise ConfigError(f"--version must be >= 0; got {FLAGS.version}")
    check_export_dir(Path(export))
    return Path(student), Path(export)


def check_export_dir(export: Path) -> None:
    """Refuse an export dir that cannot hold the export before any model is loaded: a regular file,
    a path under one, or under a dir this user cannot write (it is created when missing)."""
    flag = f"--export_dir={FLAGS.export_dir}" if FLAGS.export_dir else f"--work_dir={FLAGS.work_dir}: {export}"
    existing = next(p for p in (export, *export.absolute().parents) if p.exists())
    if not existing.is_dir():
        where = "is" if existing == export else f"is under {existing}, which is"
        raise ConfigError(f"{flag} {where} a file; expected a directory (created if missing)")
    if not os.access(existing, os.W_OK):
        raise ConfigError(f"{flag}: {existing} cannot be written (permissions); expected a writable directory")


def _prune_corpus():
    """The texts whose pieces --prune_vocab keeps; () without --prune_vocab."""
    if not FLAGS.prune_vocab:
        if FLAGS.prune_corpus:
            raise ConfigError("--prune_corpus is used only with --prune_vocab")
        return ()
    if FLAGS.prune_corpus:
        return [Path(p) for p in FLAGS.prune_corpus]
    if not FLAGS.work_dir:
        raise ConfigError("--prune_vocab needs --prune_corpus or a --work_dir whose data/ it reads")
    data = Path(FLAGS.work_dir) / "data"
    corpus = [p for p in (data / "train.jsonl", data / "transfer.jsonl") if p.exists()]
    if not corpus:
        raise ConfigError(f"--prune_vocab: {data} has no train.jsonl or transfer.jsonl; pass --prune_corpus")
    return corpus


# bin/export's student-only flags: --teacher refuses them rather than ignoring them.
STUDENT_ONLY = ("student_dir", "version", "prune_vocab", "prune_corpus", "prune_min_count", "prune_keep_characters",
                "xla_lengths", "decode")


def export_teacher() -> None:
    """bin/export --teacher: the flags checked, then the teacher written (export/teacher.py)."""
    given = [f"--{name}" for name in STUDENT_ONLY if FLAGS[name].present]
    if given:
        raise ConfigError(f"--teacher exports the teacher; drop {', '.join(given)} (student flags)")
    if FLAGS["format"].present and FLAGS.format != "onnx":
        raise ConfigError(f"--teacher writes ONNX; drop --format={FLAGS.format}")
    if FLAGS.quantize not in ("none", "dynamic_int8"):
        raise ConfigError(f"--teacher: --quantize must be none or dynamic_int8; got {FLAGS.quantize}")
    work = Path(FLAGS.work_dir) if FLAGS.work_dir else None
    teacher = FLAGS.teacher_dir or (work / "teacher" / "model" if work else "")
    export_dir = FLAGS.export_dir or (work / "export" if work else "")
    if not teacher or not export_dir:
        raise ConfigError("--teacher: pass --work_dir, or both --teacher_dir and --export_dir")
    check_export_dir(Path(export_dir))
    check_teacher_dir(teacher)
    print(write(teacher, export_dir, FLAGS.model_name, FLAGS.quantize, FLAGS.overwrite), flush=True)


def export() -> None:
    with reading_lock(FLAGS.work_dir, "exporting"):   # not while bin/train writes the student or teacher
        if FLAGS.teacher:
            return export_teacher()
        return export_student()


def export_student() -> None:
    if FLAGS.teacher_dir:
        raise ConfigError("--teacher_dir is read only with --teacher")
    check_format(FLAGS.format, FLAGS.quantize)
    student, export_dir = _dirs()
    with reading(student, RETRAIN):   # a damaged or missing file of the student named in one line
        exported = export_model(student, export_dir, FLAGS.format, FLAGS.quantize, FLAGS.model_name, FLAGS.version,
                                FLAGS.overwrite, _prune_corpus(), FLAGS.prune_min_count, FLAGS.prune_keep_characters,
                                int_list("xla_lengths"), FLAGS.decode)
    module = exported.module
    print(f"served graph: {module.served_parameters():,} parameters, {module.served_pieces():,} word pieces, "
          f"{module.decode} decoding", flush=True)
    print(exported.directory, flush=True)


main, run = command(export, __doc__, 'bin/export --work_dir=runs/demo')
