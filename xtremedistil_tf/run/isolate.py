"""One step of a run in a process of its own, so that what it held is given back when it ends.

TensorFlow keeps the memory a base-sized teacher's fine-tuning touched (its allocator caches it: 4.4 GB stay
resident after the teacher and every object of it are gone, 0.2 GB of them given back by malloc_trim), so in one
process the student step would hold the teacher step's peak (docs/benchmarks.md 5.2). `run_in_child` runs a
step's function in a fresh interpreter (`python -m xtremedistil_tf.run.isolate`) and hands back its result, its
log records (to this process's handlers: the console, run.log) and its peak resident memory:

- the call goes by pickle: a module-level function and picklable arguments;
- the child's stderr is this process's (progress bars, and TensorFlow's C++ lines through the console's filter);
- Ctrl-C and SIGTERM: the child ignores SIGINT (a terminal sends it to both processes) and stops on SIGTERM,
  which this process sends once, when a stop signal reaches it (stop.py), then waits for the child to end
  cleanly: the step's half-built artifact is removed there as in one process, and this process raises the
  interrupt after;
- an error in the child is raised here (the child's traceback as its cause, for --verbose); a child that ends
  without a word (killed, out of memory) is one line naming the step and its exit status.
"""
from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import traceback
from typing import Any, Callable, Optional, Tuple

from xtremedistil_tf import resident, stop
from xtremedistil_tf.errors import XtremeDistilError

log = logging.getLogger(__name__)
_HEADER = struct.Struct("<Q")


class StepProcessError(XtremeDistilError):
    """A step's own process ended without handing back a result."""


class ChildTraceback(Exception):
    """The traceback of an error raised in a step's own process (the cause of the error raised here)."""


def _send(fd: int, message: tuple) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


class _Reader:
    """Length-prefixed pickles from a pipe, read as they come (`messages`)."""

    def __init__(self, fd: int):
        self.fd, self.buffer, self.closed = fd, b"", False

    def messages(self, timeout: float):
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            chunk = os.read(self.fd, 1 << 20)
            self.closed = not chunk
            self.buffer += chunk
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + size:
                break
            data, self.buffer = self.buffer[_HEADER.size:_HEADER.size + size], self.buffer[_HEADER.size + size:]
            yield pickle.loads(data)


def _describe(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        return f"was killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
    return f"exited with status {code}"


def run_in_child(name: str, function: Callable, *args, **kwargs) -> Tuple[Any, Optional[float]]:
    """`function(*args, **kwargs)` in a fresh process; (its result, that process's peak resident MiB)."""
    read, write = os.pipe()
    env = dict(os.environ, XTREMEDISTIL_STEP_FD=str(write))
    child = subprocess.Popen([sys.executable, "-m", "xtremedistil_tf.run.isolate"], stdin=subprocess.PIPE,
                             pass_fds=(write,), env=env)
    os.close(write)
    try:
        levels = {name: logging.getLogger(name).getEffectiveLevel() for name in ("", "xtremedistil_tf")}
        child.stdin.write(pickle.dumps((function, args, kwargs, levels),
                                       protocol=pickle.HIGHEST_PROTOCOL))
        child.stdin.close()
    except BrokenPipeError:
        pass   # it ended already: said below
    reader, outcome, forwarded = _Reader(read), None, False
    try:
        # Deferred: a stop signal here is only recorded (and sent on to the child); the interrupt is raised when
        # the child has ended, not while its messages are half read.
        with stop.deferred():
            while outcome is None and not reader.closed:
                if stop.INTERRUPT.is_set() and not forwarded and child.poll() is None:
                    child.send_signal(signal.SIGTERM)
                    forwarded = True
                for message in reader.messages(0.2):
                    if message[0] == "log":
                        record = logging.makeLogRecord(message[1])
                        logging.getLogger(record.name).handle(record)
                    else:
                        outcome = message
            code = child.wait()
    finally:
        os.close(read)
        if child.poll() is None:   # this process is failing on its own: take the child with it
            child.kill()
            child.wait()
    if outcome is None:
        if stop.received() is not None:
            raise KeyboardInterrupt
        raise StepProcessError(f"step {name}: its process {_describe(code)} before it finished; nothing of the "
                               "step was kept (rerun the same command)")
    kind, value, peak = outcome
    if kind == "ok":
        return value, peak
    if kind == "interrupted":
        stop.INTERRUPT.set()
        raise KeyboardInterrupt
    error, text = value
    raise error from ChildTraceback(text)


class _Forward(logging.Handler):
    """Each record, message formatted, to the parent (`run_in_child` hands it to its own handlers)."""

    def __init__(self, fd: int):
        super().__init__()
        self.fd = fd

    def emit(self, record: logging.LogRecord) -> None:
        fields = dict(record.__dict__, msg=record.getMessage(), args=None, exc_info=None)
        if record.exc_info:
            fields["msg"] += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        try:
            _send(self.fd, ("log", {k: v for k, v in fields.items() if _picklable(v)}))
        except OSError:
            pass


def _picklable(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool, tuple))


def _child() -> None:
    fd = int(os.environ.pop("XTREMEDISTIL_STEP_FD"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent sends SIGTERM, once
    stop.install()
    function, args, kwargs, levels = pickle.loads(sys.stdin.buffer.read())
    logging.getLogger().handlers[:] = [_Forward(fd)]
    for name, level in levels.items():   # the parent's: what it would log, the child sends
        logging.getLogger(name).setLevel(level)
    for name in ("tensorflow",):   # its own stderr handler: through the root like every other library's
        logging.getLogger(name).handlers[:] = []
    try:
        with resident.peak_of() as peak, stop.armed():
            value = function(*args, **kwargs)
        outcome = ("ok", value, peak.mib)
    except BaseException as e:  # noqa: BLE001  (handed to the parent, which raises it)
        if stop.received() is not None or isinstance(e, KeyboardInterrupt):
            outcome = ("interrupted", None, None)
        else:
            text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            try:
                error = e if type(pickle.loads(pickle.dumps(e))) is type(e) else None
            except Exception:  # noqa: BLE001  (an exception whose arguments do not make it again)
                error = None
            error = error or RuntimeError(f"{type(e).__name__}: {e}")
            outcome = ("error", (error, text), None)
    stop.finished()
    try:
        _send(fd, outcome)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)   # nothing of TensorFlow's teardown: the result is handed over


if __name__ == "__main__":
    _child()
