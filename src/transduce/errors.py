"""The errors the command line turns into a message and an exit code, never a traceback.

``UserError``: bad input, the user's to fix; one line and exit code 2. ``RunStopped``: a training
run that stopped itself on purpose and left its run folder in a known state (diverged, preempted,
its disk full); its message and its own exit code (3, 143, 74), so that a job script or a
scheduler can tell them apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar


class UserError(Exception):
    """Bad input (a config key, a file, an option value). The message names what is wrong."""


class SentenceError(UserError):
    """Bad input in one sentence of a list, said as "sentence K<detail>" (K from 1; ``noun``
    "target" for the second side of pairs). A caller that read the list from a file names the
    file's line instead (``at_line``)."""

    def __init__(self, sentence: int, detail: str, noun: str = "sentence") -> None:
        super().__init__(f"{noun} {sentence}{detail}")
        self.sentence, self.detail, self.noun = sentence, detail, noun

    def at_line(self, name: str, line: int) -> UserError:
        """The same error, about line ``line`` (from 1) of the file ``name``."""
        return UserError(f"{name}: line {line}{self.detail}")


class RunStopped(Exception):
    """A run that stopped before its budget ended, cleanly: the message says why, where its last
    good checkpoint is and what to do; the CLI prints it and exits with ``exit_code``."""

    exit_code: ClassVar[int] = 1


class Diverged(RunStopped):
    """``max_bad_updates`` updates in a row had a non-finite loss or gradient norm (or the
    weights became non-finite): going on would only write poisoned checkpoints."""

    exit_code: ClassVar[int] = 3


class Preempted(RunStopped):
    """SIGTERM or SIGINT: a resumable checkpoint was written at the next step boundary.
    143 = 128 + SIGTERM, what schedulers expect of a process they asked to stop."""

    exit_code: ClassVar[int] = 143

    def __init__(self, message: str, checkpoint: Path) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class CheckpointNotWritten(RunStopped):
    """Writing a checkpoint or model file failed (a full disk, a quota): the last good one
    stays. 74 is EX_IOERR of sysexits.h."""

    exit_code: ClassVar[int] = 74
