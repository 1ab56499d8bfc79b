"""The tail every task shares: from a task's data to a trained run folder.

A task (``training/tasks/``) reads its data and makes its vocabulary, validator and score;
``fit`` then seeds, builds the model the config names, trains it with the ``Trainer`` and
returns the Trainer's summary with the task's data counts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from transduce.architectures import Seq2Seq, build_model
from transduce.checkpoint import step_checkpoints
from transduce.config import Config
from transduce.data.batching import Pair, model_lengths
from transduce.data.vocab import Vocab, vocab_sizes
from transduce.errors import UserError
from transduce.training.distributed import World
from transduce.training.feed import Resegment
from transduce.training.run_folder import check_layout
from transduce.training.trainer import StepCallback, Trainer
from transduce.training.validation import Validator

Log = Callable[[str], None]


def stderr_log(message: str) -> None:
    print(f"transduce: {message}", file=sys.stderr, flush=True)


def _silent(message: str) -> None:
    """The log of ranks other than 0."""


def rank_log(log: Log | None, world: World) -> Log:
    """``log`` (default: stderr) on rank 0, silence on the others: one report, not one per
    rank."""
    return (log or stderr_log) if world.is_main else _silent


def epoch_seed(seed: int, epoch: int) -> int:
    """The BPE-dropout seed of ``epoch``'s first side (the target's is one more): the same on
    every rank and after a resume."""
    return (seed * 1_000_003 + 2 * epoch) % 2**32


@dataclass(frozen=True)
class RunOptions:
    """How a run goes, whatever its task (the keyword arguments of ``Trainer``)."""

    resume: bool = False
    show_progress: bool | None = None
    callbacks: Sequence[StepCallback] = ()
    allow_change: Sequence[str] = ()


@dataclass
class TaskData:
    """What a task trains on: its vocabulary (one shared, or a ``VocabPair``), the training
    and validation pairs, the validator of its own metrics and the one that picks best.pt,
    ``resegment`` for data drawn anew every epoch (``training/feed.py``), and ``counts`` of
    the data read, added to the run's summary."""

    vocab: Vocab
    train_pairs: Sequence[Pair]
    valid_pairs: Sequence[Pair] = ()
    validator: Validator | None = None
    score_key: str = "neg_valid_nll"
    resegment: Resegment | None = None
    counts: dict[str, Any] = field(default_factory=dict)
    # run once the Trainer has accepted the run (a resume's config check passed): what the
    # task records of its data in the run folder, so that a refused resume records nothing
    after_start: Callable[[], None] | None = None


# what a run leaves that a new run in its folder would replace
FINISHED_RUN_FILES = ("model.pt", "model.safetensors")  # (best.pt: a run killed early has it)


def _built(cfg: Config, src_size: int, tgt_size: int | None) -> Seq2Seq:
    """The model of ``cfg.model``; a UserError with its size where memory cannot hold it."""
    try:
        return build_model(cfg.model, src_vocab_size=src_size, tgt_vocab_size=tgt_size)
    except (RuntimeError, MemoryError) as e:  # CUDA's OutOfMemoryError is a RuntimeError
        if not any(s in str(e) for s in ("can't allocate memory", "out of memory")):
            raise
    with torch.device("meta"):  # shapes only
        meta = build_model(cfg.model, src_vocab_size=src_size, tgt_vocab_size=tgt_size)
    n = sum(p.numel() for p in meta.parameters())
    raise UserError(
        f"the model ({n:,} parameters: {n * 4 / 2**30:,.1f} GiB of float32 weights, about 4x "
        "that to train with Adam) does not fit in memory: make it smaller (model.*)"
    )


def check_resumable(out_dir: str | Path) -> None:
    """A UserError when ``--resume`` names a folder with no checkpoint to continue from: a new
    or misspelt ``--out`` would otherwise start from scratch."""
    if not step_checkpoints(Path(out_dir) / "checkpoints"):
        raise UserError(
            f"--resume: {out_dir} holds no checkpoint to continue from (a new or misspelt "
            "--out?); without --resume a run starts there"
        )


