"""Run bin/train's body (or another command's: the third argument names its xtremedistil_tf/cli module) in-process
for several argument lists, paying for one TensorFlow import.

    python tests/train_cli_driver.py cases.json results.json [predict|evaluate|export|...]

cases.json is a list of argument lists (without the program name). results.json gets, for each,
{"code": exit status (0 when it returned), "stderr": what it printed to sys.stderr}; an exception
that escapes run_main (a bug: bin/train would print a traceback) gives code "traceback".
"""
import contextlib
import importlib
import io
import json
import logging
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import xtremedistil_tf  # noqa: E402,F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from absl import flags  # noqa: E402

COMMAND = sys.argv[3] if len(sys.argv) > 3 else "train"
cli = importlib.import_module(f"xtremedistil_tf.cli.{COMMAND}")


def run_case(argv):
    flags.FLAGS.unparse_flags()
    flags.FLAGS([COMMAND, *argv])
    root = logging.getLogger()
    handlers = list(root.handlers)
    stderr = io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stderr(stderr):
            cli.main([])
    except SystemExit as e:
        code = e.code
    except Exception:  # noqa: BLE001  (what a user would see as a traceback)
        code = "traceback"
        stderr.write(traceback.format_exc())
    finally:
        for handler in root.handlers[len(handlers):]:  # log_to_work_dir's run.log of this case
            root.removeHandler(handler)
            handler.close()
    return {"code": code, "stderr": stderr.getvalue()}


if __name__ == "__main__":
    cases = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    Path(sys.argv[2]).write_text(json.dumps([run_case(argv) for argv in cases]), encoding="utf-8")
