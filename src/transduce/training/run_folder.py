"""The run folder: what a run writes, and what a resume reads back.

``config.json`` (the config the run goes on with), ``metrics.jsonl`` (``MetricsLog``),
``checkpoints/step_N.pt`` (full state for ``--resume``; the last ``keep_last`` are kept),
``best.pt`` (best validation score) and, when the run finishes, ``model.pt`` (averaged over the
last ``average_last`` checkpoints when that is more than 1) and ``model.safetensors``. Only rank
0 writes; every rank calls the writers (``training/saving.py``: a full disk stops all ranks).

With ``tensorboard`` on (the default) and the ``tensorboard`` package installed, the numbers of
``metrics.jsonl`` go to TensorBoard event files in ``tensorboard/`` too (``train/loss``,
``valid/bleu``, ...); without the package a one-line notice says so and training goes on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Protocol

import torch

from transduce import checkpoint
from transduce.architectures import Seq2Seq
from transduce.config import Config
from transduce.data.vocab import Vocab
from transduce.errors import CheckpointNotWritten, UserError
from transduce.training import config_change, distributed, saving
from transduce.training.feed import BatchFeed
from transduce.training.metrics_log import MetricsLog
from transduce.training.precision import auto_resolutions
from transduce.training.progress import Progress
from transduce.training.resume import load_training_state, restore_position
from transduce.training.rng import rng_state


def _draw_note(progress: Progress, drawn: bool) -> str:
    """What a resumed BPE-dropout run says of its pairs."""
    head = (
        "transduce: note: bpe_dropout: SentencePiece's BPE-dropout samples differ between "
        "processes even with one seed, so "
    )
    if drawn:
        return (
            f"{head}epoch {progress.epoch} goes on with the pieces saved in the checkpoint, "
            "and the epochs after it are segmented otherwise than the first run would have"
        )
    return (
        f"{head}from here the resumed run segments its text otherwise than the first run "
        f"would have (the checkpoint holds no draw: the rest of epoch {progress.epoch} is cut "
        "into other batches, some of its pairs seen twice and others not at all)"
    )


class Training(Protocol):
    """What a run folder saves and restores: a ``Trainer``'s config, vocabulary, model,
    optimizer, loss scaler and precision (as resolved), on its processes and device, and the
    training pairs drawn for the current epoch (``feed``, with BPE-dropout)."""

    cfg: Config
    vocab: Vocab
    model: Seq2Seq
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    precision: str
    world: distributed.World
    device: torch.device
    feed: BatchFeed


# what a run writes in its folder: each must be a file (or a folder) or not there yet, else the
# run would train for nothing and fail at its first checkpoint or at the end
_RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "best.pt",
    "model.pt",
    "model.safetensors",
    "training_text.json",
)
_RUN_FOLDERS = ("checkpoints", "tensorboard")


# what a step checkpoint holds beside the model, and a resume reads
TRAINING_STATE = ("optimizer", "progress", "rng")


def check_layout(path: Path) -> None:
    """A UserError naming the first of the run's paths in ``path`` that is of the wrong kind."""
    for name in _RUN_FILES:
        if (path / name).is_dir():
            raise UserError(f"{path / name}: is a folder; the run writes a file there")
    for name in _RUN_FOLDERS:
        if (path / name).exists() and not (path / name).is_dir():
            raise UserError(f"{path / name}: is a file; the run writes a folder there")


