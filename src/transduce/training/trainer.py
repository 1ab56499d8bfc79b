"""The training loop: token batches, gradient accumulation, the schedule, checkpoints, resume.

A run folder holds ``metrics.jsonl`` (one JSON object per logged step or validation),
``checkpoints/step_N.pt`` (full state for ``--resume``; the last ``keep_last`` are kept),
``best.pt`` (best validation score) and ``model.pt`` (the final model, averaged when
``average_last`` > 0). With ``tensorboard`` on (the default) and the ``tensorboard`` package
installed, the same numbers go to TensorBoard event files in ``tensorboard/`` (``train/loss``,
``valid/bleu``, ...); without the package a one-line notice says so and training goes on.

The progress bar counts optimizer steps towards ``max_steps`` (so its ETA is for ``max_steps``)
and shows the loss, learning rate, target tokens per second and, under a ``max_minutes`` budget,
the minutes left before it stops the run (``left``).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from transduce.config import Config
from transduce.data.vocab import PAD, Vocab
from transduce.model.transformer import Transformer
from transduce.training import checkpoint
from transduce.training.batching import Batch, Pair, collate, model_lengths, token_batches
from transduce.training.loss import label_smoothed_nll
from transduce.training.schedule import rate

Validator = Callable[[Transformer], dict[str, float]]

_tensorboard_notice_shown = False


def _summary_writer(log_dir: Path, purge_step: int | None):  # noqa: ANN202 - SummaryWriter | None
    """A TensorBoard SummaryWriter, or None (with a one-time notice) without tensorboard."""
    global _tensorboard_notice_shown
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        if not _tensorboard_notice_shown:
            _tensorboard_notice_shown = True
            print(
                "transduce: note: tensorboard is not installed, metrics go to metrics.jsonl only "
                "(pip install 'transduce[tensorboard]' to get event files)",
                file=sys.stderr,
            )
        return None
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)


@dataclass
class Progress:
    """Where the run stands; saved in every checkpoint."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # current epoch (0-based)
    batch_index: int = 0  # next batch of the current epoch's batch list
    elapsed: float = 0.0  # seconds of training so far, across resumes
    best_score: float = -math.inf
    bad_evals: int = 0  # validations since the best one (early stopping)


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    """Trains ``model`` on ``train_pairs`` with the recipe in ``cfg.train``."""

    def __init__(
        self,
        cfg: Config,
        model: Transformer,
        vocab: Vocab,
        train_pairs: Sequence[Pair],
        *,
        run_dir: str | Path,
        valid_pairs: Sequence[Pair] = (),
        validator: Validator | None = None,
        score_key: str = "neg_valid_nll",
        resume: bool = False,
        show_progress: bool | None = None,
    ) -> None:
        self.cfg, self.model, self.vocab = cfg, model, vocab
        t = cfg.train
        self.device = torch.device(t.device)
        self.model.to(self.device)
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.pairs = [p for p in train_pairs if max(len(p[0]), len(p[1])) + 1 <= t.max_len]
        self.n_filtered = len(train_pairs) - len(self.pairs)
        if not self.pairs:
            raise ValueError(f"no training pairs within max_len={t.max_len}")
        self.lengths = model_lengths(self.pairs)
        self.valid_pairs = list(valid_pairs)
        self.validator = validator
        self.score_key = score_key
        self.show_progress = show_progress
        self.optimizer = torch.optim.Adam(
            model.parameters(),
            lr=0.0,
            betas=(t.adam_beta1, t.adam_beta2),
            eps=t.adam_eps,
            weight_decay=t.weight_decay,
        )
        self.progress = Progress()
        self._writer = None  # TensorBoard, opened by train()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(t.seed)
        random.seed(t.seed)
        np.random.seed(t.seed % 2**32)
        if resume:
            self._resume()
        else:
            (self.run_dir / "metrics.jsonl").write_text("")

    # --- state --------------------------------------------------------------------------------

    def _model_state(self) -> dict[str, Any]:
        return {
            "config": self.cfg.to_dict(),
            "vocab": self.vocab.to_dict(),
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
        }

    def save(self) -> Path:
        """Write ``checkpoints/step_N.pt`` with everything needed to resume; prune old ones."""
        state = self._model_state()
        state.update(
            optimizer=self.optimizer.state_dict(),
            progress=vars(self.progress).copy(),
            rng=_rng_state(),
        )
        path = checkpoint.step_path(self.ckpt_dir, self.progress.step)
        checkpoint.save_atomic(state, path)
        checkpoint.prune(self.ckpt_dir, self.cfg.train.keep_last)
        return path

    def _resume(self) -> None:
        found = checkpoint.step_checkpoints(self.ckpt_dir)
        if not found:
            (self.run_dir / "metrics.jsonl").write_text("")
            return
        state = checkpoint.load(found[-1])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = Progress(**state["progress"])
        _set_rng_state(state["rng"])
        # Lines written after the checkpoint belong to steps that will be redone.
        metrics = self.run_dir / "metrics.jsonl"
        kept = []
        if metrics.exists():
            for line in metrics.read_text().splitlines():
                if line.strip() and json.loads(line).get("step", 0) <= self.progress.step:
                    kept.append(line)
        metrics.write_text("".join(line + "\n" for line in kept))

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self._writer is not None:
            group = record.get("split", "train")
            step = record.get("step", self.progress.step)
            for key, value in record.items():
                if key not in ("step", "split", "epoch") and isinstance(value, int | float):
                    self._writer.add_scalar(f"{group}/{key}", value, step)

    def _open_tensorboard(self) -> None:
        if self.cfg.train.tensorboard and self._writer is None:
            # purge_step: a resumed run redoes the steps after its checkpoint; TensorBoard drops
            # the events the killed run had written for them, as metrics.jsonl does.
            step = self.progress.step
            self._writer = _summary_writer(self.run_dir / "tensorboard", step + 1 if step else None)

    def _close_tensorboard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # --- one update -----------------------------------------------------------------------------

    def _update(self, group: list[Batch]) -> tuple[float, float, int]:
        """Forward/backward over ``group`` (update_freq batches), then one Adam step.

        The loss is normalised by the target tokens of the whole group, so accumulating k
        batches gives the same update as one batch holding all of them.
        """
        t = self.cfg.train
        self.model.train()
        n_tokens = sum(b.n_tokens for b in group)
        loss_sum = nll_sum = 0.0
        autocast = torch.autocast(
            device_type=self.device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16"
        )
        for batch in group:
            batch = batch.to(self.device)
            with autocast:
                logits = self.model(batch.src, batch.tgt_in)
            sums = label_smoothed_nll(
                logits, batch.tgt_out, epsilon=t.label_smoothing, ignore_index=PAD
            )
            (sums.loss / n_tokens).backward()
            loss_sum += sums.loss.item()
            nll_sum += sums.nll.item()
        if t.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_norm)
        lr = rate(
            self.progress.step + 1, d_model=self.cfg.model.d_model, warmup=t.warmup, factor=t.lr_factor
        )
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum / n_tokens, nll_sum / n_tokens, n_tokens

    # --- validation -----------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation loss and perplexity, plus the task's own metrics from ``validator``."""
        self.model.eval()
        out: dict[str, float] = {}
        if self.valid_pairs:
            lengths = model_lengths(self.valid_pairs)
            loss = nll = 0.0
            n = 0
            for idx in token_batches(lengths, self.cfg.train.max_tokens, seed=0, epoch=0, shuffle=False):
                b = collate([self.valid_pairs[i] for i in idx]).to(self.device)
                sums = label_smoothed_nll(
                    self.model(b.src, b.tgt_in), b.tgt_out,
                    epsilon=self.cfg.train.label_smoothing, ignore_index=PAD,
                )  # fmt: skip
                loss, nll, n = loss + sums.loss.item(), nll + sums.nll.item(), n + sums.n_tokens
            out.update(valid_loss=loss / n, valid_nll=nll / n, valid_ppl=math.exp(nll / n))
            out["neg_valid_nll"] = -out["valid_nll"]
        if self.validator is not None:
            out.update(self.validator(self.model))
        return out

    # --- the loop -------------------------------------------------------------------------------

    def _should_stop(self, started: float, base_elapsed: float) -> str | None:
        t, p = self.cfg.train, self.progress
        if p.step >= t.max_steps:
            return "max_steps"
        if t.max_epochs and p.epoch >= t.max_epochs:
            return "max_epochs"
        if t.max_minutes and base_elapsed + time.monotonic() - started >= 60 * t.max_minutes:
            return "max_minutes"
        return None

    def _after_validation(self, metrics: dict[str, float]) -> str | None:
        t, p = self.cfg.train, self.progress
        score = metrics.get(self.score_key, -math.inf)
        if score > p.best_score:
            p.best_score, p.bad_evals = score, 0
            checkpoint.save_atomic(self._model_state(), self.run_dir / "best.pt")
        else:
            p.bad_evals += 1
        if t.patience and p.bad_evals >= t.patience:
            return "early_stopping"
        if t.target_seq_accuracy and metrics.get("seq_accuracy", 0.0) >= t.target_seq_accuracy:
            return "target_seq_accuracy"
        return None

    def train(self) -> dict[str, Any]:
        """Run until a stopping condition; always leaves ``model.pt``. Returns a summary."""
        started, base_elapsed = time.monotonic(), self.progress.elapsed
        self._open_tensorboard()
        try:
            return self._train(started, base_elapsed)
        finally:
            self._close_tensorboard()

    def _train(self, started: float, base_elapsed: float) -> dict[str, Any]:
        t, p = self.cfg.train, self.progress
        fault_step = int(os.environ.get("TRANSDUCE_FAULT_AT_STEP", "0"))
        bar = tqdm(
            total=t.max_steps, initial=p.step, disable=self.show_progress is False or None,
            dynamic_ncols=True, desc="train",
        )  # fmt: skip
        last_metrics: dict[str, float] = {}
        validated_at = -1
        window_tokens, window_start = 0, time.monotonic()
        reason = self._should_stop(started, base_elapsed)
        while reason is None:
            batches = token_batches(self.lengths, t.max_tokens, seed=t.seed, epoch=p.epoch)
            while reason is None and p.batch_index < len(batches):
                idx = batches[p.batch_index : p.batch_index + t.update_freq]
                p.batch_index += len(idx)
                group = [collate([self.pairs[i] for i in b]) for b in idx]
                loss, nll, n_tokens = self._update(group)
                p.step += 1
                p.elapsed = base_elapsed + time.monotonic() - started
                window_tokens += n_tokens
                if p.step % t.log_every == 0:
                    now = time.monotonic()
                    tps = window_tokens / max(now - window_start, 1e-9)
                    window_tokens, window_start = 0, now
                    lr = self.optimizer.param_groups[0]["lr"]
                    self._log({"step": p.step, "epoch": p.epoch, "loss": loss, "nll": nll,
                               "ppl": math.exp(min(nll, 50.0)), "lr": lr, "tokens_per_s": tps,
                               "elapsed": p.elapsed})  # fmt: skip
                    postfix = {"loss": f"{loss:.3f}", "lr": f"{lr:.2e}", "tok_s": f"{tps:.0f}"}
                    if t.max_minutes:  # tqdm's ETA is for max_steps; this is for the budget
                        left = max(t.max_minutes - p.elapsed / 60, 0.0)
                        postfix["left"] = f"{left:.1f}m"
                    bar.set_postfix(postfix)
                bar.update(1)
                if t.eval_every and p.step % t.eval_every == 0:
                    paused = time.monotonic()
                    last_metrics, validated_at = self.validate(), p.step
                    seconds = time.monotonic() - paused
                    window_start += seconds  # tokens_per_s measures training alone
                    self._log({"step": p.step, "split": "valid", **last_metrics,
                               "valid_seconds": round(seconds, 2)})  # fmt: skip
                    reason = self._after_validation(last_metrics)
                if p.step % t.save_every == 0:
                    self.save()
                if fault_step and p.step == fault_step:  # tests: die like a killed process
                    os.kill(os.getpid(), signal.SIGKILL)
                reason = reason or self._should_stop(started, base_elapsed)
            if p.batch_index >= len(batches):
                p.epoch, p.batch_index = p.epoch + 1, 0
                reason = reason or self._should_stop(started, base_elapsed)
        bar.close()
        if validated_at != p.step:
            paused = time.monotonic()
            last_metrics = self.validate()
            self._log({"step": p.step, "split": "valid", **last_metrics,
                       "valid_seconds": round(time.monotonic() - paused, 2)})  # fmt: skip
            self._after_validation(last_metrics)
        return self._finish(reason, last_metrics)

    def _finish(self, reason: str, last_metrics: dict[str, float]) -> dict[str, Any]:
        t, p = self.cfg.train, self.progress
        self.save()  # the final state, best score included, for --resume with a larger budget
        if t.average_last > 1:
            paths = checkpoint.step_checkpoints(self.ckpt_dir)[-t.average_last :]
            final = checkpoint.average(paths)
        else:
            final = self._model_state()
        checkpoint.save_atomic(final, self.run_dir / "model.pt")
        return {
            "stopped_by": reason,
            "step": p.step,
            "epoch": p.epoch,
            "seconds": round(p.elapsed, 2),
            "filtered_pairs": self.n_filtered,
            **last_metrics,
        }
