"""Preemption: SIGTERM or SIGINT while training ends the run with a resumable checkpoint.

A cluster that preempts a job, or a SLURM time limit, sends SIGTERM and waits a grace period
before SIGKILL; Ctrl-C sends SIGINT. While ``Trainer.train`` runs, ``SignalWatch`` turns either
into a flag. The flag goes into the sum every update already makes over the ranks (no extra
synchronisation), so all ranks learn of a signal that reached any one of them at the end of the
same update; they then write the step checkpoint together (atomically, as every checkpoint) and
stop with ``Preempted`` (exit code 143), naming the checkpoint and the command that resumes it.

A second signal more than ``grace`` seconds after the first ends the process at once, without a
checkpoint (exit code 128 + the signal). Signals within ``grace`` of the first count as the same
request: a scheduler's SIGTERM reaches every process of a job, and torchrun forwards its own to
its workers. Handlers are installed only from the main thread (Python allows no other) and the
previous ones are put back when training ends.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from transduce.errors import Preempted

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _say(line: str) -> None:
    try:
        print(f"transduce: {line}", file=sys.stderr, flush=True)
    except RuntimeError:  # a signal arriving while stderr was being written: stay silent
        pass


class SignalWatch:
    """A context manager that turns SIGTERM and SIGINT into ``received``; see the module."""

    def __init__(
        self,
        *,
        grace: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        exit_now: Callable[[int], Any] = os._exit,
    ) -> None:
        """``clock`` and ``exit_now`` are there for tests."""
        self.grace, self._clock, self._exit_now = grace, clock, exit_now
        self.signum: int | None = None  # the first signal received
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}

    @property
    def received(self) -> bool:
        return self.signum is not None

    def signal_name(self) -> str:
        if self.signum is None:
            return "a signal to another process"
        return signal.Signals(self.signum).name

    def preempted(self, step: int, path: Path, world_size: int) -> Preempted:
        """What a run raises once it has saved the resumable checkpoint ``path`` after
        ``step``, the signal received (by this rank, or by another one)."""
        return Preempted(stopped_message(self.signal_name(), step, str(path), world_size), path)

    def say_if_late(self) -> None:
        """For a run that has finished: a signal received too late to stop it, said."""
        if self.received:
            print(
                f"transduce: {self.signal_name()} came as the run was ending: it finished "
                "instead (model.pt written); there is nothing to resume",
                file=sys.stderr,
            )

    def __enter__(self) -> SignalWatch:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            # None: a handler not installed from Python; the default is the nearest to it
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        now = self._clock()
        if self.signum is None:
            self.signum, self._first_at = signum, now
            _say(
                f"{name} received: stopping after this update with a resumable checkpoint "
                "(send it again to stop at once, without one)"
            )
        elif now - self._first_at > self.grace:
            _say(f"{name} again: stopping now, without a checkpoint")
            self._exit_now(128 + signum)


def stopped_message(signal_name: str, step: int, path: str, world_size: int) -> str:
    """What ``Preempted`` says: where the resumable checkpoint is."""
    ranks = f" (all {world_size} processes: resume under torchrun as before)"
    ranks = ranks if world_size > 1 else ""
    return f"stopped by {signal_name} after step {step}; resumable checkpoint {path}{ranks}"


def resume_command(argv: Sequence[str]) -> str:
    """The command that resumes a run ``transduce`` started with the arguments ``argv``: the
    same ones, with ``--resume``."""
    args = list(argv)
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["transduce", *args])


__all__ = ["SIGNALS", "SignalWatch", "resume_command", "stopped_message"]
