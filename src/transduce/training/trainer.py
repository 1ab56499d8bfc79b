"""The training loop: token batches, gradient accumulation, the schedule, validation.

Around it, each in a module of its own (in ``training/``): the run folder (``run_folder.py``:
its files, checkpoints, resume), the batch feed (``feed.py``: the pairs, each epoch's batches,
read-ahead), the divergence guard (``guard.py``: non-finite updates skipped, too many in a row
stop the run), preemption (``preemption.py``: SIGTERM/SIGINT stop the run with a resumable
checkpoint), the config-change check of a resume (``config_change.py``) and a full disk
stopping every rank cleanly (``saving.py``).

Distributed: under ``torchrun`` every rank trains on its own shard of the batches with
DistributedDataParallel (see ``training/distributed.py``); the loss of each update is normalised by
the target tokens of all ranks together, so N ranks with update_freq k take the same steps as one
process with update_freq N*k. Only rank 0 writes files; resuming reads the run folder, which must
be on storage that every rank sees.

Progress shows as a bar on a terminal and as plain lines without one (``training/report.py``);
``show_progress=False`` (``--quiet``) silences both.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, NoReturn

import torch

from transduce.architectures import Seq2Seq
from transduce.config import Config
from transduce.data.batching import Batch, Pair
from transduce.data.vocab import PAD, Vocab
from transduce.training import distributed, guard
from transduce.training.compiling import CompiledForward
from transduce.training.feed import BatchFeed, Resegment
from transduce.training.loss import LossMethod, LossSums, label_smoothed_nll
from transduce.training.loss_window import LossWindow
from transduce.training.optimizer import make_optimizer
from transduce.training.precision import autocast, grad_scaler, resolve_precision
from transduce.training.preemption import SignalWatch
from transduce.training.progress import Progress, after_validation, should_stop
from transduce.training.report import (
    TrainingDisplay,
    announcement,
    run_summary,
    step_record,
    valid_record,
)
from transduce.training.rng import seed_all
from transduce.training.run_folder import RunFolder
from transduce.training.schedule import scheduled_rate
from transduce.training.validation import Validator, validate
from transduce.training.working_weights import WorkingWeights

StepCallback = Callable[[Progress], None]


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
    )
    del logits
    scaler.scale(sums.loss * scale).backward()
    return sums


class Trainer:
    """Trains ``model`` on ``train_pairs`` with the recipe in ``cfg.train``."""

    def __init__(
        self,
        cfg: Config,
        model: Seq2Seq,
        vocab: Vocab,
        train_pairs: Sequence[Pair],
        *,
        run_dir: str | Path,
        valid_pairs: Sequence[Pair] = (),
        validator: Validator | None = None,
        score_key: str = "neg_valid_nll",
        resume: bool = False,
        show_progress: bool | None = None,
        resegment: Resegment | None = None,
        callbacks: Sequence[StepCallback] = (),
        allow_change: Sequence[str] = (),
    ) -> None:
        """``resegment``: each epoch's training pairs (``training/feed.py``). ``callbacks`` are
        called with the progress after every update (and its checkpoint), or every skipped one.
        ``allow_change``: config keys a resume may change beyond the free ones
        (``training/config_change.py``)."""
        self.cfg, self.model, self.vocab = cfg, model, vocab
        t = cfg.train
        self.world, self.device = distributed.init_from_env(t.device)
        self.feed = BatchFeed(train_pairs, t, self.world, resegment)
        self.model.to(self.device)
        self.callbacks = tuple(callbacks)
        self.signals = SignalWatch()  # a new one, installed, for each call of train()
        self.valid_pairs, self.validator, self.score_key = list(valid_pairs), validator, score_key
        # a bar on a terminal, else plain lines (training/report.py); rank 0 only
        self.shown = show_progress is not False and self.world.is_main
        self.display: TrainingDisplay | None = None  # made when training starts
        self.optimizer: torch.optim.Optimizer = make_optimizer(
            model, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, weight_decay=t.weight_decay
        )
        self.precision = resolve_precision(t.precision, self.device)
        self.scaler = grad_scaler(self.precision, self.device)
        self._budget_done = 0.0  # share of the budget spent, equal on every rank
        self.folder = RunFolder(Path(run_dir), self)  # it saves and restores the above
        # Dropout differs between ranks; rank 0 draws exactly what a single process would.
        seed_all(t.seed + self.world.rank)
        self.progress = self.folder.start(resume=resume, allow_change=tuple(allow_change))
        # precision bf16-weights: forward and backward on a bfloat16 copy, made after a resume
        # (and, with several ranks, after rank 0's weights reached them all); its float32
        # gradients are averaged over the ranks (_update), not the copy's bfloat16 ones by DDP
        self.working: WorkingWeights | None = None
        if self.precision == "bf16-weights":
            distributed.broadcast_parameters(self.model, self.world)
            self.working = WorkingWeights(self.model)
        self.ddp = distributed.wrap(self.model, self.world) if self.working is None else None
        # train.compile: the DDP wrapper if any, else the model, compiled in place while training
        net = self._net()
        self.compiled = CompiledForward(net, t.compile, self.device, self.precision)

    def save(self) -> Path:
        """Write the step checkpoint of now (``RunFolder.save``); every rank must call it."""
        return self.folder.save(self.progress)

    # --- one update -----------------------------------------------------------------------------

    def _net(self) -> torch.nn.Module:
        """What forward and backward run: the bfloat16 working copy (bf16-weights), else the
        DDP wrapper if any, else the model."""
        if self.working is not None:
            return self.working.module
        return self.ddp if self.ddp is not None else self.model

    def _backward(self, group: list[Batch], scale: float) -> torch.Tensor:
        """Forward and backward over the batches of ``group``, each loss times ``scale``; their
        (loss, NLL) sums as a (batches, 2) tensor on the device, unread (reading a GPU's number
        waits for all its queued work)."""
        net = self._net()
        sums_per_batch: list[torch.Tensor] = []
        for i, batch in enumerate(group):
            batch = batch.to(self.device)
            last = i == len(group) - 1
            sync = nullcontext() if self.ddp is None or last else self.ddp.no_sync()
            with sync:
                sums = forward_backward(
                    net,
                    batch,
                    precision=self.precision,
                    epsilon=self.cfg.train.label_smoothing,
                    scale=scale,
                    scaler=self.scaler,
                )
            if self.working is not None:
                self.working.gradients_to_master()
            sums_per_batch.append(torch.stack([sums.loss.detach(), sums.nll.detach()]))
        return torch.stack(sums_per_batch)

    def _update(self, group: list[Batch]) -> guard.Update:
        """Forward/backward over ``group`` (update_freq batches), then one Adam step unless the
        loss or the gradient norm is not finite (``training/guard.py``).

        The loss is normalised by the target tokens of the whole group on all ranks, so
        accumulating k batches, or spreading them over k ranks, gives the same update as one
        batch holding all of them. The losses, the gradient norm, whether to skip and whether a
        stop signal came are read from the device and summed over the ranks once.
        """
        t = self.cfg.train
        self.model.train()
        if self.working is not None:
            self.working.module.train()
        (n_tokens,) = distributed.all_reduce_sum(
            [sum(b.n_tokens for b in group)], self.world, self.device
        )
        # DDP averages gradients over ranks; scaling by the world size makes that a sum.
        sums = self._backward(group, self.world.size / n_tokens)
        if self.working is not None:  # (DDP averages the others' during backward)
            distributed.average_gradients(list(self.model.parameters()), self.world)
        self.scaler.unscale_(self.optimizer)  # fp16: the true gradients, to measure and clip
        norm = guard.gradient_norm(list(self.model.parameters()), t.clip_norm)
        dtype = torch.promote_types(sums.dtype, norm.dtype)
        local = torch.cat([sums.flatten().to(dtype), norm.reshape(1).to(dtype)])
        local = local.to("cpu", torch.float64)  # the one read of the device
        loss, nll = local[:-1].view(-1, 2).sum(0).tolist()
        grad_norm = local[-1].item()  # equal on every rank: DDP's gradients are
        bad = not math.isfinite(loss + nll + grad_norm)
        loss, nll, bad_ranks, signalled = distributed.all_reduce_sum(
            [loss, nll, float(bad), float(self.signals.received)], self.world, self.device
        )
        skipped = None
        if bad_ranks:  # nothing applied: weights, Adam's state, the step and the rate stay
            skipped = guard.drop(self.optimizer, self.scaler, loss, grad_norm, bad_ranks)
        else:
            lr = scheduled_rate(self.progress.step + 1, self.cfg, self._budget_done)
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            if self.working is not None:
                self.working.refresh()
        return guard.Update(
            loss / n_tokens, nll / n_tokens, int(n_tokens), grad_norm, skipped, signalled > 0
        )

    # --- validation -----------------------------------------------------------------------------

    def validate(self) -> dict[str, Any]:
        """Validation loss and perplexity, plus the task's own metrics from ``validator``."""
        with self.compiled.eager():  # eval mode, other shapes: not worth graphs of their own
            return validate(
                self.model, self.valid_pairs, self.validator, self.cfg.train, self.device
            )

    def _validate_and_decide(self) -> tuple[dict[str, float], str | None]:
        """Rank 0 validates, logs, keeps best.pt and decides on early stopping; all ranks
        learn the decision (validating on every rank could disagree on a GPU and hang)."""
        metrics: dict[str, float] = {}
        reason, best = None, False
        if self.world.is_main:
            started = time.monotonic()
            metrics = self.validate()
            seconds = time.monotonic() - started
            self.folder.record(valid_record(self.progress.step, metrics, seconds))
            reason, best = after_validation(self.progress, self.cfg.train, metrics, self.score_key)
            if self.display is not None:
                self.display.validated(metrics)
        self.progress.last_valid_step = self.progress.step
        gathered = distributed.all_gather_objects((metrics, reason, best), self.world)
        metrics, reason, best = gathered[0]
        if best:
            self.folder.write_best()
        return metrics, reason

    # --- the loop -------------------------------------------------------------------------------

    def _should_stop(self, started: float, base_elapsed: float) -> str | None:
        """Why to stop now, or None; also updates the share of the budget spent."""
        elapsed = base_elapsed + time.monotonic() - started
        reason, self._budget_done = should_stop(
            self.progress, self.cfg.train, elapsed, self.world, self.device
        )
        return reason

    def train(self) -> dict[str, Any]:
        """Run until a stopping condition; always leaves ``model.pt``. Returns a summary.
        Raises a ``RunStopped`` (``Diverged``, ``Preempted``, ``CheckpointNotWritten``) when
        the run stops before that, its last good checkpoint intact."""
        started, base_elapsed = time.monotonic(), self.progress.elapsed
        if self.world.is_main:
            n, filtered = len(self.feed.pairs), self.feed.n_filtered
            line = announcement(
                self.cfg.train, self.world.size, self.device, self.precision, n, filtered
            )
            print(line, file=sys.stderr)
            self.folder.log.open(self.progress.step)
        self.signals = SignalWatch()
        self.compiled.attach()
        try:
            with self.signals:
                summary = self._train(started, base_elapsed)
            self.signals.say_if_late()  # too late to stop it: say why the run did not stop
            return summary
        finally:
            self.compiled.release()
            if self.display is not None:
                self.display.close()
            self.folder.log.close()

    def _train(self, started: float, base_elapsed: float) -> dict[str, Any]:
        t, p = self.cfg.train, self.progress
        display = self.display = TrainingDisplay(t, p, shown=self.shown, started=started)
        last_metrics: dict[str, float] = {}
        window = LossWindow()  # since the last log line (or since this process started)
        reason = self._should_stop(started, base_elapsed)
        while reason is None:
            with self.feed.epoch(p.epoch, self.device) as epoch:
                while reason is None and (group := epoch.next(p, window)) is not None:
                    validated, reason = self._step(group, window, started, base_elapsed)
                    last_metrics = validated if validated is not None else last_metrics
                ended = epoch.ended(p)
            if ended:
                p.epoch, p.batch_index = p.epoch + 1, 0
                reason = reason or self._should_stop(started, base_elapsed)
        display.close()
        if p.last_valid_step != p.step:
            last_metrics, _ = self._validate_and_decide()
        return self._finish(reason, last_metrics)

    def _step(
        self, group: list[Batch], window: LossWindow, started: float, base_elapsed: float
    ) -> tuple[dict[str, float] | None, str | None]:
        """One update on ``group``, then what falls due at its step: a log line, a validation
        (its metrics returned), a checkpoint, the callbacks, a stop signal; why to stop, if so."""
        t, p, display = self.cfg.train, self.progress, self.display
        assert display is not None
        validated, reason = None, None
        self.compiled.start_update()
        update = self._update(group)
        self._report_compile()
        p.elapsed = base_elapsed + time.monotonic() - started
        guard.count(p, update)
        if update.skipped is not None:  # shown, logged; Diverged after max_bad_updates in a row
            note = display.note if self.world.is_main else None
            guard.report_skip(p, update, t, note, self.folder.record, self.folder.last_good())
        else:
            window.add(update.loss, update.nll, update.tokens, update.grad_norm)
            p.step += 1
            if p.step % t.log_every == 0:  # the window's loss, the rate, speed; shown too
                stats, lr = window.report(), self.optimizer.param_groups[0]["lr"]
                scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
                self.folder.record(step_record(p, stats, lr, scale))
                display.logged(stats, lr)
            display.advance()
            if t.eval_every and p.step % t.eval_every == 0:
                paused = time.monotonic()
                validated, reason = self._validate_and_decide()
                window.exclude(time.monotonic() - paused)  # tokens_per_s: training alone
            if p.step % t.save_every == 0:
                self.save()
        for callback in self.callbacks:
            callback(p)
        if update.signalled and reason is None:  # (a run that stops anyway finishes)
            self._preempt()
        return validated, reason or self._should_stop(started, base_elapsed)

    def _report_compile(self) -> None:
        """After the first update with train.compile on: its time and the compiling's, on
        stderr and in metrics.jsonl (``training/compiling.py``)."""
        record = self.compiled.end_update(self.progress.step + 1)  # the step it makes
        if record is not None and self.world.is_main:
            print(self.compiled.line(), file=sys.stderr)
            self.folder.record(record)

    def _preempt(self) -> NoReturn:
        """A resumable checkpoint (unless the last one is of this very moment), then
        ``Preempted``: a stop signal reached a rank (training/preemption.py)."""
        path = self.folder.save_now(self.progress)
        raise self.signals.preempted(self.progress.step, path, self.world.size)

    def _finish(self, reason: str, last_metrics: dict[str, float]) -> dict[str, Any]:
        p = self.progress
        self.save()  # the final state, best score included, for --resume with a larger budget
        self.folder.finish()  # model.pt (averaged over the last checkpoints), model.safetensors
        summary = run_summary(reason, p, self.feed.n_filtered, last_metrics)
        return {**summary, **self.compiled.totals()}  # compile off: nothing added


__all__ = ["StepCallback", "Trainer", "forward_backward"]
