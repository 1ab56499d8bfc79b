"""The run's metrics: ``metrics.jsonl`` (one JSON object per line) and TensorBoard event files."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from transduce.checkpoint import write_text_atomic

_tensorboard_notice_shown = False


def _summary_writer(log_dir: Path, purge_step: int | None) -> Any:  # a SummaryWriter, or None
    """A TensorBoard SummaryWriter, or None (with a one-time notice) without tensorboard."""
    global _tensorboard_notice_shown
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        if not _tensorboard_notice_shown:
            _tensorboard_notice_shown = True
            print(
                "transduce: note: tensorboard is not installed, metrics go to metrics.jsonl only "
                "(pip install 'transduce[tensorboard]' to get event files)",
                file=sys.stderr,
            )
        return None
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)


class MetricsLog:
    """Appends records to ``run_dir/metrics.jsonl`` and, if asked, to TensorBoard.

    Records of training steps carry ``step``; validation records also ``"split": "valid"``.
    """

    def __init__(self, run_dir: Path, *, tensorboard: bool) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.tb_dir = run_dir / "tensorboard"
        self.tensorboard = tensorboard
        self._writer = None
        # lines a failed write (a full disk) left unwritten, and that failure: written at the
        # next try (``write``, ``flush``)
        self.unwritten: list[str] = []
        self.error: OSError | None = None

    def reset(self) -> None:
        self.path.write_text("")

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step``: a resumed run redoes them. A line that is not a
        record (a write cut short by a kill or a full disk) is dropped, with a note naming it."""
        kept = []
        if self.path.exists():
            text = self.path.read_bytes().decode("utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    record_step = record.get("step", 0) if isinstance(record, dict) else None
                except ValueError:
                    record_step = None
                if not isinstance(record_step, int):
                    print(
                        f"transduce: note: {self.path}: line {number} is not a record (a write "
                        "cut short?): dropped",
                        file=sys.stderr,
                    )
                elif record_step <= step:
                    kept.append(line)
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def flush(self) -> None:
        """Append the records a failed write left (an OSError where it fails again: the file
        cut back to where it was, so that a part written is not written twice)."""
        if not self.unwritten:
            return
        data = "".join(self.unwritten).encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                done = 0
                while done < len(data):
                    done += os.write(fd, data[done:])
            except OSError:
                try:
                    os.ftruncate(fd, start)
                except OSError:  # (not a regular file: /dev/full)
                    pass
                raise
        finally:
            os.close(fd)
        self.unwritten, self.error = [], None

    def open(self, step: int) -> None:
        if self.tensorboard and self._writer is None:
            # purge_step: TensorBoard drops the killed run's events for steps being redone.
            self._writer = _summary_writer(self.tb_dir, step + 1 if step else None)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record``; a number that is not finite is written as the string ``"nan"``,
        ``"inf"`` or ``"-inf"``: a bare ``NaN`` is not JSON, and readers of it would choke."""
        shown = {
            k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in record.items()
        }
        self.unwritten.append(json.dumps(shown) + "\n")
        try:
            self.flush()
        except OSError as e:  # kept for the next try; the run's next checkpoint stops it
            if self.error is None:
                print(
                    f"transduce: warning: cannot write {self.path}: {e.strerror or e}; its "
                    "records wait, and the run stops at its next checkpoint unless they can "
                    "be written then",
                    file=sys.stderr,
                    flush=True,
                )
            self.error = e
        if self._writer is not None:
            group = record.get("split", "train")
            for key, value in record.items():
                if key not in ("step", "split", "epoch") and isinstance(value, int | float):
                    self._writer.add_scalar(f"{group}/{key}", value, record["step"])
