"""What a user sees on the console: the project's own lines in plain words; TensorFlow's, absl's
and transformers' notices hidden unless --verbose (everything still goes to <work_dir>/run.log).

    [teacher] epoch 1/3  loss 0.4900  dev F1 73.20  (4m12s)

`setup(verbose)` is called once by every command (cli.common.run_main). The C++ lines TensorFlow
prints while it loads (CUDA probing on a CPU machine, oneDNN notices) are caught earlier, in
`_env`, before TensorFlow is imported; those it prints later, at every graph it optimises (oneDNN's
"supports DT_BOOL only on platforms with AVX-512", an ERROR-level line that TF_CPP_MIN_LOG_LEVEL=2
lets through, on CPUs where oneDNN is on by default), are dropped by `filter_stderr`.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
import warnings
from pathlib import Path
from typing import Optional

from absl import logging as absl_logging

# Lines TensorFlow's C++ side prints while it loads and probes devices; anything else is shown.
IMPORT_NOISE = re.compile(r"cuda|cudart|cuInit|cuDNN|cuFFT|cuBLAS|TensorRT|TF-TRT|oneDNN|absl::InitializeLog|"
                          r"computation_placer|rebuild TensorFlow with the appropriate compiler flags|"
                          r"This TensorFlow binary is optimized|^\s*$", re.IGNORECASE)
# Where a C++ log line of TensorFlow ("2026-11-26 11:20:33.123456: E tensorflow/...") or of absl
# ("I0000 00:00:1764151233.123456 ...") starts: after the import, only such lines are dropped, and only
# when they are IMPORT_NOISE. It may follow a progress bar's text on the same line (no newline before it).
CPP_LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ ")
PROJECT = "xtremedistil_tf"


def duration(seconds: float) -> str:
    """'4m12s', '1h03m', '12s'."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def epoch_line(who: str, epoch: int, epochs: int, seconds: float, context: str = "", **values) -> str:
    """`[who] context epoch k/n  name value ...  (time)`; F1 values (named *f1) are printed in
    percent and None values are left out."""
    parts = [f"[{who}] {context + ' ' if context else ''}epoch {epoch}/{epochs}"]
    for name, value in values.items():
        if value is None:
            continue
        label = name.replace("_", " ").replace("f1", "F1")
        parts.append(f"{label} {100 * value:.2f}" if name.endswith("f1") else f"{label} {value:.4f}")
    return "  ".join(parts) + f"  ({duration(seconds)})"


# Where the project's code lives: a record of the root logger is the project's only when it was logged from here
# (ONNX Runtime's quantizer logs its notices through the root logger: `logging.info(...)`).
_OURS = tuple(str(Path(__file__).resolve().parent.parent / folder) + os.sep for folder in (PROJECT, "bin"))


class _ProjectOnly(logging.Filter):
    """On the console: the project's records (and the command's own), and other libraries' errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(PROJECT) or record.name == "__main__" or record.levelno >= logging.ERROR:
            return True
        return record.name == "root" and os.path.realpath(record.pathname).startswith(_OURS)


class _Plain(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            message = f"{record.levelname.lower()}: {message}"
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return message


def _without_noise(line: bytes) -> bytes:
    """The line less a C++ log line of library noise in it (what came before it, a progress bar's
    text, stays); b"" when nothing is left."""
    text = line.decode("utf-8", "replace")
    start = CPP_LOG_LINE.search(text)
    if start is None or not IMPORT_NOISE.search(text[start.start():]):
        return line + b"\n"
    return text[:start.start()].encode("utf-8")


def _forward(source: int, target: Optional[int]) -> None:
    """Copy what comes through `source` to `target` until EOF, less complete lines of library
    noise (`_without_noise`). A partial line (a progress bar redrawn with \\r) goes on at once: C++ log
    lines arrive whole, one write each. If the real stderr goes away (a closed pipe), the rest is read
    and dropped, so that the process never blocks on a full pipe."""
    while True:
        chunk = os.read(source, 1 << 16)
        if not chunk:
            return
        *lines, partial = chunk.split(b"\n")
        data = b"".join(_without_noise(line) for line in lines) + partial
        while data and target is not None:
            try:
                data = data[os.write(target, data):]
            except OSError:  # nothing left to show it on: keep draining
                target = None


_filtering: list = []


def filter_stderr() -> None:
    """Send this process's fd 2 through a pipe whose reader drops library noise lines (`_forward`) and
    shows the rest on the real stderr; at exit fd 2 is restored and what is in flight is shown. For
    commands only (`setup`): a library import leaves a notebook's stderr alone."""
    if _filtering:
        return
    sys.stderr.flush()
    real = os.dup(2)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    thread = threading.Thread(target=_forward, args=(read, real), name="stderr-filter", daemon=True)
    thread.start()
    _filtering.append(thread)

    def restore() -> None:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(real, 2)    # closes the pipe's last write end (children may hold copies: bounded wait)
        thread.join(timeout=5)

    atexit.register(restore)


def setup(verbose: bool) -> None:
    """Console logging for a command: plain lines; other libraries quiet unless `verbose`."""
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # TensorFlow gives its logger a stderr handler of its own when it loads before any handler is on the
    # root ("INFO:tensorflow:Assets written to: ..." at every SavedModel): its records go to the root's
    # handlers instead, like every other library's (the console's filter, run.log).
    tf_logger = logging.getLogger("tensorflow")
    for own in [h for h in tf_logger.handlers if type(h) is logging.StreamHandler]:
        tf_logger.removeHandler(own)
    handler = absl_logging.get_absl_handler()
    if verbose:
        return  # absl's own format: timestamps, threads and files, for debugging
    filter_stderr()
    handler.setFormatter(_Plain())
    if not any(isinstance(f, _ProjectOnly) for f in handler.filters):
        handler.addFilter(_ProjectOnly())
    # transformers logs through its own handler (not propagated): its load notices ("Some weights of
    # the PyTorch model were not used ...") are quieted at the source.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        # console.py runs from _env, before TensorFlow loads: transformers only once logging is set up.
        from transformers.utils import logging as hf_logging  # noqa: PLC0415

        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    # Libraries' Python warnings (deprecations and the like) are for their developers.
    warnings.filterwarnings("ignore", module=r"^(?!xtremedistil_tf)")
