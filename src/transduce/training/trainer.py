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
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from transduce import checkpoint
from transduce.architectures import Seq2Seq
from transduce.config import Config
from transduce.data.batching import (
    Batch,
    Pair,
    collate,
    length_index,
    select_pairs,
    token_batch_arrays,
)
from transduce.data.vocab import PAD, Vocab
from transduce.errors import UserError
from transduce.training import distributed
from transduce.training.loss import label_smoothed_nll
from transduce.training.loss_window import LossWindow
from transduce.training.metrics_log import MetricsLog
from transduce.training.optimizer import make_optimizer
from transduce.training.precision import autocast, grad_scaler, resolve_precision
from transduce.training.progress import Progress, budget_spent, stop_reason
from transduce.training.report import TrainingDisplay, announcement
from transduce.training.resume import load_training_state, restore_position
from transduce.training.rng import rng_state, seed_all
from transduce.training.schedule import cooldown, rate
from transduce.training.validation import validation_loss

# The task's validation metrics: numbers, or lists of numbers (accuracy per answer position)
Validator = Callable[[Seq2Seq], dict[str, Any]]
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
    ) -> None:
        """``resegment``, when given, supplies each epoch's training pairs in place of
        ``train_pairs`` (which still decide ``n_filtered``); it must return the same pairs for the
        same epoch, on every rank and after a resume, so that batches can be recomputed.
        ``callbacks`` are called with the progress after every update (and its checkpoint)."""
        self.cfg, self.model, self.vocab = cfg, model, vocab
        t = cfg.train
        self.world, self.device = distributed.init_from_env(t.device)
        self.model.to(self.device)
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self._use_pairs(train_pairs)
        self.n_filtered = len(train_pairs) - len(self.pairs)
        self.resegment = resegment
        self.callbacks = tuple(callbacks)
        self.valid_pairs = list(valid_pairs)
        self.validator = validator
        self.score_key = score_key
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
        self.ddp = None
        if self.world.distributed:
            # The only buffers (sinusoid tables) are equal on every rank: no need to sync them
            # each step. Newer torch renames the option; the old name still works there.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                self.ddp = DistributedDataParallel(self.model, broadcast_buffers=False)

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
        return {
            "config": self.cfg.to_dict(),
            "vocab": self.vocab.to_dict(),
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
        }

    def save(self) -> Path:
        """Write ``checkpoints/step_N.pt`` with everything needed to resume; prune old ones.

        Every rank must call it (the RNG states of all ranks are gathered); rank 0 writes.
        """
        rngs = distributed.all_gather_objects(rng_state(self.device), self.world)
        path = checkpoint.step_path(self.ckpt_dir, self.progress.step)
        if self.world.is_main:
            state = self._model_state()
            state.update(
                optimizer=self.optimizer.state_dict(),
                scaler=self.scaler.state_dict(),  # {} unless fp16
                progress=vars(self.progress).copy(),
                rng=rngs[0],
                rng_ranks=rngs,
            )
            checkpoint.save(state, path)
            checkpoint.prune(self.ckpt_dir, self.cfg.train.keep_last)
        distributed.barrier(self.world)
        return path

    def _resume(self) -> None:
        path = checkpoint.step_checkpoints(self.ckpt_dir)[-1]
        state = checkpoint.load(path)
        load_training_state(state, path, self.model, self.optimizer, self.scaler)
        self.progress = restore_position(state, path, self.world, self.cfg.train.seed, self.device)
        if self.world.is_main:
            self.log.truncate_after(self.progress.step)

    def _log(self, record: dict[str, Any]) -> None:
        if self.world.is_main:
            self.log.write(record)

    # --- one update -----------------------------------------------------------------------------

    def _update(self, group: list[Batch]) -> tuple[float, float, int]:
        """Forward/backward over ``group`` (update_freq batches), then one Adam step.

        The loss is normalised by the target tokens of the whole group on all ranks, so
        accumulating k batches, or spreading them over k ranks, gives the same update as one
        batch holding all of them. Returns the update's mean loss and NLL per token (over all
        ranks) and the number of target tokens.
        """
        t = self.cfg.train
        self.model.train()
        net = self.ddp if self.ddp is not None else self.model
        (n_tokens,) = distributed.all_reduce_sum(
            [sum(b.n_tokens for b in group)], self.world, self.device
        )
        # DDP averages gradients over ranks; scaling by the world size makes that a sum.
        scale = self.world.size / n_tokens
        # (loss, NLL) of each batch, read once per update: reading a GPU's number waits for
        # all its queued work
        sums_per_batch: list[torch.Tensor] = []
        for i, batch in enumerate(group):
            batch = batch.to(self.device)
            last = i == len(group) - 1
            sync = nullcontext() if self.ddp is None or last else self.ddp.no_sync()
            with sync:
                with autocast(self.precision, self.device):
                    logits = net(batch.src, batch.tgt_in)
                sums = label_smoothed_nll(
                    logits, batch.tgt_out, epsilon=t.label_smoothing, ignore_index=PAD
                )
                self.scaler.scale(sums.loss * scale).backward()
            sums_per_batch.append(torch.stack([sums.loss.detach(), sums.nll.detach()]))
        local = torch.stack(sums_per_batch).to("cpu", torch.float64).sum(0).tolist()
        loss_sum, nll_sum = distributed.all_reduce_sum(local, self.world, self.device)
        if t.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_norm)
        lr = rate(
            self.progress.step + 1, d_model=self.cfg.model.d_model, warmup=t.warmup, factor=t.lr_factor
        ) * cooldown(self._budget_done, fraction=t.cooldown)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.scaler.step(self.optimizer)  # optimizer.step(), skipped on inf/NaN under fp16
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum / n_tokens, nll_sum / n_tokens, int(n_tokens)

    # --- validation -----------------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        """Validation loss and perplexity, plus the task's own metrics from ``validator``."""
        self.model.eval()
        out: dict[str, float] = {}
        if self.valid_pairs:
            out.update(validation_loss(
                self.model, self.valid_pairs, max_tokens=self.cfg.train.max_tokens,
                label_smoothing=self.cfg.train.label_smoothing, device=self.device,
            ))  # fmt: skip
        if self.validator is not None:
            out.update(self.validator(self.model))
        return out

    def _validate_and_decide(self) -> tuple[dict[str, float], str | None]:
        """Rank 0 validates, logs, keeps best.pt and decides on early stopping; all ranks
        learn the decision (validating on every rank could disagree on a GPU and hang)."""
        metrics: dict[str, float] = {}
        reason = None
        if self.world.is_main:
            started = time.monotonic()
            metrics = self.validate()
            self._log({"step": self.progress.step, "split": "valid", **metrics,
                       "valid_seconds": round(time.monotonic() - started, 2)})  # fmt: skip
            reason = self._after_validation(metrics)
            if self.display is not None:
                self.display.validated(metrics)
        self.progress.last_valid_step = self.progress.step
        metrics, reason = distributed.all_gather_objects((metrics, reason), self.world)[0]
        return metrics, reason

    # --- the loop -------------------------------------------------------------------------------

    def _should_stop(self, started: float, base_elapsed: float) -> str | None:
        """Why to stop now, or None; also updates the share of the budget spent."""
        minutes = 0.0
        if self.cfg.train.max_minutes:
            # Clocks differ between ranks: all use the mean, so that all stop together and
            # take the same learning rate.
            elapsed = base_elapsed + time.monotonic() - started
            (total,) = distributed.all_reduce_sum([elapsed], self.world, self.device)
            minutes = total / self.world.size / 60
        self._budget_done = budget_spent(self.progress, self.cfg.train, minutes)
        return stop_reason(self.progress, self.cfg.train, minutes)

    def _after_validation(self, metrics: dict[str, float]) -> str | None:
        t, p = self.cfg.train, self.progress
        score = metrics.get(self.score_key, -math.inf)
        if score > p.best_score:
            p.best_score, p.bad_evals = score, 0
            checkpoint.save(self._model_state(), self.run_dir / "best.pt")
        else:
            p.bad_evals += 1
        if t.patience and p.bad_evals >= t.patience:
            return "early_stopping"
        if t.target_seq_accuracy and metrics.get("seq_accuracy", 0.0) >= t.target_seq_accuracy:
            return "target_seq_accuracy"
        return None

    def _announce(self) -> None:
        if self.world.is_main:
            print(announcement(self.cfg.train, self.world.size, self.device, self.precision,
                               len(self.pairs), self.n_filtered), file=sys.stderr)  # fmt: skip

    def train(self) -> dict[str, Any]:
        """Run until a stopping condition; always leaves ``model.pt``. Returns a summary."""
        started, base_elapsed = time.monotonic(), self.progress.elapsed
        self._announce()
        if self.world.is_main:
            self.log.open(self.progress.step)
        try:
            return self._train(started, base_elapsed)
        finally:
            self.log.close()

    def _epoch_batches(self) -> list[np.ndarray]:
        """The batches of this rank for the current epoch; called once as each epoch starts (or
        resumes), which is when ``resegment`` draws that epoch's pairs."""
        t = self.cfg.train
        if self.resegment is not None:
            self._use_pairs(self.resegment(self.progress.epoch))
        batches = token_batch_arrays(
            self.lengths, t.max_tokens, seed=t.seed, epoch=self.progress.epoch
        )
        return distributed.shard(batches, self.world)

    def _train(self, started: float, base_elapsed: float) -> dict[str, Any]:
        t, p = self.cfg.train, self.progress
        display = self.display = TrainingDisplay(t, p, shown=self.shown, started=started)
        last_metrics: dict[str, float] = {}
        window = LossWindow()  # since the last log line (or since this process started)
        reason = self._should_stop(started, base_elapsed)
        while reason is None:
            batches = self._epoch_batches()
            while reason is None and p.batch_index < len(batches):
                idx = batches[p.batch_index : p.batch_index + t.update_freq]
                p.batch_index += len(idx)
                group = [collate([self.pairs[i] for i in b.tolist()]) for b in idx]
                window.add(*self._update(group))
                p.step += 1
                p.elapsed = base_elapsed + time.monotonic() - started
                if p.step % t.log_every == 0:
                    self._log_step(window, display)
                display.advance()
                if t.eval_every and p.step % t.eval_every == 0:
                    paused = time.monotonic()
                    last_metrics, reason = self._validate_and_decide()
                    window.exclude(time.monotonic() - paused)  # tokens_per_s: training alone
                if p.step % t.save_every == 0:
                    self.save()
                for callback in self.callbacks:
                    callback(p)
                reason = reason or self._should_stop(started, base_elapsed)
            if p.batch_index >= len(batches):
                p.epoch, p.batch_index = p.epoch + 1, 0
                reason = reason or self._should_stop(started, base_elapsed)
        display.close()
        if p.last_valid_step != p.step:
            last_metrics, _ = self._validate_and_decide()
        return self._finish(reason, last_metrics)

    def _log_step(self, window: LossWindow, display: TrainingDisplay) -> None:
        """A metrics line of the window's loss, the learning rate and speed; shown too."""
        p = self.progress
        lr = self.optimizer.param_groups[0]["lr"]
        stats = window.report()
        record = {"step": p.step, "epoch": p.epoch, "loss": stats["loss"], "nll": stats["nll"],
                  "ppl": stats["ppl"], "lr": lr, "tokens_per_s": stats["tokens_per_s"],
                  "elapsed": p.elapsed}  # fmt: skip
        if self.scaler.is_enabled():
            record["loss_scale"] = self.scaler.get_scale()
        self._log(record)
        display.logged(stats, lr)

    def _finish(self, reason: str, last_metrics: dict[str, float]) -> dict[str, Any]:
        t, p = self.cfg.train, self.progress
        self.save()  # the final state, best score included, for --resume with a larger budget
        if self.world.is_main:
            if t.average_last > 1:
                paths = checkpoint.step_checkpoints(self.ckpt_dir)[-t.average_last :]
                final = checkpoint.average(paths)
            else:
                final = self._model_state()
            checkpoint.save(final, self.run_dir / "model.pt")
            if checkpoint.safetensors_available():  # the same model for other tools
                checkpoint.save_safetensors(final, self.run_dir / "model.safetensors")
        distributed.barrier(self.world)
        return {
            "stopped_by": reason,
            "step": p.step,
            "epoch": p.epoch,
            "seconds": round(p.elapsed, 2),
            "filtered_pairs": self.n_filtered,
            **last_metrics,
        }
