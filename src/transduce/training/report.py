"""The plain progress lines of a run without a terminal (nohup, cron, SLURM, CI), on stderr:

    step=120 epoch=0 loss=3.4561 ppl=21.34 lr=1.234e-04 tok/s=4520 elapsed=0:01:23 eta=0:12:05
    valid step=500 loss=2.8812 ppl=12.01 bleu=21.37 chrf=45.12

one every ``log_every`` steps (the numbers of ``metrics.jsonl``'s record: the loss and
perplexity since the previous line) and one per validation (its loss and perplexity, then the
task's metrics: BLEU and chrF, or accuracy). ``eta`` is the time left in the budget: to
``max_steps`` at this process's pace so far, or to ``max_minutes``, whichever ends first.
"""

from __future__ import annotations

from collections.abc import Mapping

from transduce.config import TrainConfig
from transduce.console import duration
from transduce.training.progress import Progress

__all__ = ["eta_seconds", "step_line", "valid_line"]

# validation keys shown under shorter names, first; the rest follow in their order
_VALID_NAMES = {"valid_loss": "loss", "valid_ppl": "ppl"}
_VALID_HIDDEN = {"valid_nll", "neg_valid_nll", "valid_seconds", "step", "split"}


def eta_seconds(
    p: Progress, t: TrainConfig, *, steps_here: int, seconds_here: float
) -> float | None:
    """Seconds until the run's budget ends: ``max_steps`` at the pace of the ``steps_here``
    steps this process took in ``seconds_here`` seconds, or ``max_minutes`` of training
    (``p.elapsed`` counts across resumes), whichever comes first; None before any step."""
    left: list[float] = []
    if steps_here > 0 and seconds_here > 0:
        left.append(max(t.max_steps - p.step, 0) * seconds_here / steps_here)
    if t.max_minutes:
        left.append(max(t.max_minutes * 60 - p.elapsed, 0.0))
    return min(left) if left else None


def step_line(
    *, step: int, epoch: int, loss: float, ppl: float, lr: float, tokens_per_s: float,
    elapsed: float, eta: float | None,
) -> str:  # fmt: skip
    return (f"step={step} epoch={epoch} loss={loss:.4f} ppl={ppl:.2f} lr={lr:.3e} "
            f"tok/s={tokens_per_s:.0f} elapsed={duration(elapsed)} eta={duration(eta)}")  # fmt: skip


def _number(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return str(value) if isinstance(value, int) else f"{value:.4f}".rstrip("0").rstrip(".")


def valid_line(step: int, metrics: Mapping[str, object]) -> str:
    """``valid step=N loss=.. ppl=..`` then the task's metrics (``bleu=.. chrf=..``,
    ``seq_accuracy=..``), as the validation gave them."""
    parts = [f"valid step={step}"]
    parts += [f"{short}={_number(metrics[key])}" for key, short in _VALID_NAMES.items()
              if key in metrics]  # fmt: skip
    parts += [f"{key}={_number(value)}" for key, value in metrics.items()
              if key not in _VALID_NAMES and key not in _VALID_HIDDEN]  # fmt: skip
    return " ".join(parts)
