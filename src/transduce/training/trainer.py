"""The training loop: token batches, gradient accumulation, the schedule, checkpoints, resume.

A run folder holds ``metrics.jsonl`` (one JSON object per logged step or validation),
``checkpoints/step_N.pt`` (full state for ``--resume``; the last ``keep_last`` are kept),
``best.pt`` (best validation score) and ``model.pt`` (the final model, averaged when
``average_last`` > 0). With ``tensorboard`` on (the default) and the ``tensorboard`` package
installed, the same numbers go to TensorBoard event files in ``tensorboard/`` (``train/loss``,
``valid/bleu``, ...); without the package a one-line notice says so and training goes on.

Distributed: under ``torchrun`` every rank trains on its own shard of the batches with
DistributedDataParallel (see ``training/distributed.py``); the loss of each update is normalised by
the target tokens of all ranks together, so N ranks with update_freq k take the same steps as one
process with update_freq N*k. Only rank 0 writes files; resuming reads the run folder, which must
be on storage that every rank sees.

Progress shows as a bar on a terminal and as plain lines without one (``training/report.py``);
``show_progress=False`` (``--quiet``) silences both.

Protections: non-finite updates skipped, too many in a row stop the run (``training/guard.py``);
SIGTERM/SIGINT stop it with a resumable checkpoint (``training/preemption.py``); a resume with
another config is refused (``training/config_change.py``); a full disk stops every rank cleanly
(``training/saving.py``).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from transduce import checkpoint
from transduce.architectures import Seq2Seq
from transduce.config import Config
from transduce.data.batching import (
    Batch,
    Pair,
    group_reader,
    length_index,
    select_pairs,
    token_batch_arrays,
)
from transduce.data.read_ahead import ReadAhead
from transduce.data.vocab import PAD, Vocab
from transduce.errors import Preempted, UserError
from transduce.training import config_change, distributed, guard, saving
from transduce.training.loss import label_smoothed_nll
from transduce.training.loss_window import LossWindow
from transduce.training.metrics_log import MetricsLog
from transduce.training.optimizer import make_optimizer
from transduce.training.precision import autocast, grad_scaler, resolve_precision
from transduce.training.preemption import SignalWatch, stopped_message
from transduce.training.progress import Progress, after_validation, should_stop
from transduce.training.report import TrainingDisplay, announcement, step_record
from transduce.training.resume import load_training_state, restore_position, saved_processes
from transduce.training.rng import rng_state, seed_all
from transduce.training.schedule import cooldown, rate
from transduce.training.validation import Validator, validate

# The training pairs of an epoch (its number given), for data drawn anew every epoch (BPE-dropout)
Resegment = Callable[[int], Sequence[Pair]]
StepCallback = Callable[[Progress], None]


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
        """``resegment``, when given, supplies each epoch's training pairs in place of
        ``train_pairs`` (which still decide ``n_filtered``); it must return the same pairs for the
        same epoch, on every rank and after a resume, so that batches can be recomputed.
        ``callbacks`` are called with the progress after every update (and its checkpoint), or
        after every skipped one. ``allow_change``: config keys that a resume may change beyond
        those that change neither the model nor the data (``training/config_change.py``)."""
        self.cfg, self.model, self.vocab = cfg, model, vocab
        t = cfg.train
        self.world, self.device = distributed.init_from_env(t.device)
        if resegment is not None and self.world.distributed:
            # SentencePiece's sampling differs between processes even with one seed, so ranks
            # would cut different batches: data seen twice or not at all, and a hang
            raise UserError(
                f"bpe_dropout with {self.world.size} processes: SentencePiece's BPE-dropout "
                "draws differently in each process, so the ranks' batches would disagree; "
                "train on one process or set bpe_dropout to 0"
            )
        self.model.to(self.device)
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self._use_pairs(train_pairs)
        self.n_filtered = len(train_pairs) - len(self.pairs)
        self.resegment, self.callbacks = resegment, tuple(callbacks)
        self.allow_change = tuple(allow_change)
        self.signals = SignalWatch()  # a new one, installed, for each call of train()
        self._saved_at: tuple[int, int, int] | None = None  # (step, epoch, batch) of the last save
        self.valid_pairs, self.validator, self.score_key = list(valid_pairs), validator, score_key
        # a bar on a terminal, else plain lines (training/report.py); rank 0 only
        self.shown = show_progress is not False and self.world.is_main
        self.display: TrainingDisplay | None = None  # made when training starts
        self.optimizer = make_optimizer(
            model, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, weight_decay=t.weight_decay
        )
        self.precision = resolve_precision(t.precision, self.device)
        self.scaler = grad_scaler(self.precision, self.device)
        self._budget_done = 0.0  # share of the budget spent, equal on every rank
        self.progress = Progress()
        self.log = MetricsLog(self.run_dir, tensorboard=t.tensorboard and self.world.is_main)
        if self.world.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        # Dropout differs between ranks; rank 0 draws exactly what a single process would.
        seed_all(t.seed + self.world.rank)
        if resume and checkpoint.step_checkpoints(self.ckpt_dir):
            self._resume()
        elif self.world.is_main:
            self.log.reset()
        if self.world.is_main:  # after the resume's config check: a refused config is not kept
            (self.run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        self.ddp = distributed.wrap(self.model, self.world)

    def _use_pairs(self, pairs: Sequence[Pair]) -> None:
        """Train on ``pairs`` from now on, less those longer than max_len: chosen by their
        length index (a prepared dataset's is read from disk, no pair is), the kept ones a
        view (``select_pairs``)."""
        max_len = self.cfg.train.max_len
        lengths = length_index(pairs)
        kept = np.flatnonzero(lengths.max(axis=1, initial=0) <= max_len)
        if not len(kept):
            raise UserError(
                f"no training pairs are within max_len={max_len} tokens "
                f"(all {len(pairs)} are longer); raise max_len"
            )
        self.pairs = select_pairs(pairs, kept)
        self.lengths = lengths[kept]

    # --- state --------------------------------------------------------------------------------

    def _model_state(self) -> dict[str, Any]:
        model = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        return {"config": self.cfg.to_dict(), "vocab": self.vocab.to_dict(), "model": model}

    def save(self) -> Path:
        """Write ``checkpoints/step_N.pt`` with everything needed to resume; prune old ones.

        Every rank must call it (the RNG states of all ranks are gathered); rank 0 writes.
        """
        rngs = distributed.all_gather_objects(rng_state(self.device), self.world)
        path = checkpoint.step_path(self.ckpt_dir, self.progress.step)

        def state() -> dict[str, Any]:
            return {**self._model_state(), "optimizer": self.optimizer.state_dict(),
                    "scaler": self.scaler.state_dict(),  # {} unless fp16
                    "progress": vars(self.progress).copy(), "rng": rngs[0],
                    "precision": self.precision,  # as resolved: a resume must keep it
                    "rng_ranks": rngs}  # fmt: skip

        saving.write_model_file(self.world, path, state, self.ckpt_dir)
        if self.world.is_main:
            checkpoint.prune(self.ckpt_dir, self.cfg.train.keep_last, self.cfg.train.save_every)
        self._saved_at = (self.progress.step, self.progress.epoch, self.progress.batch_index)
        return path

    def _resume(self) -> None:
        path = checkpoint.step_checkpoints(self.ckpt_dir)[-1]
        state = checkpoint.load(path)
        before = config_change.Setting(saved_processes(state), state.get("precision"))
        now = config_change.Setting(self.world.size, self.precision)
        change = config_change.check_resume(state["config"], self.cfg, self.allow_change, path,
                                            before, now)  # fmt: skip
        if change and self.world.is_main:
            print(f"transduce: {change}", file=sys.stderr)
        load_training_state(state, path, self.model, self.optimizer, self.scaler)
        self.progress = restore_position(state, path, self.world, self.cfg.train.seed, self.device)
        if self.world.is_main:
            self.log.truncate_after(self.progress.step)

    def _log(self, record: dict[str, Any]) -> None:
        if self.world.is_main:
            self.log.write(record)

    # --- one update -----------------------------------------------------------------------------

    def _backward(self, group: list[Batch], scale: float) -> torch.Tensor:
        """Forward and backward over the batches of ``group``, each loss times ``scale``; their
        (loss, NLL) sums as a (batches, 2) tensor on the device, unread (reading a GPU's number
        waits for all its queued work)."""
        net = self.ddp if self.ddp is not None else self.model
        sums_per_batch: list[torch.Tensor] = []
        for i, batch in enumerate(group):
            batch = batch.to(self.device)
            last = i == len(group) - 1
            sync = nullcontext() if self.ddp is None or last else self.ddp.no_sync()
            with sync:
                with autocast(self.precision, self.device):
                    logits = net(batch.src, batch.tgt_in)
                sums = label_smoothed_nll(
                    logits, batch.tgt_out, epsilon=self.cfg.train.label_smoothing, ignore_index=PAD
                )
                self.scaler.scale(sums.loss * scale).backward()
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
        (n_tokens,) = distributed.all_reduce_sum(
            [sum(b.n_tokens for b in group)], self.world, self.device
        )
        # DDP averages gradients over ranks; scaling by the world size makes that a sum.
        sums = self._backward(group, self.world.size / n_tokens)
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
        if bad_ranks:  # nothing applied: weights, Adam's state, the step and the rate stay
            scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
            self.optimizer.zero_grad(set_to_none=True)
            if scale is not None:  # fp16: the scale backs off (halves) for any skip, not only
                self.scaler.update(scale * self.scaler.get_backoff_factor())  # for an overflow
            why = guard.skip_reason(loss, grad_norm, bad_ranks, scale)
            return guard.Update(loss / n_tokens, nll / n_tokens, int(n_tokens), grad_norm, why,
                                signalled > 0)  # fmt: skip
        lr = rate(
            self.progress.step + 1, d_model=self.cfg.model.d_model, warmup=t.warmup, factor=t.lr_factor
        ) * cooldown(self._budget_done, fraction=t.cooldown)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return guard.Update(loss / n_tokens, nll / n_tokens, int(n_tokens), grad_norm, None,
                            signalled > 0)  # fmt: skip

    # --- validation -----------------------------------------------------------------------------

    def validate(self) -> dict[str, Any]:
        """Validation loss and perplexity, plus the task's own metrics from ``validator``."""
        return validate(self.model, self.valid_pairs, self.validator, self.cfg.train, self.device)

    def _validate_and_decide(self) -> tuple[dict[str, float], str | None]:
        """Rank 0 validates, logs, keeps best.pt and decides on early stopping; all ranks
        learn the decision (validating on every rank could disagree on a GPU and hang)."""
        metrics: dict[str, float] = {}
        reason, best = None, False
        if self.world.is_main:
            started = time.monotonic()
            metrics = self.validate()
            self._log({"step": self.progress.step, "split": "valid", **metrics,
                       "valid_seconds": round(time.monotonic() - started, 2)})  # fmt: skip
            reason, best = after_validation(self.progress, self.cfg.train, metrics, self.score_key)
            if self.display is not None:
                self.display.validated(metrics)
        self.progress.last_valid_step = self.progress.step
        metrics, reason, best = distributed.all_gather_objects(
            (metrics, reason, best), self.world
        )[0]
        if best:
            saving.write_model_file(self.world, self.run_dir / "best.pt", self._model_state,
                                    self.ckpt_dir)  # fmt: skip
        return metrics, reason

    # --- the loop -------------------------------------------------------------------------------

    def _should_stop(self, started: float, base_elapsed: float) -> str | None:
        """Why to stop now, or None; also updates the share of the budget spent."""
        elapsed = base_elapsed + time.monotonic() - started
        reason, self._budget_done = should_stop(self.progress, self.cfg.train, elapsed,
                                                self.world, self.device)  # fmt: skip
        return reason

    def train(self) -> dict[str, Any]:
        """Run until a stopping condition; always leaves ``model.pt``. Returns a summary.
        Raises a ``RunStopped`` (``Diverged``, ``Preempted``, ``CheckpointNotWritten``) when
        the run stops before that, its last good checkpoint intact."""
        started, base_elapsed = time.monotonic(), self.progress.elapsed
        if self.world.is_main:
            print(announcement(self.cfg.train, self.world.size, self.device, self.precision,
                               len(self.pairs), self.n_filtered), file=sys.stderr)  # fmt: skip
            self.log.open(self.progress.step)
        self.signals = SignalWatch()
        try:
            with self.signals:
                summary = self._train(started, base_elapsed)
            if self.signals.received:  # too late to stop it: say why the run did not stop
                print(f"transduce: {self.signals.signal_name()} came as the run was ending: it "
                      "finished instead (model.pt written); there is nothing to resume",
                      file=sys.stderr)  # fmt: skip
            return summary
        finally:
            if self.display is not None:
                self.display.close()
            self.log.close()

    def _epoch_batches(self) -> list[np.ndarray]:
        """The batches of this rank for the current epoch; called once as each epoch starts (or
        resumes), which is when ``resegment`` draws that epoch's pairs."""
        t = self.cfg.train
        if self.resegment is not None:
            self._use_pairs(self.resegment(self.progress.epoch))
        batches = token_batch_arrays(
            self.lengths, t.max_tokens, seed=t.seed, epoch=self.progress.epoch,
            pad_multiple=t.pad_multiple,
        )
        return distributed.shard(batches, self.world)

    def _reader(self, batches: list[np.ndarray]) -> Callable[[int], list[Batch]]:
        """The update starting at batch ``first``, pinned for a CUDA device (the copy overlaps)."""
        pin = self.device.type == "cuda"
        t = self.cfg.train
        return group_reader(self.pairs, batches, t.update_freq, pin=pin, pad_multiple=t.pad_multiple)

    def _train(self, started: float, base_elapsed: float) -> dict[str, Any]:
        t, p = self.cfg.train, self.progress
        display = self.display = TrainingDisplay(t, p, shown=self.shown, started=started)
        last_metrics: dict[str, float] = {}
        window = LossWindow()  # since the last log line (or since this process started)
        reason = self._should_stop(started, base_elapsed)
        while reason is None:
            batches = self._epoch_batches()
            with ReadAhead(self._reader(batches)) as reader:
                while reason is None and p.batch_index < len(batches):
                    first = p.batch_index
                    p.batch_index = min(first + t.update_freq, len(batches))
                    waiting = time.monotonic()
                    ahead = p.batch_index if p.batch_index < len(batches) else None
                    group = reader.get(first, ahead)
                    window.waited(time.monotonic() - waiting)
                    validated, reason = self._step(group, window, started, base_elapsed)
                    last_metrics = validated if validated is not None else last_metrics
            if p.batch_index >= len(batches):
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
        update = self._update(group)
        p.elapsed = base_elapsed + time.monotonic() - started
        guard.count(p, update)
        if update.skipped is not None:
            self._skipped(update, display)
        else:
            window.add(update.loss, update.nll, update.tokens, update.grad_norm)
            p.step += 1
            if p.step % t.log_every == 0:
                self._log_step(window, display)
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

    def _skipped(self, update: guard.Update, display: TrainingDisplay) -> None:
        """Report a skipped update; ``Diverged`` after ``max_bad_updates`` in a row."""
        p, t = self.progress, self.cfg.train
        if self.world.is_main:
            display.note(guard.skip_line(p, update, t))
            self._log(guard.skip_record(p, update))
        guard.stop_if_diverged(p, update, t, saving.last_good(self.ckpt_dir))

    def _preempt(self) -> NoReturn:
        """A resumable checkpoint (unless the last one is of this very moment), then
        ``Preempted``: a stop signal reached a rank (training/preemption.py)."""
        p = self.progress
        if self._saved_at != (p.step, p.epoch, p.batch_index):
            self.save()
        path = checkpoint.step_path(self.ckpt_dir, p.step)
        raise Preempted(
            stopped_message(self.signals.signal_name(), p.step, str(path), self.world.size), path
        )

    def _log_step(self, window: LossWindow, display: TrainingDisplay) -> None:
        """A metrics line of the window's loss, the learning rate and speed; shown too."""
        p = self.progress
        lr = self.optimizer.param_groups[0]["lr"]
        stats = window.report()
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self._log(step_record(p, stats, lr, scale))
        display.logged(stats, lr)

    def _finish(self, reason: str, last_metrics: dict[str, float]) -> dict[str, Any]:
        t, p = self.cfg.train, self.progress
        self.save()  # the final state, best score included, for --resume with a larger budget
        final: dict[str, Any] = {}
        if self.world.is_main:
            if t.average_last > 1:
                paths = checkpoint.step_checkpoints(self.ckpt_dir)[-t.average_last :]
                final = checkpoint.average(paths)
            else:
                final = self._model_state()
        saving.write_model_file(self.world, self.run_dir / "model.pt", lambda: final, self.ckpt_dir)
        if checkpoint.safetensors_available():  # the same model for other tools
            saving.write_model_file(self.world, self.run_dir / "model.safetensors", lambda: final,
                                    self.ckpt_dir, checkpoint.save_safetensors)  # fmt: skip
        return {"stopped_by": reason, "step": p.step, "epoch": p.epoch,
                "seconds": round(p.elapsed, 2), "filtered_pairs": self.n_filtered, **last_metrics}
