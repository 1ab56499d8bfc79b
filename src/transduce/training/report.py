"""The plain progress lines of a run without a terminal (nohup, cron, SLURM, CI), on stderr:

    step=120 epoch=0 loss=3.4561 ppl=21.34 lr=1.234e-04 gnorm=0.812 tok/s=4520 elapsed=0:01:23 eta=0:12:05
    valid step=500 loss=2.8812 ppl=12.01 bleu=21.37 chrf=45.12

one every ``log_every`` steps (the numbers of ``metrics.jsonl``'s record: the loss, perplexity
and mean gradient norm since the previous line, then ``skipped=N`` once updates were skipped,
training/guard.py) and one per validation (its loss and perplexity, then the task's metrics:
BLEU and chrF, or accuracy). ``eta`` is the time left in the budget: to
``max_steps`` at this process's pace so far, or to ``max_minutes``, whichever ends first.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from transduce.config import TrainConfig
from transduce.console import duration, is_terminal
from transduce.training.progress import Progress

__all__ = [
    "TrainingDisplay",
    "announcement",
    "eta_seconds",
    "run_summary",
    "step_line",
    "step_record",
    "valid_line",
    "valid_record",
]

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
    *,
    step: int,
    epoch: int,
    loss: float,
    ppl: float,
    lr: float,
    grad_norm: float,
    tokens_per_s: float,
    elapsed: float,
    eta: float | None,
    skipped: int = 0,
) -> str:
    line = (
        f"step={step} epoch={epoch} loss={loss:.4f} ppl={ppl:.2f} lr={lr:.3e} "
        f"gnorm={grad_norm:.3f} tok/s={tokens_per_s:.0f} elapsed={duration(elapsed)} "
        f"eta={duration(eta)}"
    )
    return f"{line} skipped={skipped}" if skipped else line


def valid_record(step: int, metrics: Mapping[str, object], seconds: float) -> dict[str, Any]:
    """The ``metrics.jsonl`` record of a validation at ``step`` that took ``seconds``."""
    return {"step": step, "split": "valid", **metrics, "valid_seconds": round(seconds, 2)}


def run_summary(
    reason: str, p: Progress, filtered: int, metrics: Mapping[str, Any]
) -> dict[str, Any]:
    """What a finished run returns (and ``transduce train`` prints): why and where it stopped,
    the pairs left out for max_len and the last validation's ``metrics``."""
    return {
        "stopped_by": reason,
        "step": p.step,
        "epoch": p.epoch,
        "seconds": round(p.elapsed, 2),
        "filtered_pairs": filtered,
        **metrics,
    }


def step_record(
    p: Progress, stats: Mapping[str, float], lr: float, loss_scale: float | None
) -> dict[str, Any]:
    """The ``metrics.jsonl`` record of a log step: the window's numbers (``LossWindow.report``),
    the rate, the skipped updates so far if any, fp16's loss scale if any."""
    record: dict[str, Any] = {
        "step": p.step,
        "epoch": p.epoch,
        "loss": stats["loss"],
        "nll": stats["nll"],
        "ppl": stats["ppl"],
        "lr": lr,
        "grad_norm": stats["grad_norm"],
        "tokens_per_s": stats["tokens_per_s"],
        "data_share": stats["data_share"],
        "elapsed": p.elapsed,
    }
    if p.skipped_updates:
        record["skipped_updates"] = p.skipped_updates
    if loss_scale is not None:
        record["loss_scale"] = loss_scale
    return record


def _number(value: object) -> str:
    if isinstance(value, list):  # accuracy per answer position: 0.98,0.71,0.4
        return ",".join(_number(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return str(value) if isinstance(value, int) else f"{value:.4f}".rstrip("0").rstrip(".")


def valid_line(step: int, metrics: Mapping[str, object]) -> str:
    """``valid step=N loss=.. ppl=..`` then the task's metrics (``bleu=.. chrf=..``,
    ``seq_accuracy=..``), as the validation gave them."""
    parts = [f"valid step={step}"]
    parts += [
        f"{short}={_number(metrics[key])}" for key, short in _VALID_NAMES.items() if key in metrics
    ]
    parts += [
        f"{key}={_number(value)}"
        for key, value in metrics.items()
        if key not in _VALID_NAMES and key not in _VALID_HIDDEN
    ]
    return " ".join(parts)


def announcement(
    t: TrainConfig, world_size: int, device: object, precision: str, pairs: int, filtered: int
) -> str:
    """The line a run starts with: processes, device, precision, tokens per update, data."""
    per_update = t.max_tokens * t.update_freq * world_size
    dropped = f" ({filtered} longer than max_len dropped)" if filtered else ""
    return (
        f"transduce: training on {world_size} process(es), device {device}, precision "
        f"{precision}: up to {t.max_tokens} tokens per batch x update_freq {t.update_freq} x "
        f"{world_size} = {per_update} tokens per update; {pairs} training pairs{dropped}"
    )


class TrainingDisplay:
    """What a run shows while it trains (rank 0, unless silenced): on a terminal the bar, which
    counts optimizer steps towards ``max_steps`` with the loss, learning rate, tokens/s and,
    under ``max_minutes``, the minutes left; without one the plain lines of this module."""

    def __init__(self, t: TrainConfig, p: Progress, *, shown: bool, started: float) -> None:
        self.t, self.p = t, p
        terminal = is_terminal(sys.stderr)
        self.plain = shown and not terminal
        self.bar = tqdm(
            total=t.max_steps,
            initial=p.step,
            disable=not (shown and terminal),
            dynamic_ncols=True,
            desc="train",
        )
        self._pace_from = (p.step, started)  # for the ETA of the plain lines

    def logged(self, stats: Mapping[str, float], lr: float) -> None:
        """A log step's loss, perplexity and tokens/s (``LossWindow.report``) at rate ``lr``."""
        t, p = self.t, self.p
        postfix = {
            "loss": f"{stats['loss']:.3f}",
            "lr": f"{lr:.2e}",
            "gnorm": f"{stats['grad_norm']:.3f}",
            "tok_s": f"{stats['tokens_per_s']:.0f}",
        }
        if p.skipped_updates:
            postfix["skipped"] = str(p.skipped_updates)
        if t.max_minutes:  # tqdm's ETA is for max_steps; this is for the budget
            postfix["left"] = f"{max(t.max_minutes - p.elapsed / 60, 0.0):.1f}m"
        self.bar.set_postfix(postfix)
        if self.plain:
            first_step, first_time = self._pace_from
            eta = eta_seconds(
                p, t, steps_here=p.step - first_step, seconds_here=time.monotonic() - first_time
            )
            line = step_line(
                step=p.step,
                epoch=p.epoch,
                loss=stats["loss"],
                ppl=stats["ppl"],
                lr=lr,
                grad_norm=stats["grad_norm"],
                tokens_per_s=stats["tokens_per_s"],
                elapsed=p.elapsed,
                eta=eta,
                skipped=p.skipped_updates,
            )
            print(line, file=sys.stderr, flush=True)

    def validated(self, metrics: Mapping[str, object]) -> None:
        if self.plain and metrics:  # (no validation data: nothing to say)
            print(valid_line(self.p.step, metrics), file=sys.stderr, flush=True)

    def note(self, line: str) -> None:
        """A line that must be seen whatever the display (a skipped update): above the bar on a
        terminal, else on stderr, even when progress is silenced."""
        if not self.bar.disable:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def advance(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
