"""An update's numbers read one update late, so that the host never waits for the device.

The trainer reads each update's loss, NLL and gradient norm from the device once, to decide
whether to apply it (``training/guard.py``) and to log it. On a GPU that read waits for every
queued kernel: the host then launches the next update onto an idle device, and a small model's
step is the sum of the host's time and the device's rather than the larger of the two (the
graphed SMALL step on an H200: device busy 34% of the step, benchmarks/RESULTS.md). Here
instead:

- the decision to apply is taken on the device: ``step`` hands fused Adam a ``found_inf`` flag
  (1.0 where the loss, the NLL or the gradient norm is not finite), and the fused kernel then
  changes neither the weights nor Adam's moments nor its step count, as the guard's skip does;
- the numbers are copied to pinned host memory without waiting (``Pending``), and ``read``
  waits for them only after the next update has been queued, when they are long computed.

Measured no faster on an H200 (``pays``: the Trainer reads at once everywhere for now). What
differs from reading at once: the learning rate of the update after a skipped one is
the rate of one step later (the host sets it before it learns of the skip; warm-up's rate then
grows by 1/step, the decay's falls by half of that), and a run that diverges stops after one
more update was queued (nothing is written from it). Even where reading late would pay, the
trainer reads at once for fp16 (the loss scaler reads its own flags), with several ranks, and
where step callbacks look at the weights after every update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def pays(device: torch.device) -> bool:
    """Whether the Trainer reads its updates late on ``device``: nowhere, as measured. On an
    H200 (benchmarks/RESULTS.md, the eighth session of 2026-11-27) SMALL's step read late ran
    at 0.80x / 0.79x the rate of reading at once with its forward and backward on CUDA graphs
    (fp32 / bf16-weights), 0.93x / 1.04x eager: the host time it adds outweighs the wait it
    saves. The paper's base step read late is not measured yet; benchmarks/train_step.py's
    ``*_read_late`` systems force it for that, and the tests keep the path correct."""
    del device
    return False


def applies(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` can skip an update on the device: torch's fused Adam (or AdamW),
    whose kernel takes a ``found_inf`` flag."""
    return isinstance(optimizer, torch.optim.Adam) and all(
        g.get("fused") for g in optimizer.param_groups
    )


@dataclass(frozen=True)
class Pending:
    """An update queued on the device whose numbers are on their way to the host.

    ``numbers`` (2 * batches + 1,) float64 on the host, filled when ``done`` completes: each
    batch's (loss, NLL) sums, then the gradient norm. ``tokens`` and ``lr`` are the host's."""

    numbers: Tensor
    done: torch.cuda.Event | None  # None: on a CPU, filled already
    tokens: int
    lr: float


def update_numbers(sums: Tensor, norm: Tensor) -> Tensor:
    """An update's (loss, NLL) sums (batches, 2) and gradient norm (0-dim) as one vector
    (2 * batches + 1,) on their device: what is read of an update, at once or late."""
    dtype = torch.promote_types(sums.dtype, norm.dtype)
    return torch.cat([sums.flatten().to(dtype), norm.reshape(1).to(dtype)])


def totals(numbers: Tensor) -> tuple[float, float, float]:
    """``update_numbers`` read on the host (float64) -> (loss, NLL, gradient norm), the sums
    over the batches."""
    loss, nll = numbers[:-1].view(-1, 2).sum(0).tolist()
    return loss, nll, numbers[-1].item()


def step(
    optimizer: torch.optim.Optimizer, sums: Tensor, norm: Tensor, tokens: int, lr: float
) -> Pending:
    """One Adam step at ``lr`` that the device skips unless ``sums`` (batches, 2) and ``norm``
    (0-dim) are all finite, and their values on their way to the host, unread."""
    numbers = update_numbers(sums, norm)
    for group in optimizer.param_groups:
        group["lr"] = lr
    # fused Adam reads the flag on the device; it must be a float32 scalar
    optimizer.found_inf = (~torch.isfinite(numbers)).any().float()  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]
    if numbers.device.type == "cpu":
        return Pending(numbers.to(torch.float64), None, tokens, lr)
    host = torch.empty(numbers.shape, dtype=torch.float64, pin_memory=True)
    stream = torch.cuda.current_stream(numbers.device)  # the model's GPU, not the current one
    host.copy_(numbers, non_blocking=True)  # queued on that stream
    done = torch.cuda.Event()
    done.record(stream)
    return Pending(host, done, tokens, lr)


def wait(pending: Pending) -> None:
    """Wait until ``pending``'s numbers have reached the host (its update's step queued after
    them may still run)."""
    if pending.done is not None:
        pending.done.synchronize()


def read(pending: Pending) -> tuple[float, float, float]:
    """(loss, NLL, gradient norm) of ``pending``, summed over its batches; waits for them."""
    wait(pending)
    return totals(pending.numbers)


__all__ = ["Pending", "applies", "pays", "read", "step", "totals", "update_numbers", "wait"]
