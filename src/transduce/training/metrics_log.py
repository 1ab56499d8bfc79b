"""The run's metrics: ``metrics.jsonl`` (one JSON object per line) and TensorBoard event files."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

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

    def reset(self) -> None:
        self.path.write_text("")

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step``: a resumed run redoes them."""
        kept = []
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip() and json.loads(line).get("step", 0) <= step:
                    kept.append(line)
        self.path.write_text("".join(line + "\n" for line in kept))

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
        record = {
            k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in record.items()
        }
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self._writer is not None:
            group = record.get("split", "train")
            for key, value in record.items():
                if key not in ("step", "split", "epoch") and isinstance(value, int | float):
                    self._writer.add_scalar(f"{group}/{key}", value, record["step"])