class RunFolder:
    """The files in ``path`` of the run of ``training``; see the module."""

    def __init__(self, path: Path, training: Training) -> None:
        self.path, self.checkpoints = path, path / "checkpoints"
        self.training, self.cfg, self.world = training, training.cfg, training.world
        self.log = MetricsLog(path, tensorboard=self.cfg.train.tensorboard and self.world.is_main)
        self._saved_at: tuple[int, int, int] | None = None  # (step, epoch, batch) of the last save
        # the step from which save_every's schedule holds (a resume that changed it: there)
        self._schedule_from = 0
        if self.world.is_main:
            if path.exists() and not path.is_dir():
                raise UserError(f"{path}: is a file; --out names the run's folder")
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                why = e.strerror or e
                raise UserError(f"{path}: cannot create the run folder ({why})") from None
            check_layout(path)

    def start(self, *, resume: bool, allow_change: tuple[str, ...]) -> Progress:
        """Where the run stands: at its last checkpoint with ``resume`` (the model, optimizer,
        scaler and random states loaded; ``allow_change``: ``training/config_change.py``),
        else at the start (``metrics.jsonl`` emptied). Then ``config.json`` is written: after
        the resume's config check, so that a refused config is not kept."""
        progress = Progress()
        if resume and checkpoint.step_checkpoints(self.checkpoints):
            progress = self._resume(allow_change)
        elif self.world.is_main:
            self.log.reset()
        if self.world.is_main:
            config = json.dumps(self.cfg.to_dict(), indent=2) + "\n"
            checkpoint.write_text_atomic(self.path / "config.json", config)
        return progress

    def _resume(self, allow_change: tuple[str, ...]) -> Progress:
        saved, run = checkpoint.step_checkpoints(self.checkpoints), self.training
        path = saved[-1]
        fallback = (
            f"; to resume from the one before it, {saved[-2]}, remove it" if saved[1:] else ""
        )
        try:
            state = checkpoint.load(path)
        except UserError as e:  # a damaged file: the one before it may be whole
            raise UserError(f"{e}{fallback}") from None
        lacks = [key for key in TRAINING_STATE if key not in state]
        if lacks:  # e.g. `transduce average --output` written among the step checkpoints
            raise UserError(
                f"{path} is a model file, not a training checkpoint (it holds no "
                f"{', '.join(lacks)}){fallback}"
            )
        saved_precision = state.get("precision")
        if self.cfg.train.precision == "auto" and saved_precision in auto_resolutions(run.device):
            run.precision = saved_precision  # what auto gave the run when it began (a rule since)
        now = config_change.Setting(self.world.size, run.precision)
        config_change.check_checkpoint(state, path, self.cfg, allow_change, now, self.world.is_main)
        if "vocab" in state and state["vocab"] != run.vocab.to_dict():
            raise UserError(
                f"{path} was trained with another vocabulary than the run folder's vocabulary "
                "files now hold (changed since it was saved): resuming would read every id "
                "wrong; a new run needs another folder"
            )
        load_training_state(state, path, run.model, run.optimizer, run.scaler)
        progress = restore_position(state, path, self.world, self.cfg.train.seed, run.device)
        drawn = self._restore_draw(state, path)
        before = state.get("config", {}).get("train", {}).get("save_every")
        if before != self.cfg.train.save_every:  # its checkpoints were of the other schedule
            self._schedule_from = progress.step
        else:  # where the saved run's schedule began, kept through any later resume
            self._schedule_from = int(state.get("schedule_from", 0))
        if self.world.is_main:
            self.log.truncate_after(progress.step)
            if getattr(self.cfg.task, "bpe_dropout", 0.0) > 0:
                print(_draw_note(progress, drawn), file=sys.stderr, flush=True)
        return progress

    def _restore_draw(self, state: dict[str, Any], path: Path) -> bool:
        """Hand the checkpoint's draw of its epoch's pairs (BPE-dropout) to the feed; whether
        there was one for a run that draws (a checkpoint from before draws were kept has
        none). A damaged draw is a UserError naming the file."""
        drawn, feed = state.get("drawn"), self.training.feed
        if drawn is None or feed.resegment is None:
            return False
        try:
            feed.restore_draw(drawn)
        except (AttributeError, TypeError, ValueError) as e:
            raise UserError(f"{path}: its draw of the training pairs is damaged ({e})") from None
        return True

    def record(self, record: dict[str, Any]) -> None:
        """Append ``record`` to ``metrics.jsonl`` (and TensorBoard); rank 0 only."""
        if self.world.is_main:
            self.log.write(record)

    def model_state(self) -> dict[str, Any]:
        """What a model file holds: the config, the vocabulary and the weights (on the CPU)."""
        run = self.training
        model = {k: v.detach().cpu() for k, v in run.model.state_dict().items()}
        return {"config": self.cfg.to_dict(), "vocab": run.vocab.to_dict(), "model": model}

    def last_good(self) -> Path | None:
        """The newest step checkpoint (None: none yet)."""
        return saving.last_good(self.checkpoints)

    def save(self, progress: Progress) -> Path:
        """Write ``checkpoints/step_N.pt`` with everything needed to resume; prune old ones.

        Every rank must call it (the RNG states of all ranks are gathered); rank 0 writes.
        """
        run = self.training
        rngs = distributed.all_gather_objects(rng_state(run.device), self.world)
        path = checkpoint.step_path(self.checkpoints, progress.step)
        drawn = run.feed.draw_state()  # BPE-dropout's pairs of this epoch: a resume reads them

        def state() -> dict[str, Any]:
            return {
                **self.model_state(),
                "optimizer": run.optimizer.state_dict(),
                "scaler": run.scaler.state_dict(),  # {} unless fp16
                "progress": vars(progress).copy(),
                "rng": rngs[0],
                "precision": run.precision,  # as resolved: a resume must keep it
                "schedule_from": self._schedule_from,  # the step save_every holds from
                "rng_ranks": rngs,
                **({} if drawn is None else {"drawn": drawn}),
            }

        saving.write_model_file(self.world, path, state, self.checkpoints, self._save_and_log)
        if self.world.is_main:
            t = self.cfg.train
            checkpoint.prune(self.checkpoints, t.keep_last, t.save_every, self._schedule_from)
        self._saved_at = (progress.step, progress.epoch, progress.batch_index)
        return path

    def _save_and_log(self, data: dict[str, Any], path: Path) -> None:
        """Save the checkpoint ``data`` to ``path``, then write the records ``metrics.jsonl``
        could not take: where it still cannot, ``CheckpointNotWritten`` stops the run (on every
        rank: ``saving.write_on_main``), its checkpoint written and nothing lost but them."""
        checkpoint.save(data, path)
        try:
            self.log.flush()
        except OSError as e:
            n = len(self.log.unwritten)
            raise CheckpointNotWritten(
                f"cannot write {self.log.path}: {e.strerror or e} (errno {e.errno}); {path} "
                f"holds the run ({n} record{'s' * (n != 1)} of its metrics unwritten). Mend "
                "that, then resume with --resume"
            ) from None

    def save_now(self, progress: Progress) -> Path:
        """The step checkpoint of this very moment: written unless the last save was of it."""
        if self._saved_at != (progress.step, progress.epoch, progress.batch_index):
            self.save(progress)
        return checkpoint.step_path(self.checkpoints, progress.step)

    def write_best(self) -> None:
        """``best.pt``: the model as it is now (every rank calls it)."""
        saving.write_model_file(
            self.world, self.path / "best.pt", self.model_state, self.checkpoints
        )

    def finish(self) -> None:
        """``model.pt`` and, where safetensors is installed, ``model.safetensors`` (the same
        model for other tools): the model as it is, or averaged over the last ``average_last``
        step checkpoints. Every rank calls it, after the final ``save``."""
        t = self.cfg.train
        final: dict[str, Any] = {}
        if self.world.is_main:
            if t.average_last > 1:
                paths = checkpoint.step_checkpoints(self.checkpoints)[-t.average_last :]
                final = checkpoint.average(paths)
                if len(paths) < t.average_last:  # said, not hidden in a smaller average
                    print(
                        f"transduce: note: model.pt averages {len(paths)} step checkpoint"
                        f"{'s' * (len(paths) != 1)}, not average_last = {t.average_last}: the "
                        f"run saved no more (save_every {t.save_every}, keep_last "
                        f"{t.keep_last})",
                        file=sys.stderr,
                        flush=True,
                    )
            else:
                final = self.model_state()
        saving.write_model_file(self.world, self.path / "model.pt", lambda: final, self.checkpoints)
        if checkpoint.safetensors_available():
            saving.write_model_file(
                self.world,
                self.path / "model.safetensors",
                lambda: final,
                self.checkpoints,
                checkpoint.save_safetensors,
            )


__all__ = ["RunFolder", "Training"]
