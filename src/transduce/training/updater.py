"""One update of the trainer: forward and backward over a group of batches (``update_freq``,
on one rank or several), the gradient norm and clipping, and Adam's step, its numbers read at
once (the divergence guard decides on the host, ``training/guard.py``) or one update late (the
device skips a non-finite update, ``training/late_read.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext

import torch

from transduce import kernels
from transduce.config import TrainConfig
from transduce.data.batching import Batch
from transduce.data.vocab import PAD
from transduce.training import distributed, guard, late_read
from transduce.training.loss import LossMethod, LossSums, label_smoothed_nll
from transduce.training.precision import autocast
from transduce.training.working_weights import WorkingWeights


def forward_backward(
    net: torch.nn.Module,
    batch: Batch,
    *,
    precision: str,
    epsilon: float,
    scale: float,
    scaler: torch.amp.GradScaler,
    loss_method: LossMethod = "auto",
) -> LossSums:
    """The forward and backward pass of one batch (on the model's device) under the concrete
    ``precision``: the label-smoothed loss times ``scale`` (and the fp16 loss scale)
    backpropagated. Returns the loss sums, unread. benchmarks/train_step.py times this very
    function; ``loss_method`` is for it (the trainer takes "auto")."""
    device = batch.src.device
    with autocast(precision, device):
        logits = net(batch.src, batch.tgt_in)  # (B, T, V)
    # the logits are needed for nothing else: the loss writes its gradient into them
    sums = label_smoothed_nll(
        logits,
        batch.tgt_out,
        epsilon=epsilon,
        ignore_index=PAD,
        method=loss_method,
        overwrite_logits=True,
        grad_scale=scale,  # what the backward below hands the loss (the fp16 scale aside)
    )
    del logits
    scaler.scale(sums.loss * scale).backward()
    return sums


class Updater:
    """Makes the updates of a run: ``at_once`` reads each before stepping, ``launch`` and
    ``resolve`` read it one update late. ``working``: bf16-weights' bfloat16 copy, which forward
    and backward run; ``ddp``: the DistributedDataParallel wrapper of ``model``, if any;
    ``loss_method``: the loss's (benchmarks/train_step.py times "reference" too)."""

    def __init__(
        self,
        t: TrainConfig,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        *,
        precision: str,
        world: distributed.World,
        device: torch.device,
        working: WorkingWeights | None,
        ddp: torch.nn.Module | None,
        loss_method: LossMethod = "auto",
    ) -> None:
        self.t, self.model, self.optimizer, self.scaler = t, model, optimizer, scaler
        self.precision, self.world, self.device = precision, world, device
        self.working, self.ddp, self.loss_method = working, ddp, loss_method

    def net(self) -> torch.nn.Module:
        """What forward and backward run: the bfloat16 working copy (bf16-weights), else the
        DDP wrapper if any, else the model."""
        if self.working is not None:
            return self.working.module
        return self.ddp if self.ddp is not None else self.model

    def _fuses(self, group: list[Batch]) -> tuple[bool, bool]:
        """Whether this update of ``group`` is made by ``WorkingWeights.step`` (bf16-weights,
        Adam as it can compute), and whether from the working copy's own gradients (one batch
        on one process: nothing to accumulate in float32)."""
        fused = (
            self.working is not None
            and not self.scaler.is_enabled()
            and self.working.steps(self.optimizer)
        )
        return fused, fused and len(group) == 1 and self.world.size == 1

    def _backward(self, group: list[Batch], scale: float, keep: bool = False) -> torch.Tensor:
        """Forward and backward over the batches of ``group``, each loss times ``scale``; their
        (loss, NLL) sums as a (batches, 2) tensor on the device, unread (reading a GPU's number
        waits for all its queued work). ``keep``: the working copy keeps its gradients."""
        net = self.net()
        ddp = self.ddp
        sums_per_batch: list[torch.Tensor] = []
        for i, batch in enumerate(group):
            batch = batch.to(self.device)
            last = i == len(group) - 1
            sync = nullcontext() if ddp is None or last else ddp.no_sync()  # type: ignore[operator]
            with sync:
                sums = forward_backward(
                    net,
                    batch,
                    precision=self.precision,
                    epsilon=self.t.label_smoothing,
                    scale=scale,
                    scaler=self.scaler,
                    loss_method=self.loss_method,
                )
            if self.working is not None and not keep:
                self.working.gradients_to_master()
            sums_per_batch.append(torch.stack([sums.loss.detach(), sums.nll.detach()]))
        return torch.stack(sums_per_batch)

    def gradients(
        self, group: list[Batch], from_working: bool = False
    ) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Forward/backward over ``group``: (the target tokens of all ranks, the (loss, NLL)
        sums (batches, 2) and the gradient norm before clipping, both unread on the device),
        the gradients clipped; ``from_working`` (``_fuses``): the working copy's gradients kept,
        their norm taken and clipping left to ``WorkingWeights.step``.

        The loss is normalised by the target tokens of the whole group on all ranks, so
        accumulating k batches, or spreading them over k ranks, gives the same update as one
        batch holding all of them."""
        self.model.train()
        if self.working is not None:
            self.working.module.train()
        (n_tokens,) = distributed.all_reduce_sum(
            [sum(b.n_tokens for b in group)], self.world, self.device
        )
        # DDP averages gradients over ranks; scaling by the world size makes that a sum.
        sums = self._backward(group, self.world.size / n_tokens, keep=from_working)
        if from_working and self.working is not None:  # bfloat16 widens exactly: the same norm
            return int(n_tokens), sums, kernels.total_norm(self.working.gradients())
        if self.working is not None:  # (DDP averages the others' during backward)
            distributed.average_gradients(list(self.model.parameters()), self.world)
        self.scaler.unscale_(self.optimizer)  # fp16: the true gradients, to measure and clip
        norm = guard.gradient_norm(list(self.model.parameters()), self.t.clip_norm)
        return int(n_tokens), sums, norm

    def at_once(
        self,
        group: list[Batch],
        lr: float,
        signalled: Callable[[], bool],
        waiting: Callable[[], None] | None = None,
    ) -> guard.Update:
        """Forward/backward over ``group``, then one Adam step at ``lr`` unless the loss or
        the gradient norm is not finite (``training/guard.py``). The losses, the gradient norm,
        whether to skip and ``signalled()`` (whether a stop signal came, asked once the device
        has done the update's work) are read from the device and summed over the ranks once,
        before the step. ``waiting()``, if given, is called just before that read, once the
        update's gradient work is launched (the Trainer starts reading the next batches)."""
        fused, from_working = self._fuses(group)
        n_tokens, sums, norm = self.gradients(group, from_working)
        numbers = late_read.update_numbers(sums, norm)
        if waiting is not None:
            waiting()
        # the one read of the device; the norm is equal on every rank (DDP's gradients are)
        loss, nll, grad_norm = late_read.totals(numbers.to("cpu", torch.float64))
        bad = not math.isfinite(loss + nll + grad_norm)
        loss, nll, bad_ranks, signals = distributed.all_reduce_sum(
            [loss, nll, float(bad), float(signalled())], self.world, self.device
        )
        skipped = None
        if bad_ranks:  # nothing applied: weights, Adam's state, the step and the rate stay
            skipped = guard.drop(self.optimizer, self.scaler, loss, grad_norm, bad_ranks)
            if from_working and self.working is not None:
                self.working.clear_gradients()
        else:
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            if fused and self.working is not None:  # Adam and the working copy in one pass
                coefficient = (
                    guard.clip_coefficient(norm, self.t.clip_norm) if from_working else 1.0
                )
                self.working.step(self.optimizer, coefficient, from_master=not from_working)
            else:
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self._after_step()
        return guard.Update(
            loss / n_tokens, nll / n_tokens, n_tokens, grad_norm, skipped, signals > 0, lr
        )

    def _after_step(self) -> None:
        """What follows Adam's step: the gradients freed, the bfloat16 copy refreshed."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.working is not None:
            self.working.refresh()

    def launch(self, group: list[Batch], lr: float) -> late_read.Pending:
        """``at_once`` without waiting for the device (``training/late_read.py``): the step is
        skipped on the device if not finite, its numbers read by ``resolve``."""
        n_tokens, sums, norm = self.gradients(group)
        pending = late_read.step(self.optimizer, sums, norm, n_tokens, lr)
        self._after_step()
        return pending

    @staticmethod
    def resolve(pending: late_read.Pending, signalled: bool) -> guard.Update:
        """The ``guard.Update`` of a launched update, read (waiting for it if need be)."""
        loss, nll, grad_norm = late_read.read(pending)
        skipped = None
        if not math.isfinite(loss + nll + grad_norm):  # the device skipped it
            skipped = guard.skip_reason(loss, grad_norm, 0.0, None) or f"non-finite NLL ({nll})"
        n = pending.tokens
        return guard.Update(loss / n, nll / n, n, grad_norm, skipped, signalled, pending.lr)


__all__ = ["Updater", "forward_backward"]
