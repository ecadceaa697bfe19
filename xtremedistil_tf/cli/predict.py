"""bin/predict: text lines -> JSON lines of entities.

    echo "John lives in Paris" | bin/predict --model=runs/demo/export/ner
    bin/predict --model=runs/demo/student --input=lines.txt --output=entities.jsonl

--model is an exported model (<export_dir>/<name>, whose highest version is used, or one
version dir) or a saved student dir. Each line gives {"text", "entities": [{"start", "end",
"type", "text", "confidence"}]}, offsets in characters; an empty line gives no entities. Lines
end at \\n only (a \\r inside a line is part of its text); invalid UTF-8 is replaced by U+FFFD
(said once on stderr), so every input line gives exactly one record. UTF-16 and UTF-32 files with a
byte-order mark are decoded; a binary file (a NUL character, or a line past 1 MiB) is refused
at its first such line (before the model loads, when in the first batch). Input is read and written a batch at a time;
--output appears complete or not at all (written as <output>.tmp, then renamed).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import sys
from pathlib import Path

from absl import flags

from xtremedistil_tf import stop
from xtremedistil_tf.cli.common import command, define_common_flags
from xtremedistil_tf.errors import ConfigError, DataFormatError
from xtremedistil_tf.export.portable import batches
from xtremedistil_tf.export.predictor import as_text, load_serving_fn, predict
from xtremedistil_tf.io import atomic_output, check_output_file, say_if_blocking
from xtremedistil_tf.textfile import TextError, text_lines

FLAGS = flags.FLAGS

flags.DEFINE_string("model", "", "Exported model dir (<export_dir>/<name>[/<version>]) or saved student dir.")
flags.DEFINE_string("input", "-", "Text file, one text a line (UTF-8, or UTF-16/32 with a byte-order mark; "
                    "invalid bytes are replaced by U+FFFD); '-' reads stdin.")
flags.DEFINE_string("output", "-", "JSON-lines file to write; '-' writes stdout.")
flags.DEFINE_integer("batch_size", 64, "Lines per call of the model.")
flags.DEFINE_enum("format", "jsonl", ["jsonl", "text"], "jsonl: one JSON object a line; text: each line, then "
                  "its entities one a line (type, text, confidence), for reading.")

define_common_flags()


def _input(name: str):
    """(binary stream to read --input from, as a context manager; its name in messages)."""
    if name == "-":
        return contextlib.nullcontext(sys.stdin.buffer), "<stdin>"
    if Path(name).is_dir():
        raise ConfigError(f"--input={name} is a directory; expected a text file, one text a line")
    say_if_blocking(name)
    try:
        return open(name, "rb"), name
    except OSError as error:
        raise ConfigError(f"--input={name}: {error.strerror}") from None


def predict_lines() -> None:
    if not FLAGS.model:
        raise ConfigError("--model is required")
    if FLAGS.batch_size < 1:
        raise ConfigError(f"--batch_size must be >= 1; got {FLAGS.batch_size}")
    if FLAGS.output != "-":
        check_output_file(FLAGS.output, f"--output={FLAGS.output}")
    source, name = _input(FLAGS.input)   # a missing --input fails before the model loads
    with source as stream:
        try:
            # The input is read a batch at a time (textfile.text_lines: UTF-8, or UTF-16/32 with a byte-order mark; a
            # binary file refused at its first line, before the model loads); each batch's records are written
            # before the next is read, and a Ctrl-C ends the command at the end of the batch at the latest.
            lines = batches(text_lines(stream, name), FLAGS.batch_size)
            first = next(lines, None)
            serving_fn = load_serving_fn(FLAGS.model)
            with (contextlib.nullcontext(sys.stdout) if FLAGS.output == "-" else atomic_output(FLAGS.output)) as out:
                for batch in itertools.chain([first] if first else [], lines):
                    for record in predict(serving_fn, batch, len(batch)):
                        out.write((json.dumps(record, ensure_ascii=False) if FLAGS.format == "jsonl"
                                   else as_text(record)) + "\n")
                    out.flush()
                    stop.raise_if_interrupted()
        except TextError as error:
            raise DataFormatError(error.name, error.line, error.problem) from None


main, run = command(predict_lines, __doc__, 'echo "John lives in Paris" | bin/predict --model=runs/demo/export/ner')
