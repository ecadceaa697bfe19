"""bin/predict: text lines -> JSON lines of entities.

    echo "John lives in Paris" | bin/predict --model=runs/demo/export/ner
    bin/predict --model=runs/demo/student --input=lines.txt --output=entities.jsonl

--model is an exported model (<export_dir>/<name>, whose highest version is used, or one
version dir) or a saved student dir. Each line gives {"text", "entities": [{"start", "end",
"type", "text", "confidence"}]}, offsets in characters; an empty line gives no entities. Lines
end at \\n only (a \\r inside a line is part of its text); invalid UTF-8 is replaced by U+FFFD
(said once on stderr), so every input line gives exactly one record.
"""
from __future__ import annotations

import json
import sys

from absl import flags

from xtremedistil_tf.cli.common import command, define_common_flags
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export.portable import read_lines
from xtremedistil_tf.export.predictor import as_text, load_serving_fn, predict
from xtremedistil_tf.io import say_if_blocking

FLAGS = flags.FLAGS

flags.DEFINE_string("model", "", "Exported model dir (<export_dir>/<name>[/<version>]) or saved student dir.")
flags.DEFINE_string("input", "-", "Text file, one text a line (UTF-8; invalid bytes are replaced by U+FFFD); "
                    "'-' reads stdin.")
flags.DEFINE_string("output", "-", "JSON-lines file to write; '-' writes stdout.")
flags.DEFINE_integer("batch_size", 64, "Lines per call of the model.")
flags.DEFINE_enum("format", "jsonl", ["jsonl", "text"], "jsonl: one JSON object a line; text: each line, then "
                  "its entities one a line (type, text, confidence), for reading.")

define_common_flags()


def _read_lines(name: str):
    """One text per line of --input (portable.read_lines: split at \\n only, invalid UTF-8 replaced)."""
    if name == "-":
        return read_lines(sys.stdin.buffer.read(), "<stdin>")
    say_if_blocking(name)
    try:
        with open(name, "rb") as f:
            return read_lines(f.read(), name)
    except OSError as error:
        raise ConfigError(f"--input={name}: {error.strerror}") from None


def predict_lines() -> None:
    if not FLAGS.model:
        raise ConfigError("--model is required")
    if FLAGS.batch_size < 1:
        raise ConfigError(f"--batch_size must be >= 1; got {FLAGS.batch_size}")
    lines = _read_lines(FLAGS.input)   # a missing --input fails before the model loads
    records = predict(load_serving_fn(FLAGS.model), lines, FLAGS.batch_size)
    out = sys.stdout if FLAGS.output == "-" else open(FLAGS.output, "w", encoding="utf-8")
    try:
        for record in records:
            out.write((json.dumps(record, ensure_ascii=False) if FLAGS.format == "jsonl" else as_text(record)) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()


main, run = command(predict_lines, __doc__, 'echo "John lives in Paris" | bin/predict --model=runs/demo/export/ner')
