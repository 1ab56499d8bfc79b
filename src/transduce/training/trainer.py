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

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from transduce.architectures import Seq2Seq
from transduce.config import Config
from transduce.data.batching import Batch, Pair
from transduce.data.vocab import Vocab
from transduce.kernels import training_attention
from transduce.training import distributed, guard, late_read
from transduce.training.compiling import CompiledForward
from transduce.training.feed import BatchFeed, Resegment
from transduce.training.loss_window import LossWindow
from transduce.training.optimizer import make_optimizer
from transduce.training.precision import check_precision, grad_scaler, resolve_precision
from transduce.training.preemption import SignalWatch
from transduce.training.progress import (
    Progress,
    after_validation,
    budget_spent,
    stop_reason,
    training_minutes,
)
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
from transduce.training.updater import Updater
from transduce.training.validation import Validator, validate
from transduce.training.working_weights import WorkingWeights

StepCallback = Callable[[Progress], None]


def _nothing() -> None:
    """``Trainer.reading`` before the first epoch."""


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
        check_precision(t.precision, cfg.model.architecture, self.device)  # (Python callers)
        # (a resumed run with precision auto keeps the one it began with: RunFolder.start)
        self.precision = resolve_precision(t.precision, self.device, self.world.size)
        self.scaler = grad_scaler(self.precision, self.device)
        self._budget_done = 0.0  # share of the budget spent, equal on every rank
        self._minutes = 0.0  # of training, the mean of the ranks' (as of _should_stop)
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
        self.updater = Updater(
            t,
            model,
            self.optimizer,
            self.scaler,
            precision=self.precision,
            world=self.world,
            device=self.device,
            working=self.working,
            ddp=self.ddp,
        )
        self.compiled = CompiledForward(self.updater.net(), t.compile, self.device, self.precision)
        self.reads_late = False  # set as training starts (``_reads_late``)
        self._pending: late_read.Pending | None = None  # the update queued unread, if any
        # called once an update's gradient work is launched (before the device is waited for
        # and Adam's step; after the launch when reading late): the epoch's reader starts the
        # next read if it has not (EpochReader.read_ahead); nothing before the first epoch
        self.reading: Callable[[], None] = _nothing

    def _reads_late(self) -> bool:
        """Whether updates are read one update late (``training/late_read.py``): where that
        pays (``late_read.pays``: nowhere, as measured on an H200), with fused Adam, one
        process, no fp16 loss scaler (it reads its own flags) and no step callbacks (they may
        look at the weights after every update)."""
        return (
            late_read.pays(self.device)
            and late_read.applies(self.optimizer)
            and self.world.size == 1
            and not self.scaler.is_enabled()
            and not self.callbacks
        )

    def save(self) -> Path:
        """Write the step checkpoint of now (``RunFolder.save``); every rank must call it."""
        return self.folder.save(self.progress)

    # --- one update -----------------------------------------------------------------------------

    def _update(self, group: list[Batch]) -> guard.Update:
        """One update on ``group``, read at once (``Updater.at_once``)."""
        lr = self._rate(self.progress.step + 1)
        return self.updater.at_once(group, lr, lambda: self.signals.received, self.reading)

    def _rate(self, step: int) -> float:
        """The learning rate of update ``step`` (from 1): with the cool-down's clock at the
        step before it, as ``_should_stop`` left it after that step."""
        done = self._budget_done
        if step > self.progress.step + 1:  # after an update still queued: counted as made
            made = dataclasses.replace(self.progress, step=step - 1)
            done = budget_spent(made, self.cfg.train, self._minutes)
        return scheduled_rate(step, self.cfg, done)

    def _launch(self, group: list[Batch]) -> late_read.Pending:
        """One update on ``group``, left unread (``Updater.launch``), at the rate of the step it
        makes if the update queued before it, if any, is applied."""
        step = self.progress.step + 1 + (self._pending is not None)
        pending = self.updater.launch(group, self._rate(step))
        self.reading()  # the device has the update's work: the next batches can be read
        return pending

    def _resolve(self, pending: late_read.Pending) -> guard.Update:
        """The ``guard.Update`` of a launched update, read (waiting for it if need be)."""
        return self.updater.resolve(pending, self.signals.received)

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
        self._minutes = training_minutes(self.cfg.train, elapsed, self.world, self.device)
        self._budget_done = budget_spent(self.progress, self.cfg.train, self._minutes)
        return stop_reason(self.progress, self.cfg.train, self._minutes)

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
        self.reads_late = self._reads_late()
        self.compiled.attach()
        try:
            with self.signals, training_attention(self.device):
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
                self.reading = epoch.read_ahead  # a no-op once the epoch is closed
                while reason is None and (group := epoch.next(p, window)) is not None:
                    validated, reason = self._step(group, window, started, base_elapsed)
                    last_metrics = validated if validated is not None else last_metrics
                if reason is None:  # the epoch's last update, if still queued (reading late)
                    validated, reason = self._drain(window, started, base_elapsed)
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
        (its metrics returned), a checkpoint, the callbacks, a stop signal; why to stop, if so.
        Reading late (``self.reads_late``), the update stays queued unless something beyond a
        log line falls due: the one queued before it is read and counted instead."""
        self.compiled.start_update()
        if not self.reads_late:
            update = self._update(group)
            self._report_compile()
            return self._after(update, window, started, base_elapsed)
        pending = self._launch(group)
        if self.compiled.timing_first_update():  # its time: the device's work included
            late_read.wait(pending)
        self._report_compile()
        earlier, self._pending = self._pending, pending
        if earlier is not None:  # its step is due for nothing but a log line: counted here
            self._count(self._resolve(earlier), window, started, base_elapsed)
        due = self._due(self.progress.step + 1)
        if not due and self._should_stop(started, base_elapsed) is None:
            return None, None  # left queued
        return self._drain(window, started, base_elapsed)

    def _drain(
        self, window: LossWindow, started: float, base_elapsed: float
    ) -> tuple[dict[str, float] | None, str | None]:
        """Read the queued update, if any, and do what falls due at its step (``_step``)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None, None
        return self._after(self._resolve(pending), window, started, base_elapsed)

    def _due(self, step: int) -> bool:
        """Whether step ``step``, if made, calls for more than a log line: a validation, a
        checkpoint, the end of the run, or a stop signal's checkpoint."""
        t = self.cfg.train
        return (
            step >= t.max_steps
            or step % t.save_every == 0
            or (t.eval_every > 0 and step % t.eval_every == 0)
            or self.signals.received
        )

    def _count(
        self, update: guard.Update, window: LossWindow, started: float, base_elapsed: float
    ) -> None:
        """Count ``update`` in the progress: a skip reported (``Diverged`` after
        max_bad_updates in a row), else the step made, its log line if due, the display."""
        t, p, display = self.cfg.train, self.progress, self.display
        assert display is not None
        p.elapsed = base_elapsed + time.monotonic() - started
        guard.count(p, update)
        if update.skipped is not None:  # shown, logged; Diverged after max_bad_updates in a row
            note = display.note if self.world.is_main else None
            guard.report_skip(p, update, t, note, self.folder.record, self.folder.last_good())
            return
        window.add(update.loss, update.nll, update.tokens, update.grad_norm)
        p.step += 1
        if p.step % t.log_every == 0:  # the window's loss, the rate, speed; shown too
            stats = window.report()
            scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
            self.folder.record(step_record(p, stats, update.lr, scale))
            display.logged(stats, update.lr)
        display.advance()

    def _after(
        self, update: guard.Update, window: LossWindow, started: float, base_elapsed: float
    ) -> tuple[dict[str, float] | None, str | None]:
        """``update`` counted (``_count``), then a validation, a checkpoint, the callbacks and
        a stop signal's checkpoint where due; (its metrics, why to stop)."""
        t, p = self.cfg.train, self.progress
        validated, reason = None, None
        self._count(update, window, started, base_elapsed)
        if update.skipped is None:
            if t.eval_every and p.step % t.eval_every == 0:
                paused = time.monotonic()
                validated, reason = self._validate_and_decide()
                window.exclude(time.monotonic() - paused)  # tokens_per_s: training alone
            if p.step % t.save_every == 0:
                self.save()
        for callback in self.callbacks:
            callback(p)
        reason = reason or self._should_stop(started, base_elapsed)
        if update.signalled and reason is None:  # (a run that stops anyway finishes)
            self._preempt()
        return validated, reason

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


__all__ = ["StepCallback", "Trainer"]