def check_new_run(out_dir: str | Path, resume: bool) -> None:
    """A UserError, before anything is read or written, when a new run (not ``resume``) would
    start in a folder that holds a run's checkpoints: it would mix with them (its model.pt an
    average of theirs, its own last checkpoint pruned) and overwrite that run's metrics; and
    when any run (``resume`` too) would start in one that holds a run's model files but no
    checkpoint, which it would replace."""
    if Path(out_dir).is_dir():  # before any data is read: a path of the wrong kind
        check_layout(Path(out_dir))
    checkpoints = step_checkpoints(Path(out_dir) / "checkpoints")
    if not resume and checkpoints:
        raise UserError(
            f"{out_dir} already holds a run (checkpoints/step_*.pt): --resume continues it; a "
            "new run needs another folder (--out)"
        )
    models = [name for name in FINISHED_RUN_FILES if (Path(out_dir) / name).is_file()]
    if models and not checkpoints:  # a run's result, its checkpoints gone: nothing to resume
        raise UserError(
            f"{out_dir} already holds a finished run's {models[0]} (and no checkpoint to resume "
            "from): a new run would replace it; it needs another folder (--out)"
        )


def _placeable_valid_pairs(cfg: Config, data: TaskData, log: Log | None) -> Sequence[Pair]:
    """``data.valid_pairs`` less those a Transformer of learned positions (``max_positions``
    of them) cannot place, reported to ``log``; a UserError, before any training, where its
    training pairs (up to ``max_len``) or the validator's decoding of a validation source
    (BOS, then up to source + EOS + ``decode.max_len_offset`` tokens) would run past the table.
    Sinusoidal positions and recurrent models place any length."""
    m, pairs = cfg.model, data.valid_pairs
    if m.positional != "learned" or m.architecture != "transformer":
        return pairs
    table = m.max_positions
    if cfg.train.max_len > table:
        raise UserError(
            f"train.max_len={cfg.train.max_len} is more than the {table} learned positions "
            f"(model.max_positions): set max_len at most {table}"
        )
    lengths = model_lengths(pairs)  # (source + EOS, BOS + target)
    if data.validator is not None and lengths:
        longest = max(s for s, _ in lengths)
        offset = cfg.decode.max_len_offset
        if longest + offset + 1 > table:
            raise UserError(
                f"validation decodes a source of {longest - 1} tokens into up to "
                f"{longest - 1 + offset} (decode.max_len_offset={offset}), which needs "
                f"{longest + offset + 1} learned positions; model.max_positions is {table}: "
                "raise it or lower max_len_offset"
            )
    kept = [pair for pair, (s, t) in zip(pairs, lengths, strict=True) if max(s, t) <= table]
    if len(kept) < len(pairs) and log is not None:
        log(
            f"valid: {len(pairs) - len(kept)} pairs longer than max_positions={table} tokens "
            "left out of the validation loss"
        )
    return kept


def fit(
    cfg: Config,
    out_dir: str | Path,
    data: TaskData,
    options: RunOptions,
    *,
    log: Log | None = None,
    adapt: Callable[[Seq2Seq], None] | None = None,
) -> dict[str, Any]:
    """Train the model of ``cfg.model`` on ``data`` into ``out_dir``: seeded by
    ``train.seed``, ``adapt`` applied to it once built. ``log``, when given, hears how many
    training pairs were longer than max_len. The Trainer's summary plus ``data.counts``."""
    valid_pairs = _placeable_valid_pairs(cfg, data, log)
    torch.manual_seed(cfg.train.seed)
    src_size, tgt_size = vocab_sizes(data.vocab)
    model = _built(cfg, src_size, tgt_size)
    if adapt is not None:
        adapt(model)
    trainer = Trainer(
        cfg,
        model,
        data.vocab,
        data.train_pairs,
        run_dir=Path(out_dir),
        valid_pairs=valid_pairs,
        validator=data.validator,
        score_key=data.score_key,
        resume=options.resume,
        show_progress=options.show_progress,
        resegment=data.resegment,
        callbacks=options.callbacks,
        allow_change=options.allow_change,
    )
    if data.after_start is not None:
        data.after_start()
    if log is not None and trainer.feed.n_filtered:
        log(
            f"train: {trainer.feed.n_filtered} pairs longer than max_len={cfg.train.max_len} "
            "tokens left out"
        )
    return {**trainer.train(), **data.counts}


__all__ = [
    "Log",
    "RunOptions",
    "TaskData",
    "check_new_run",
    "check_resumable",
    "epoch_seed",
    "fit",
    "rank_log",
    "stderr_log",
]
