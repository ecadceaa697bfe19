"""bin/report: work_dir/report.md with score tables and plots (xtremedistil_tf/run/report.py).

    bin/report --work_dir=runs/demo [--latency_json=runs/bench/latency.json] [--probes=probes.txt]
    bin/report --work_dir=W --probes=configs/probes/en_rare_names.txt --probe_students=W/ablate/seed-1/D4.2,...
"""
from __future__ import annotations

from pathlib import Path

from absl import flags

from xtremedistil_tf.benchmarks.deployed import read_result, speed_lines
from xtremedistil_tf.cli.common import command, define_common_flags
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.run.pipeline import summary_table
from xtremedistil_tf.run.probes import probe_agreement
from xtremedistil_tf.run.report import read_metrics, write_report

FLAGS = flags.FLAGS
define_common_flags()
flags.DEFINE_bool("summary", False, "Also print the run's summary table (what bin/train prints at its end), its "
                  "speed table when `bin/benchmark deployed` has timed it (<work_dir>/deployed.json) and how to serve "
                  "its export with TF Serving.")
flags.DEFINE_string("probes", "", "Probe sentences for report.md's teacher-beside-student table, one raw text a line "
                    "(default: a few sentences with rare names in each of the run's languages, run/probes.py).")
flags.DEFINE_list("probe_students", [], "Also print how many of the teacher's entities in the probe sentences each of "
                  "these saved students finds (e.g. bin/ablate's <work_dir>/ablate/seed-1/D4.2), against --work_dir's "
                  "teacher.")
flags.DEFINE_string("latency_json", "", "Latency results of `bin/benchmark latency --output_json` "
                                        "(default: <work_dir>/latency.json when it exists).")


def report() -> None:
    if not FLAGS.work_dir:
        raise ConfigError("--work_dir is required")
    for student in FLAGS.probe_students:   # each named in one line before any model loads
        if not (Path(student) / "student.json").is_file():
            raise ConfigError(f"--probe_students: {student} is no saved student (no student.json)")
    teacher = Path(FLAGS.work_dir) / "teacher" / "model" / "teacher.json"
    if FLAGS.probe_students and not teacher.is_file():
        raise ConfigError(f"--probe_students: --work_dir={FLAGS.work_dir} has no fine-tuned teacher ({teacher.parent}) "
                          "to probe against")
    path = write_report(FLAGS.work_dir, FLAGS.latency_json or None, FLAGS.probes or None)
    for student in FLAGS.probe_students:
        found, total = probe_agreement(FLAGS.work_dir, student, FLAGS.probes or None)
        print(f"{student}: finds {found} of the teacher's {total} entities in the probe sentences")
    if not FLAGS.summary:
        print(path)
        return

    work = Path(FLAGS.work_dir)
    metrics, _, hint = read_metrics(work)
    print(summary_table(work, metrics))
    if hint:
        print(hint)
    speed = read_result(work)
    if speed:
        print("\n".join(speed_lines(speed)))
    print(f"{'report':<26s} {path}")
    export = work / "export"
    for model in sorted(p for p in export.iterdir() if p.is_dir()) if export.is_dir() else []:
        print(f"serve it with TF Serving: docker run --rm -p 8501:8501 -v \"$PWD/{model}:/models/{model.name}\" "
              f"-e MODEL_NAME={model.name} tensorflow/serving  (docs/serving.md)")


main, run = command(report, __doc__, 'bin/report --work_dir=runs/demo')
