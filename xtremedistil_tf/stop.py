"""Ctrl-C (SIGINT) and SIGTERM in the commands: recorded the moment they arrive, acted on where it is safe.

Standard library only, so that it is in place before TensorFlow and transformers load: the package's
`__init__` imports it first and `install()`s it when the process is one of the commands (bin/* or an
installed `xtremedistil-*` script, `is_command`). Three phases:

- before the command's work starts (imports, flag parsing): nothing has been written, so a command
  (`install(exit_before_work=True)`, the package's first line) prints `NOT_STARTED` and ends at once
  with os._exit, in whatever import it landed (TensorFlow's takes 5-15 s on 2 cores); nothing is
  raised inside an import, so no import machinery or C++ layer turns the interrupt into another
  exception. Installed in-process (a test's driver), the signal is only recorded and run_main exits
  with `NOT_STARTED` before the work.
- while the work runs (`armed`): the handler records the signal and raises KeyboardInterrupt, which
  breaks out of blocking reads and Python loops. Where it lands in C++ code (TensorFlow's tf_stack,
  tf.nest, list internals) it may come back as another exception (AssertionError, TypeError,
  SystemError): once a signal has arrived, any exception is the interrupt (`received`).
- inside `deferred()` sections (the renames that commit an artifact, the clean-up of a half-built one)
  the handler only records; the section ends first, then the interrupt is raised.
- after the work has ended (`finished()`): its result is committed, so SIGINT and SIGTERM are ignored
  from then on; Python's shutdown would otherwise put their default action back while TensorFlow's
  objects are torn down, and a signal then would kill a command whose work is complete.

A KeyboardInterrupt Python has to drop (raised in a __del__ or weakref callback) is not printed as
"Exception ignored in ..." once a signal has arrived (`_unraisable`); the training loop checks
`INTERRUPT` after every batch and `raise_if_interrupted` ends it there.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator, List, Optional

# What a command prints when the signal came before any of its work started.
NOT_STARTED = "interrupted before anything was started; nothing was written"

# Set when a stop signal arrives (also by tests and the engine's callers); `_SIGNALS` says which.
INTERRUPT = threading.Event()
_SIGNALS: List[int] = []
_STATE = {"armed": False, "deferred": 0, "pending": False, "installed": False, "unraisable": sys.unraisablehook,
          "exit_before_work": False, "started": False, "console_fd": 2}
_PACKAGE = Path(__file__).resolve().parent


def is_command() -> bool:
    """Whether this process is one of the commands: a script of the checkout's bin/ or an installed
    `xtremedistil-*` console script (argv[0] names it). Not a notebook, a test or a library user."""
    if not sys.argv or not sys.argv[0]:
        return False
    script = Path(sys.argv[0])
    if script.name.startswith("xtremedistil-"):
        return True
    try:
        return script.resolve().parent == _PACKAGE.parent / "bin"
    except OSError:
        return False


def install(exit_before_work: bool = False) -> bool:
    """Record SIGINT and SIGTERM from now on (`_handler`), where their disposition is the default one
    (an ignored SIGINT, as under `nohup ... &`, stays ignored). `exit_before_work`: a signal before the
    work starts (`armed`) prints `NOT_STARTED` and ends the process at once (a command's own process
    only). Main thread only. True if this call installed it (False: already in place, or not the main
    thread)."""
    if _STATE["installed"] or threading.current_thread() is not threading.main_thread():
        return False
    _STATE["exit_before_work"] = exit_before_work
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _handler)
    _STATE["unraisable"] = sys.unraisablehook
    sys.unraisablehook = _unraisable
    _STATE["installed"] = True
    return True


def uninstall() -> None:
    """Python's own handling again (a command run in-process by a test, once it returned)."""
    if not _STATE["installed"]:
        return
    if signal.getsignal(signal.SIGINT) is _handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is _handler:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.unraisablehook = _STATE["unraisable"]
    _STATE["installed"] = False


def _handler(signum, frame) -> None:
    _SIGNALS.append(signum)
    INTERRUPT.set()
    if _STATE["exit_before_work"] and not _STATE["started"]:
        # Nothing written yet: end now, not when the imports do. os._exit: no clean-up runs, and none is owed.
        try:
            os.write(_STATE["console_fd"], (NOT_STARTED + "\n").encode())
        finally:
            os._exit(128 + signum)
    if not _STATE["armed"]:
        return
    if _STATE["deferred"]:
        _STATE["pending"] = True
        return
    raise KeyboardInterrupt


def _unraisable(unraisable) -> None:
    if INTERRUPT.is_set():   # the interrupt, dropped where Python cannot raise it: the run stops anyway
        return
    _STATE["unraisable"](unraisable)


def received() -> Optional[int]:
    """The first stop signal that arrived (signal.SIGINT when only INTERRUPT was set), or None."""
    if _SIGNALS:
        return _SIGNALS[0]
    return signal.SIGINT if INTERRUPT.is_set() else None


def exit_status() -> int:
    """128 + the signal, as a shell reports a process the signal ended (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + int(received() or signal.SIGINT)


def raise_if_interrupted() -> None:
    """KeyboardInterrupt when a stop signal has arrived (one whose KeyboardInterrupt may have been lost)."""
    if INTERRUPT.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def armed() -> Iterator[None]:
    """The command's work: a stop signal raises KeyboardInterrupt where it lands (one that came before is
    raised at once). Only in the main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _STATE["started"] = True
    raise_if_interrupted()
    _STATE["armed"] = True
    try:
        yield
    finally:
        _STATE["armed"] = False
        _STATE["pending"] = False


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A section a stop signal does not cut short (a commit's renames, a clean-up): the signal is recorded,
    and raised as KeyboardInterrupt when the section ends (unless it ends by an exception of its own, or
    runs while one is being handled: that one goes on)."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        _STATE["deferred"] += 1
    try:
        yield
    finally:
        if main:
            _STATE["deferred"] -= 1
    if main and not _STATE["deferred"] and _STATE["pending"] and sys.exc_info()[0] is None:
        _STATE["pending"] = False
        raise KeyboardInterrupt


@contextlib.contextmanager
def console_at(fd: int) -> Iterator[None]:
    """`NOT_STARTED` goes to `fd` inside (the terminal's stderr, while _env catches fd 2 during TensorFlow's
    import)."""
    before, _STATE["console_fd"] = _STATE["console_fd"], fd
    try:
        yield
    finally:
        _STATE["console_fd"] = before


def finished() -> None:
    """The work has ended and what it wrote is committed: SIGINT and SIGTERM are ignored from here to the
    process's end (their handler, if still ours; main thread only), so that one arriving while Python and
    TensorFlow shut down cannot turn a completed command into a killed one."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is _handler:
            signal.signal(signum, signal.SIG_IGN)


def reset() -> None:
    """Forget the signals received (an in-process driver running one command after another; tests)."""
    _SIGNALS.clear()
    INTERRUPT.clear()
    _STATE["pending"] = False

