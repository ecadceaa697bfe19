"""What every command shares: common flags, logging to the work dir, one-line errors, and
`--help` that lists the command's own flags grouped by concern."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable, FrozenSet, List, Sequence, Tuple

from absl import app, flags

from xtremedistil_tf import console, stop
from xtremedistil_tf.errors import ConfigError, Interrupted, XtremeDistilError

FLAGS = flags.FLAGS


# (module, title, flags defined before the group started): `flag_group` marks where each group
# of a module's flags begins.
_GROUP_MARKS: List[Tuple[str, str, FrozenSet[str]]] = []


def flag_group(title: str) -> None:
    """The flags defined after this call, until the next call, are listed under `title` by --help."""
    _GROUP_MARKS.append((sys._getframe(1).f_globals["__name__"], title, frozenset(FLAGS)))


def _group_of(name: str, module: str, default: str) -> str:
    title = default
    for mark_module, group, before in _GROUP_MARKS:
        if mark_module != module:
            continue
        if name in before:
            break
        title = group
    return title


def _ours(module: str) -> bool:
    return module.startswith("xtremedistil_tf") or module == "__main__"


def help_text(doc: str, example: str, full: bool = False, subcommands: Sequence[Tuple[str, str]] = ()) -> str:
    """The command's help: its docstring's first line, its `subcommands` ((name, what it does)
    pairs, one line each), its flags (those of xtremedistil_tf's modules) grouped by concern with
    defaults and allowed values, and one example line. `full` adds absl's --flagfile and --undefok
    (TensorFlow's own flags are never listed)."""
    groups: dict = {}
    for module, module_flags in FLAGS.flags_by_module_dict().items():
        if not _ours(module):  # absl's and TensorFlow's own (TPU, profiling, test_srcdir...)
            continue
        for flag in module_flags:
            default_title = "General" if module.endswith(".common") else module.rsplit(".", 1)[-1].capitalize()
            groups.setdefault(_group_of(flag.name, module, default_title), {})[flag.name] = flag
    lines = [doc.strip().splitlines()[0] if doc.strip() else "", ""]
    if subcommands:
        width = max(len(name) for name, _ in subcommands)
        lines += ["Subcommands:", *(f"  {name:<{width}}  {what}" for name, what in subcommands), ""]
    for title, members in groups.items():
        lines.append(f"{title}:")
        for flag in members.values():
            lines.append("  " + _describe(flag))
        lines.append("")
    if full:  # absl's special flags, which are in no module's list
        lines += ["Flag files:", "  --flagfile (default ''): Read more flags from this file, one --name=value a line "
                  "(configs/*.flags); flags given after it override it.",
                  "  --undefok (default ''): Comma-separated flag names that may be given although undefined.", ""]
    lines.append(f"Example: {example}")
    return "\n".join(lines)


def _describe(flag) -> str:
    if flag.boolean:
        name = f"--[no]{flag.name}"
    else:
        name = f"--{flag.name}"
    default = flag.default_as_str if flag.default is not None else "(below)"
    # An enum's help already starts with its values: "<softmax|crf>: ...".
    return f"{name} (default {default}): {' '.join(flag.help.split())}"


def run_app(main: Callable, doc: str, example: str, subcommands: Sequence[Tuple[str, str]] = ()) -> None:
    """absl's app.run, with --help / -h / --helpshort printing `help_text` and --helpfull the
    same with absl's --flagfile and --undefok; a bad flag is one `error:` line and exit 2
    (`parse_flags`)."""
    asked = set(sys.argv[1:])
    if asked & {"--help", "-h", "-?", "--helpshort"} or "--helpfull" in asked:
        print(help_text(doc, example, full="--helpfull" in asked, subcommands=subcommands))
        sys.exit(0)
    app.run(main, flags_parser=parse_flags)


def command(body: Callable[[], None], doc: str, example: str):
    """(main, run) of a command whose work is `body`: `main(argv)`, absl's entry point, runs it
    under `run_main`; `run()`, what bin/ calls, is `run_app` over `main`."""
    def main(argv) -> None:
        del argv
        run_main(body)

    return main, lambda: run_app(main, doc, example)


def define_common_flags() -> None:
    flag_group("General")
    flags.DEFINE_string("work_dir", "", "Directory that holds every artifact of the run.")
    flags.DEFINE_bool("verbose", False, "Show tracebacks and debug logging.")
    flags.DEFINE_bool("no_progress", False, "Hide progress bars (e.g. in CI logs).")


def define_execution_flags(trained: str) -> None:
    """--mixed_precision and --distribution (engine/precision.py, engine/distribute.py) of the
    models a command trains (`trained` names them in the help)."""
    flags.DEFINE_enum("mixed_precision", "float32", ["float32", "mixed_float16", "mixed_bfloat16"],
                      "Keras dtype policy of every model trained or run (float16 with dynamic loss scaling; the CRF "
                      "and the losses stay float32). For GPUs/TPUs; on CPUs float32 is usually fastest.")
    flags.DEFINE_enum("distribution", "none", ["none", "mirrored", "multi_worker"],
                      f"tf.distribute strategy of {trained}: none (one device), mirrored (this machine's GPUs, or "
                      "its CPU), multi_worker (the cluster in TF_CONFIG; run the same command on every worker). "
                      "Batch sizes are global; learning rates are not rescaled (docs/scale.md).")


def int_list(name: str) -> list:
    """The integers of the list flag --<name>; a value that is not one is a one-line ConfigError."""
    try:
        return [int(value) for value in FLAGS[name].value]
    except ValueError:
        raise ConfigError(f"--{name}={','.join(FLAGS[name].value)}: expected integers") from None


def parse_flags(argv):
    """absl's flag parsing for app.run(flags_parser=...), a bad flag being a usage error like the
    others: one `error:` line and exit 2 (absl's own parser exits 1)."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        print(f"error: {one_line(e)} (--help lists the flags)", file=sys.stderr, flush=True)
        sys.exit(2)


def log_to_work_dir(work_dir) -> Path:
    """Also write the run's log to <work_dir>/run.log (appended: a resumed run continues it)."""
    path = Path(work_dir) / "run.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if FLAGS.verbose else logging.INFO)
    return path


def run_main(body: Callable[[], None]) -> None:
    """Run a command; a user error (bad data, flags, dirs) becomes one line on stderr and exit 2,
    Ctrl-C or SIGTERM one line and exit 128 + the signal (130, 143): at any moment, also when the
    interrupt surfaced as another exception (stop.py), and when it came before the work started
    (`stop.NOT_STARTED`).

    Tracebacks are for bugs, or with --verbose.
    """
    console.setup(FLAGS.verbose)
    # bin/* have the handler from the package's first line; a command run in-process (tests' drivers) from here.
    in_process = stop.install()
    try:
        if stop.received() is not None and not FLAGS.verbose:
            _stopped(stop.NOT_STARTED)
        with stop.armed():
            body()
            stop.raise_if_interrupted()   # a signal whose KeyboardInterrupt was swallowed on the way
    except SystemExit as e:
        if stop.received() is None or e.code == stop.exit_status():
            raise
        _stopped("interrupted; rerun the same command to resume")
    except BaseException as e:
        if FLAGS.verbose:
            raise
        if stop.received() is not None or isinstance(e, KeyboardInterrupt):
            _stopped(one_line(e) if isinstance(e, Interrupted) else "interrupted; rerun the same command to resume")
        if isinstance(e, (XtremeDistilError, OSError)):
            print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
            sys.exit(2)
        raise
    finally:
        if in_process:
            stop.uninstall()
            stop.reset()
        else:   # the outcome is decided and said: a signal while the process shuts down changes nothing
            stop.finished()


def _stopped(line: str) -> None:
    """The interrupt's one line, and exit 128 + its signal. Further signals are only recorded from here on."""
    print(line, file=sys.stderr, flush=True)
    sys.exit(stop.exit_status())


def one_line(error: Exception) -> str:
    """The error as one line: `path: reason` for an OSError (a full disk, a read-only dir),
    continuation lines of a longer message joined with '; '."""
    if isinstance(error, OSError) and error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
