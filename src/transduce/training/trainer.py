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

The progress bar counts optimizer steps towards ``max_steps`` (so its ETA is for ``max_steps``)
and shows the loss, learning rate, target tokens per second and, under a ``max_minutes`` budget,
the minutes left before it stops the run (``left``).
"""

from __future__ import annotations

import math
import os
import random
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from transduce.config import Config
from transduce.data.vocab import PAD, Vocab
from transduce.errors import UserError
from transduce.model.transformer import Transformer
from transduce.training import checkpoint, distributed
from transduce.training.batching import Batch, Pair, collate, model_lengths, token_batches
from transduce.training.loss import label_smoothed_nll
from transduce.training.metrics_log import MetricsLog
from transduce.training.optimizer import make_optimizer
from transduce.training.schedule import cooldown, rate

Validator = Callable[[Transformer], dict[str, float]]
# The training pairs of an epoch (its number given), for data drawn anew every epoch (BPE-dropout)
Resegment = Callable[[int], Sequence[Pair]]

# Autocast dtype of each train.precision (fp32: autocast off). The master weights, the optimizer
# state and the loss stay float32 in every case.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively, so bf16 autocast speeds training up:
    a CUDA GPU of compute capability 8 (Ampere) or newer, a ROCm GPU, an x86 CPU with AVX512-BF16
    or AMX-BF16. Elsewhere bfloat16 is emulated through float32 conversions, slower than float32
    itself."""
    if device.type == "cuda":
        # not torch.cuda.is_bf16_supported(): by default it also says yes where bfloat16 is only
        # emulated (before Ampere), and it asks about the current device, not this one
        return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        caps = torch.cpu.get_capabilities()
        return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """train.precision with ``auto`` made concrete for ``device``: bf16 where ``native_bf16``,
    else fp32; any other value unchanged."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


@dataclass
class Progress:
    """Where the run stands; saved in every checkpoint."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # current epoch (0-based)
    batch_index: int = 0  # next batch of this rank's share of the current epoch
    elapsed: float = 0.0  # seconds of training so far, across resumes
    best_score: float = -math.inf
    bad_evals: int = 0  # validations since the best one (early stopping)
    last_valid_step: int = -1  # step of the latest validation


