"""The synthetic tasks (copy, reverse, addition...): generated pairs, one small vocabulary,
validation by exact-match and token accuracy of greedy decoding; best.pt by sequence accuracy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transduce.architectures import Seq2Seq
from transduce.config import Config, SyntheticTaskConfig
from transduce.data.batching import Pair
from transduce.data.synthetic import TextPair, make_task
from transduce.data.vocab import Vocab
from transduce.errors import UserError
from transduce.evaluation.accuracy import (
    position_accuracy,
    sequence_accuracy,
    token_accuracy,
)
from transduce.inference.search import predict_ids, searchable
from transduce.training.fit import RunOptions, TaskData, check_new_run, fit
from transduce.training.trainer import StepCallback
from transduce.training.validation import Validator


def encode_pairs(vocab: Vocab, pairs: Sequence[TextPair]) -> list[Pair]:
    return [(vocab.encode(s), vocab.encode(t)) for s, t in pairs]


def accuracy_validator(cfg: Config, valid: Sequence[Pair]) -> Validator:
    """Exact-match and token accuracy of greedy decoding on the held-out pairs."""
    sources = [s for s, _ in valid]
    refs = [t for _, t in valid]

    def validate(model: Seq2Seq) -> dict[str, Any]:
        model.eval()
        hyps = predict_ids(
            searchable(model),
            sources,
            batch_size=cfg.decode.decode_batch,
            max_len_offset=cfg.decode.max_len_offset,
            device=next(model.parameters()).device,
        )
        return {
            "seq_accuracy": sequence_accuracy(hyps, refs),
            "token_accuracy": token_accuracy(hyps, refs),
            "position_accuracy": position_accuracy(hyps, refs),  # a list: answer positions 1, 2..
        }

    return validate


def train_synthetic(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: bool = False,
    show_progress: bool | None = None,
    callbacks: Sequence[StepCallback] = (),
    allow_change: Sequence[str] = (),
) -> dict[str, Any]:
    """Train on the synthetic task of ``cfg.task``; returns the Trainer's summary."""
    if not isinstance(cfg.task, SyntheticTaskConfig):
        raise UserError(f"task.name is {cfg.task.name!r}, not a synthetic task")
    check_new_run(out_dir, resume)
    task = make_task(cfg.task)
    train = encode_pairs(task.vocab, task.train)
    valid = encode_pairs(task.vocab, task.valid)
    data = TaskData(task.vocab, train, valid, accuracy_validator(cfg, valid), "seq_accuracy")
    return fit(cfg, out_dir, data, RunOptions(resume, show_progress, callbacks, allow_change))


__all__ = ["accuracy_validator", "encode_pairs", "train_synthetic"]
