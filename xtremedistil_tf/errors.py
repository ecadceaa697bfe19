"""Errors users see. Each names where the problem is and what was expected."""
from __future__ import annotations

from typing import Optional

from xtremedistil_tf import stop


class XtremeDistilError(Exception):
    """Base class: an error whose message alone tells the user what to fix."""


class DataFormatError(XtremeDistilError, ValueError):
    """Malformed input data: names the file, the 1-based line (when known) and what was expected."""

    def __init__(self, path, line: Optional[int], message: str):
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class ConfigError(XtremeDistilError, ValueError):
    """Flags or configuration that cannot work together."""


class WorkDirError(XtremeDistilError):
    """A step's artifact could not be written (a full disk, a read-only dir); nothing of it was kept."""


class DamagedArtifact(XtremeDistilError):
    """A saved model's file (a student, a teacher, an export) is missing or damaged: names the file, what is
    wrong with it and what to do (damage.py)."""


class TrainingDiverged(XtremeDistilError):
    """A training or dev loss became NaN or infinite: names the step, the epoch and the loss.

    `model`: what the engine trained (its epoch lines' name); `step`: the work dir step it
    belongs to, set by WorkDir.run_step (the model's name until then)."""

    def __init__(self, model: str, what: str, value: float, epoch, step: Optional[str] = None):
        self.model, self.what, self.value, self.epoch, self.step = model, what, value, epoch, step
        super().__init__()

    def __str__(self) -> str:
        step = self.step or self.model
        who = f" ({self.model})" if self.step and self.model not in (self.step, "student") else ""
        return (f"step {step}{who}: the {self.what} became {self.value} in epoch {self.epoch}; nothing of the "
                "step was kept (lower its learning rate, or check the data)")


class Interrupted(XtremeDistilError):
    """Ctrl-C or SIGTERM: the run stopped where it was, with the same cleanup as any failure; the command
    exits 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM), as a shell reports a process the
    signal ended."""


# A stop signal (Ctrl-C, SIGTERM) arrived: set by the commands' handler (stop.py), checked by the training loop.
INTERRUPT = stop.INTERRUPT
raise_if_interrupted = stop.raise_if_interrupted