def _rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random states: the CPU's, Python's, NumPy's and, when it trains on a GPU,
    that GPU's alone (a resume may see fewer GPUs, or number them differently)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _seed_all(seed: int) -> None:
    """Seed this process's torch (CPU and GPUs), Python and NumPy generators."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    cuda = state.get("cuda")
    if isinstance(cuda, list):  # checkpoints before 2026-11-24 kept every visible GPU's state
        index = device.index or 0
        cuda = cuda[index] if index < len(cuda) else None
    if cuda is not None and device.type == "cuda":
        torch.cuda.set_rng_state(cuda, device)


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
        resegment: Resegment | None = None,
    ) -> None:
        """``resegment``, when given, supplies each epoch's training pairs in place of
        ``train_pairs`` (which still decide ``n_filtered``); it must return the same pairs for the
        same epoch, on every rank and after a resume, so that batches can be recomputed."""
        self.cfg, self.model, self.vocab = cfg, model, vocab
        t = cfg.train
        self.world, self.device = distributed.init_from_env(t.device)
        self.model.to(self.device)
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self._use_pairs(train_pairs)
        self.n_filtered = len(train_pairs) - len(self.pairs)
        self.resegment = resegment
        self.valid_pairs = list(valid_pairs)
        self.validator = validator
        self.score_key = score_key
        # None: a bar when stderr is a terminal; False: never. Only rank 0 shows one.
        self.bar_disabled = True if show_progress is False or not self.world.is_main else None
        self.optimizer = make_optimizer(
            model, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, weight_decay=t.weight_decay
        )
        self.precision = resolve_precision(t.precision, self.device)
        # float16 has 5 exponent bits: small gradients flush to 0 unless the loss is scaled up
        # before backward. GradScaler scales it, unscales the gradients, skips an update whose
        # gradients hold inf/NaN and adapts the scale (halved on overflow, doubled after 2000
        # clean steps). bfloat16 has float32's range and needs none; disabled, it is a no-op.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self._budget_done = 0.0  # share of the budget spent, equal on every rank
        self.progress = Progress()
        self.log = MetricsLog(self.run_dir, tensorboard=t.tensorboard and self.world.is_main)
        if self.world.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        # Dropout differs between ranks; rank 0 draws exactly what a single process would.
        _seed_all(t.seed + self.world.rank)
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
        """Train on ``pairs`` from now on, less those longer than max_len."""
        max_len = self.cfg.train.max_len
        self.pairs = [p for p in pairs if max(len(p[0]), len(p[1])) + 1 <= max_len]
        if not self.pairs:
            raise UserError(
                f"no training pairs are within max_len={max_len} tokens "
                f"(all {len(pairs)} are longer); raise max_len"
            )
        self.lengths = model_lengths(self.pairs)

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
        rngs = distributed.all_gather_objects(_rng_state(self.device), self.world)
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
            checkpoint.save_atomic(state, path)
            checkpoint.prune(self.ckpt_dir, self.cfg.train.keep_last)
        distributed.barrier(self.world)
        return path

    def _resume(self) -> None:
        path = checkpoint.step_checkpoints(self.ckpt_dir)[-1]
        state = checkpoint.load(path)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler.is_enabled() and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()[-1].strip()
            raise UserError(
                f"{path} does not fit the configured model (was the config changed since the "
                f"run started?): {first}"
            ) from None
        self.progress = Progress(**state["progress"])
        rngs = state.get("rng_ranks") or [state["rng"]]  # one per rank of the saving run
        if len(rngs) == self.world.size:
            _set_rng_state(rngs[self.world.rank], self.device)
        else:
            self._change_world_size(len(rngs), state["rng"])
        if self.world.is_main:
            self.log.truncate_after(self.progress.step)

    def _change_world_size(self, saved_size: int, rank0_rng: dict[str, Any]) -> None:
        """Resume a run saved by ``saved_size`` processes on this world's number.

        ``batch_index`` counts batches of one rank's share of the epoch, so it becomes the same
        place in the epoch's batch list for the new shares (at most one batch per rank is seen
        twice). Random streams cannot carry over: rank 0 continues the saved rank 0's, the other
        ranks start streams seeded by (seed, rank, step).
        """
        p, old_index = self.progress, self.progress.batch_index
        p.batch_index = old_index * saved_size // self.world.size
        _set_rng_state(rank0_rng, self.device)
        if not self.world.is_main:
            _seed_all(self.cfg.train.seed + self.world.rank + 1_000_003 * p.step)
        else:
            print(
                f"transduce: resuming a run of {saved_size} process(es) on {self.world.size}: "
                f"epoch {p.epoch} continues at batch {p.batch_index} of each rank's share "
                f"(was {old_index}); tokens per update change with the number of processes "
                "unless update_freq is changed to match",
                file=sys.stderr,
            )

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
        dtype = AUTOCAST_DTYPES.get(self.precision)
        autocast = torch.autocast(
            device_type=self.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None
        )
        for i, batch in enumerate(group):
            batch = batch.to(self.device)
            last = i == len(group) - 1
            sync = nullcontext() if self.ddp is None or last else self.ddp.no_sync()
            with sync:
                with autocast:
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
        self.progress.last_valid_step = self.progress.step
        metrics, reason = distributed.all_gather_objects((metrics, reason), self.world)[0]
        return metrics, reason

    # --- the loop -------------------------------------------------------------------------------

    def _should_stop(self, started: float, base_elapsed: float) -> str | None:
        """Why to stop now, or None; also updates the share of the budget spent (the
        cool-down's clock): the largest of steps, epochs and minutes used over their limits."""
        t, p = self.cfg.train, self.progress
        done = [p.step / t.max_steps]
        if t.max_epochs:
            done.append(p.epoch / t.max_epochs)
        if t.max_minutes:
            # Clocks differ between ranks: all use the mean, so that all stop together and
            # take the same learning rate.
            elapsed = base_elapsed + time.monotonic() - started
            (total,) = distributed.all_reduce_sum([elapsed], self.world, self.device)
            done.append(total / self.world.size / (60 * t.max_minutes))
        self._budget_done = min(max(done), 1.0)
        if p.step >= t.max_steps:
            return "max_steps"
        if t.max_epochs and p.epoch >= t.max_epochs:
            return "max_epochs"
        if t.max_minutes and done[-1] >= 1.0:
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

    def _announce(self) -> None:
        t = self.cfg.train
        if self.world.is_main:
            print(
                f"transduce: training on {self.world.size} process(es), device {self.device}, "
                f"precision {self.precision}: "
                f"up to {t.max_tokens} tokens per batch x update_freq {t.update_freq} x "
                f"{self.world.size} = {t.max_tokens * t.update_freq * self.world.size} tokens "
                f"per update; {len(self.pairs)} training pairs"
                + (f" ({self.n_filtered} longer than max_len dropped)" if self.n_filtered else ""),
                file=sys.stderr,
            )

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

    def _epoch_batches(self) -> list[list[int]]:
        """The batches of this rank for the current epoch; called once as each epoch starts (or
        resumes), which is when ``resegment`` draws that epoch's pairs."""
        t = self.cfg.train
        if self.resegment is not None:
            self._use_pairs(self.resegment(self.progress.epoch))
        batches = token_batches(self.lengths, t.max_tokens, seed=t.seed, epoch=self.progress.epoch)
        return distributed.shard(batches, self.world)

    def _train(self, started: float, base_elapsed: float) -> dict[str, Any]:
        t, p = self.cfg.train, self.progress
        fault_step = int(os.environ.get("TRANSDUCE_FAULT_AT_STEP", "0"))
        bar = tqdm(total=t.max_steps, initial=p.step, disable=self.bar_disabled,
                   dynamic_ncols=True, desc="train")  # fmt: skip
        last_metrics: dict[str, float] = {}
        # The logged loss is the token-weighted mean over the updates since the last log line (or
        # since this process started): one batch's loss swings with its sentence lengths (batches
        # are bucketed by length).
        window_tokens, window_loss, window_nll, window_start = 0, 0.0, 0.0, time.monotonic()
        reason = self._should_stop(started, base_elapsed)
        while reason is None:
            batches = self._epoch_batches()
            while reason is None and p.batch_index < len(batches):
                idx = batches[p.batch_index : p.batch_index + t.update_freq]
                p.batch_index += len(idx)
                loss, nll, n_tokens = self._update([collate([self.pairs[i] for i in b]) for b in idx])
                p.step += 1
                p.elapsed = base_elapsed + time.monotonic() - started
                window_tokens += n_tokens
                window_loss, window_nll = window_loss + loss * n_tokens, window_nll + nll * n_tokens
                if p.step % t.log_every == 0:
                    now = time.monotonic()
                    tps = window_tokens / max(now - window_start, 1e-9)
                    loss, nll = window_loss / max(window_tokens, 1), window_nll / max(window_tokens, 1)
                    window_tokens, window_loss, window_nll, window_start = 0, 0.0, 0.0, now
                    lr = self.optimizer.param_groups[0]["lr"]
                    record = {"step": p.step, "epoch": p.epoch, "loss": loss, "nll": nll,
                              "ppl": math.exp(min(nll, 50.0)), "lr": lr, "tokens_per_s": tps,
                              "elapsed": p.elapsed}  # fmt: skip
                    if self.scaler.is_enabled():
                        record["loss_scale"] = self.scaler.get_scale()
                    self._log(record)
                    postfix = {"loss": f"{loss:.3f}", "lr": f"{lr:.2e}", "tok_s": f"{tps:.0f}"}
                    if t.max_minutes:  # tqdm's ETA is for max_steps; this is for the budget
                        postfix["left"] = f"{max(t.max_minutes - p.elapsed / 60, 0.0):.1f}m"
                    bar.set_postfix(postfix)
                bar.update(1)
                if t.eval_every and p.step % t.eval_every == 0:
                    paused = time.monotonic()
                    last_metrics, reason = self._validate_and_decide()
                    window_start += time.monotonic() - paused  # tokens_per_s: training alone
                if p.step % t.save_every == 0:
                    self.save()
                if fault_step and p.step == fault_step:  # tests: die like a killed process
                    os.kill(os.getpid(), signal.SIGKILL)
                reason = reason or self._should_stop(started, base_elapsed)
            if p.batch_index >= len(batches):
                p.epoch, p.batch_index = p.epoch + 1, 0
                reason = reason or self._should_stop(started, base_elapsed)
        bar.close()
        if p.last_valid_step != p.step:
            last_metrics, _ = self._validate_and_decide()
        return self._finish(reason, last_metrics)

    def _finish(self, reason: str, last_metrics: dict[str, float]) -> dict[str, Any]:
        t, p = self.cfg.train, self.progress
        self.save()  # the final state, best score included, for --resume with a larger budget
        if self.world.is_main:
            if t.average_last > 1:
                paths = checkpoint.step_checkpoints(self.ckpt_dir)[-t.average_last :]
                final = checkpoint.average(paths)
            else:
                final = self._model_state()
            checkpoint.save_atomic(final, self.run_dir / "model.pt")
        distributed.barrier(self.world)
        return {
            "stopped_by": reason,
            "step": p.step,
            "epoch": p.epoch,
            "seconds": round(p.elapsed, 2),
            "filtered_pairs": self.n_filtered,
            **last_metrics,
        }
