"""The divergence guard: an update whose loss or gradient norm is not finite is not applied.

One inf or NaN applied by Adam poisons every weight it reaches, and every checkpoint and average
after it. So each update's loss and total gradient norm (L2, before clipping) are checked before
the optimizer steps; a bad one is skipped: the weights, Adam's state, the step counter and the
learning rate stay as they were (under fp16 the loss scaler still halves its scale, as it always
did for an overflow). Skips are counted in the run's progress (``skipped_updates``, and
``bad_in_row`` for the latest ones in a row), printed and written to ``metrics.jsonl`` (a record
with ``"split": "skipped"``; non-finite numbers as the strings ``"nan"``, ``"inf"``, never bare
``NaN``, which is not JSON). After ``max_bad_updates`` in a row the run stops with ``Diverged``
(exit code 3). Under DDP the decision is taken on numbers summed over all ranks, so every rank
skips the same updates. ``require_finite`` checks weights before any file is written from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transduce import kernels
from transduce.config import TrainConfig
from transduce.errors import Diverged
from transduce.training.progress import Progress


@dataclass(frozen=True)
class Update:
    """What one update did (on all ranks together)."""

    loss: float  # mean loss per target token (not finite when the update was skipped for it)
    nll: float  # mean NLL per target token
    tokens: int  # target tokens
    grad_norm: float  # total L2 norm of the gradients before clipping
    skipped: str | None  # why the update was not applied, or None
    signalled: bool  # a stop signal (training/preemption.py) reached some rank by its end
    lr: float  # the learning rate it was applied at (or would have been)


def gradient_norm(params: Sequence[torch.nn.Parameter], clip_norm: float) -> torch.Tensor:
    """The total L2 norm of the gradients of ``params`` before clipping, and the gradients
    clipped to ``clip_norm`` when it is positive; a 0-dim tensor on their device, left unread
    (reading a GPU's number waits for its queued work: the caller reads it with the losses).
    The norm by ``kernels.total_norm`` (the native kernel for float32 CPU gradients), the
    clipping by foreach kernels (PyTorch's ``clip_grads_with_norm_``)."""
    grads = [p.grad for p in params if p.grad is not None]
    clip_with_norm = getattr(torch.nn.utils, "clip_grads_with_norm_", None)  # torch 2.6 on
    if clip_with_norm is None:
        return torch.nn.utils.clip_grad_norm_(params, clip_norm if clip_norm > 0 else math.inf)
    norm = kernels.total_norm(grads)
    if clip_norm > 0 and grads:
        clip_with_norm(params, clip_norm, norm)
    return norm


def clip_coefficient(norm: torch.Tensor, clip_norm: float) -> float:
    """What clipping to ``clip_norm`` multiplies the gradients by, as PyTorch's
    ``clip_grads_with_norm_`` computes it in float32 (``clip_norm / (norm + 1e-6)``, at most 1);
    1.0 where ``clip_norm`` is 0 (no clipping). For a step that clips as it reads the gradients
    (``WorkingWeights.step``)."""
    if clip_norm <= 0:
        return 1.0
    return float(torch.clamp(clip_norm / (norm + 1e-6), max=1.0))


def skip_reason(
    loss: float, grad_norm: float, bad_ranks: float, loss_scale: float | None
) -> str | None:
    """Why an update must not be applied (None: it may): its summed ``loss`` or its
    ``grad_norm`` is not finite, or ``bad_ranks`` ranks found so. ``loss_scale``: fp16's."""
    if not math.isfinite(loss):
        return f"non-finite loss ({loss})"
    if not math.isfinite(grad_norm):
        at = f" at fp16 loss scale {loss_scale:g}" if loss_scale else ""
        return f"non-finite gradient norm ({grad_norm}){at}"
    if bad_ranks:
        return "non-finite loss or gradient norm on another process"
    return None


def drop(
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    loss: float,
    grad_norm: float,
    bad_ranks: float,
) -> str | None:
    """Drop an update that must not be applied: its gradients are cleared and nothing steps, so
    the weights, Adam's state, the step and the rate stay. Under fp16 the scale backs off
    (halves) for any skip, not only for an overflow. Why it was dropped (``skip_reason``)."""
    scale = scaler.get_scale() if scaler.is_enabled() else None
    optimizer.zero_grad(set_to_none=True)
    if scale is not None:
        scaler.update(scale * scaler.get_backoff_factor())
    return skip_reason(loss, grad_norm, bad_ranks, scale)


def skip_record(p: Progress, update: Update) -> dict[str, Any]:
    """The ``metrics.jsonl`` record of a skipped update (the one after step ``p.step``; its
    non-finite numbers become strings there, ``MetricsLog.write``)."""
    return {
        "step": p.step + 1,
        "split": "skipped",
        "epoch": p.epoch,
        "skipped": update.skipped,
        "loss": update.loss,
        "grad_norm": update.grad_norm,
        "bad_in_row": p.bad_in_row,
        "skipped_updates": p.skipped_updates,
    }


def count(p: Progress, update: Update) -> None:
    """Count ``update`` in ``p``: a skipped one adds to ``skipped_updates`` and ``bad_in_row``,
    an applied one ends the row."""
    if update.skipped is None:
        p.bad_in_row = 0
    else:
        p.skipped_updates += 1
        p.bad_in_row += 1


def stop_if_diverged(p: Progress, update: Update, t: TrainConfig, last_good: Path | None) -> None:
    """``Diverged`` once ``max_bad_updates`` updates in a row were skipped."""
    if p.bad_in_row >= t.max_bad_updates:
        # with no checkpoint there is nothing to resume: the run starts again in a new folder
        then = (
            "resume with --resume --allow-change KEY"
            if last_good is not None
            else "start the run again (in a new folder) with it"
        )
        raise Diverged(
            f"training diverged: {p.bad_in_row} updates in a row were skipped (max_bad_updates), "
            f"the last for a {update.skipped} after step {p.step}; no checkpoint was written from "
            f"them. The last good checkpoint: {last_good or 'none yet'}. A lower lr_factor, a "
            f"longer warmup, clip_norm (1.0, say) or precision fp32 may help: {then}"
        )


def report_skip(
    p: Progress,
    update: Update,
    t: TrainConfig,
    note: Callable[[str], None] | None,
    record: Callable[[dict[str, Any]], None],
    last_good: Path | None,
) -> None:
    """Report the skipped ``update`` (counted in ``p``): a line to ``note`` and a record to
    ``record`` (``metrics.jsonl``), unless ``note`` is None (ranks other than 0); ``Diverged``
    after ``max_bad_updates`` in a row, naming ``last_good``, the checkpoint to resume from."""
    if note is not None:
        note(skip_line(p, update, t))
        record(skip_record(p, update))
    stop_if_diverged(p, update, t, last_good)


def skip_line(p: Progress, update: Update, t: TrainConfig) -> str:
    """What a skipped update prints."""
    return (
        f"transduce: the update after step {p.step} was skipped: {update.skipped} "
        f"({p.bad_in_row} in a row, the run stops at {t.max_bad_updates}; "
        f"{p.skipped_updates} in all)"
    )


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every floating-point tensor holds finite numbers only (one read per device)."""
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if t.is_floating_point():
            flags.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(f).all()) for f in flags.values())


def require_finite(tensors: Iterable[torch.Tensor], path: Path, last_good: Path | None) -> None:
    """Raise ``Diverged`` before ``path`` is written from weights that are not all finite,
    naming ``last_good``, the newest checkpoint to resume from."""
    if not all_finite(tensors):
        raise Diverged(
            f"the weights hold inf or NaN: {path} was not written from them. The last "
            f"good checkpoint: {last_good or 'none yet'}"
        )


__all__ = [
    "Update",
    "all_finite",
    "count",
    "drop",
    "gradient_norm",
    "report_skip",
    "require_finite",
    "skip_line",
    "skip_reason",
    "skip_record",
    "stop_if_diverged",
]
