"""The loss a log line reports: the token-weighted mean over the updates since the last line.

One batch's loss swings with its sentence lengths (batches are bucketed by length), so a line
reports the mean over its window, with the target tokens per second of training alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


@dataclass
class LossWindow:
    """Sums of loss and NLL (per-token means times tokens) since the window started."""

    tokens: int = 0
    loss: float = 0.0
    nll: float = 0.0
    start: float = field(default_factory=time.monotonic)

    def add(self, loss: float, nll: float, n_tokens: int) -> None:
        """One update's mean loss and NLL per token over its ``n_tokens`` target tokens."""
        self.tokens += n_tokens
        self.loss += loss * n_tokens
        self.nll += nll * n_tokens

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` (a validation) out of the window's training time."""
        self.start += seconds

    def report(self) -> dict[str, float]:
        """``loss``, ``nll``, ``ppl`` and ``tokens_per_s`` of the window; then a new window."""
        now = time.monotonic()
        n = max(self.tokens, 1)
        out = {
            "loss": self.loss / n, "nll": self.nll / n, "ppl": math.exp(min(self.nll / n, 50.0)),
            "tokens_per_s": self.tokens / max(now - self.start, 1e-9),
        }  # fmt: skip
        self.tokens, self.loss, self.nll, self.start = 0, 0.0, 0.0, now
        return out


__all__ = ["LossWindow"]
