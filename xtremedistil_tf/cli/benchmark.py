"""bin/benchmark: timing benchmarks, one subcommand each.

    bin/benchmark cache --work_dir=runs/wikiann --max_seq_length=128 --teacher_layer=4 [--cache_windows=1000]
                        (disk bytes per 1,000 windows of the teacher-output cache in each layout)
    bin/benchmark crf [--repeats=50]
    bin/benchmark decoders --work_dir=runs/ablate   (a bin/ablate run's teacher and students, constrained and argmax F1)
    bin/benchmark deployed --work_dir=runs/demo [--latency_threads=1 --queries=256]   (the work dir's own teacher and
                          student in TensorFlow and ONNX Runtime int8, batch 1 and 32, interleaved; W/deployed.json)
    bin/benchmark embedding_drift --work_dir=W [--student_dir=W/ablate/seed-1/D4.2]   (how far the student's word
                          embeddings moved from their SVD start, by pieces of its labeled, transfer or neither text,
                          and which of them the test's unseen names are made of)
    bin/benchmark finetune_memory --teacher=mpnet-base [--memory_micro=0,4 --memory_steps=6 --max_seq_length=64]
                          (peak RSS of the teacher's fine-tuning steps, the package's beside a plain loop, whole
                          batches and micro-batches)
    bin/benchmark formats --work_dir=runs/wikiann [--repeats=3 --formats_queries=256 --formats_lengths=64]
                          (size, parameters, F1, latency, peak RSS per export format and quantization)
    bin/benchmark latency [--teacher_config=mbert-base --students=50x200,100x400 --queries=1000]
                          [--latency_peers --latency_threads=2]   (+ the teacher in ONNX Runtime float32/int8 and the
                          students in every exported format, ids and text; speedups over the int8 ONNX teacher)
    bin/benchmark lengths --work_dir=runs/wikiann --length_teachers=minilm,mpnet-base [--length_windows=512]
                          (teacher fine-tuning and cache, batches in order vs grouped by length, interleaved)
    bin/benchmark memory [--memory_sizes=10000,100000 --memory_steps=300]   (peak RSS of student training vs transfer-set size)
    bin/benchmark peers --work_dir=runs/demo [--spacy_max_minutes=60 --spacy_seed=0 --peers_threads=1 --queries=1000]
                        (the work dir's student against spaCy's efficiency NER trained on the same labels: span F1 on
                        the raw test text by one scorer, ms per sentence raw text in, entities out; W/peers.json;
                        needs spaCy: pip install ".[peers]")
    bin/benchmark precision [--repeats=20]   (a training step under float32 / mixed_bfloat16 / mixed_float16)
    bin/benchmark served_text [--students=50x200 --student_vocab_size=30522 --queries=200 --repeats=3]
        (where the batch-1 time of the SavedModel's text-in signature goes, stage by stage)
    bin/benchmark served_text --served_exports=DIR,DIR [--latency_threads=2 --served_inter_op_threads=1 --repeats=15]
        (exported models, ids and text at batch 1, interleaved in one process)
    bin/benchmark teacher --data_format=wikiann --data_dir=DIR --langs=en --teacher=minilm [bin/train's flags]
        (the pipeline's teacher beside a plain reference Keras loop: dev/test F1 and training time)
"""
from __future__ import annotations

import sys

from absl import flags

import xtremedistil_tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow loads)
from xtremedistil_tf.benchmarks import (  # noqa: E402
    cache_size,  # noqa: E402
    deployed,
    embedding_drift,
    finetune_memory,
    formats,
    latency,
    lengths,
    memory,
    served_text,
    spacy_peer,
)
from xtremedistil_tf.benchmarks.registry import BENCHMARKS
from xtremedistil_tf.cli import train as _train_flags  # noqa: E402  (bin/benchmark teacher takes bin/train's flags)
from xtremedistil_tf.cli.common import flag_group, one_line, run_app, run_main  # noqa: E402
from xtremedistil_tf.errors import XtremeDistilError  # noqa: E402

FLAGS = flags.FLAGS
flag_group("Benchmark")
flags.DEFINE_integer("repeats", 50, "Timed runs per measurement (the median is printed).")
# Flags must exist before absl parses the command line.
latency.define_flags()
lengths.define_flags()
deployed.define_flags()
embedding_drift.define_flags()
memory.define_flags()
finetune_memory.define_flags()
cache_size.define_flags()
formats.define_flags()
served_text.define_flags()
spacy_peer.define_flags()


def main(argv):
    names = argv[1:]
    unknown = [name for name in names if name not in BENCHMARKS]
    if not names or unknown:
        print(
            f"usage: bin/benchmark {{{','.join(sorted(BENCHMARKS))}}} [--repeats=N]"
            + (f"; unknown: {', '.join(unknown)}" if unknown else ""),
            file=sys.stderr,
        )
        return 2
    if FLAGS.repeats < 1:
        print(f"--repeats must be >= 1; got {FLAGS.repeats}", file=sys.stderr)
        return 2
    status = [0]

    def body() -> None:
        for name in names:
            try:
                # The teacher benchmark reads bin/train's flags through cli/train.py, which it may not import.
                extra = ({"config_from_flags": _train_flags.config_from_flags,
                          "log_to_work_dir": _train_flags.log_to_work_dir} if name == "teacher" else {})
                lines = BENCHMARKS[name](FLAGS.repeats, **extra)
            except (ValueError, XtremeDistilError) as e:  # a bad flag value, e.g. --students=50-200
                print(f"bin/benchmark {name}: {one_line(e)}", file=sys.stderr)
                status[0] = 2
                return
            for line in lines:
                print(line, flush=True)

    # The console of every command: the project's lines, other libraries' notices hidden unless --verbose.
    run_main(body)
    return status[0]


# `bin/benchmark --help` lists these first, one line each (the module docstring has their flags).
SUBCOMMANDS = (
    ("cache", "bytes per 1,000 windows of the teacher-output cache in each layout (padded, ragged, int8, top-k)"),
    ("crf", "CRF log-likelihood, 1-best and k-best decoding at B=32, T=128 (eager, tf.function, XLA)"),
    ("decoders", "a bin/ablate run's teacher and students: constrained and argmax decoding, F1 and speed"),
    ("deployed", "a work dir's own teacher and student in TensorFlow and ONNX Runtime int8, batch 1 and 32, interleaved"),
    ("embedding_drift", "a student's word embeddings against their SVD start, by where its training text has each piece"),
    ("finetune_memory", "peak RSS of the teacher's fine-tuning steps, the package's beside a plain loop, whole and "
                        "micro-batches"),
    ("formats", "each export format and quantization: size, parameters, F1, latency, peak RSS"),
    ("latency", "teacher and student inference latency at batch 1 and 32 (the paper's speedups)"),
    ("lengths", "the teacher's fine-tuning and cache per teacher, batches in order against grouped by length"),
    ("memory", "peak RSS of student training against the transfer-set size"),
    ("peers", "the student against spaCy's efficiency NER trained on the same labels: span F1 and speed, raw text in"),
    ("precision", "one training step under float32, mixed_bfloat16 and mixed_float16"),
    ("served_text", "the SavedModel's text-in signature at batch 1, stage by stage (tokens, windows, student, tags, spans)"),
    ("teacher", "the pipeline's teacher beside a plain reference Keras loop: dev/test F1 and training time"),
)


def run():
    run_app(main, __doc__, subcommands=SUBCOMMANDS,
            example='bin/benchmark teacher --data_format=wikiann --data_dir=DIR --langs=en --teacher=minilm --teacher_epochs=1')
