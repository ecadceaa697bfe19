"""bin/export: a saved student -> a TF Serving model directory <export_dir>/<model_name>/<version>/.

    bin/export --work_dir=runs/demo                      # runs/demo/student -> runs/demo/export/ner/<next>
    bin/export --student_dir=s --export_dir=models --model_name=ner --version=3
"""
from __future__ import annotations

from pathlib import Path

from absl import app, flags

from xtremedistil_tf.cli.common import define_common_flags, run_main
from xtremedistil_tf.errors import ConfigError

FLAGS = flags.FLAGS

flags.DEFINE_string("student_dir", "", "Saved student directory (default: <work_dir>/student).")
flags.DEFINE_string("export_dir", "", "Base directory of served models (default: <work_dir>/export).")
flags.DEFINE_string("model_name", "ner", "Model name: TF Serving's --model_name and the URL path.")
flags.DEFINE_integer("version", 0, "Version directory to write (0: one above the highest present).")
flags.DEFINE_bool("overwrite", False, "Replace an existing version directory.")

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
    return Path(student), Path(export)


def export() -> None:
    from xtremedistil_tf.export.serving import export_student

    student_dir, export_dir = _dirs()
    target = export_student(student_dir, export_dir, FLAGS.model_name, FLAGS.version, FLAGS.overwrite)
    print(target, flush=True)


def main(argv) -> None:
    del argv
    run_main(export)


def run() -> None:
    app.run(main)
