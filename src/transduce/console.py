"""What long work says on stderr: a tqdm bar on a terminal, plain lines without one.

Under nohup, cron, SLURM or CI stderr is a file or a pipe, tqdm switches itself off, and a run of
an hour would otherwise say nothing. ``is_terminal`` tells the two apart; ``duration`` writes
seconds as ``H:MM:SS``; ``PeriodicLines`` is the plain report of a loop that may take minutes
(translating a test set): one line every ``every_s`` seconds, and a last one at the end when it
wrote any (and has news), so that short work stays silent. (Training writes its own lines, every
``log_every`` steps: ``transduce.training.report``.)
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["PeriodicLines", "duration", "is_terminal"]


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stderr) is a terminal, as tqdm decides it."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False


def duration(seconds: float | None) -> str:
    """``H:MM:SS`` (``?`` when unknown or not finite)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(int(round(seconds)), 0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class PeriodicLines:
    """``what done=N/TOTAL UNIT/s=R elapsed=H:MM:SS eta=H:MM:SS`` every ``every_s`` seconds of
    ``update`` calls, and once more at ``close`` if any was written."""

    def __init__(
        self,
        what: str,
        total: int,
        *,
        unit: str = "items",
        every_s: float = 30.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.stream = stream
        self.clock = clock
        self.started = self.last = clock()
        self.done = self.last_done = 0
        self.lines = 0

    def line(self, now: float) -> str:
        elapsed = now - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else None
        return (
            f"{self.what} done={self.done}/{self.total} {self.unit}/s={rate:.1f} "
            f"elapsed={duration(elapsed)} eta={duration(eta)}"
        )

    def _write(self, now: float) -> None:
        print(self.line(now), file=self.stream or sys.stderr, flush=True)
        self.last, self.last_done = now, self.done
        self.lines += 1

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every_s:
            self._write(now)

    def close(self) -> None:
        if self.lines and self.done != self.last_done:
            self._write(self.clock())
