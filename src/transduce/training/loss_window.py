"""The loss a log line reports: the token-weighted mean over the updates since the last line.

One batch's loss swings with its sentence lengths (batches are bucketed by length), so a line
reports the mean over its window, with the target tokens per second of training alone and the
share of that time spent waiting for data (what reading ahead did not hide).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


@dataclass
class LossWindow:
    """Sums of loss and NLL (per-token means times tokens) and of the updates' gradient norms
    since the window started."""

    tokens: int = 0
    loss: float = 0.0
    nll: float = 0.0
    updates: int = 0
    grad_norm: float = 0.0
    data_wait: float = 0.0
    start: float = field(default_factory=time.monotonic)

    def add(self, loss: float, nll: float, n_tokens: int, grad_norm: float) -> None:
        """One update's mean loss and NLL per token over its ``n_tokens`` target tokens, and
        its gradient norm."""
        self.tokens += n_tokens
        self.loss += loss * n_tokens
        self.nll += nll * n_tokens
        self.updates += 1
        self.grad_norm += grad_norm

    def waited(self, seconds: float) -> None:
        """Count ``seconds`` the loop waited for its next batches."""
        self.data_wait += seconds

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` (a validation) out of the window's training time."""
        self.start += seconds

    def report(self) -> dict[str, float]:
        """``loss``, ``nll``, ``ppl``, ``tokens_per_s``, ``grad_norm`` (the mean over its
        updates) and ``data_share`` (of the training time) of the window; then a new window."""
        now = time.monotonic()
        n, seconds = max(self.tokens, 1), max(now - self.start, 1e-9)
        out = {
            "loss": self.loss / n,
            "nll": self.nll / n,
            "ppl": math.exp(min(self.nll / n, 50.0)),
            "tokens_per_s": self.tokens / seconds,
            "grad_norm": self.grad_norm / max(self.updates, 1),
            "data_share": min(self.data_wait / seconds, 1.0),
        }
        self.tokens, self.loss, self.nll, self.start = 0, 0.0, 0.0, now
        self.updates, self.grad_norm, self.data_wait = 0, 0.0, 0.0
        return out


__all__ = ["LossWindow"]
