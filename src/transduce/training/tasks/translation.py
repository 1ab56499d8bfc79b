"""The translation task: parallel text -> a Transformer trained with validation loss,
perplexity, BLEU and chrF; best.pt by BLEU.

Its data comes either from the text files of ``cfg.task`` (``translation_files``: read, a
SentencePiece BPE vocabulary learned) or from the folder ``task.prepared`` that ``transduce
prepare`` wrote (``translation_prepared``: memory-mapped ids, the folder's vocabulary).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transduce.architectures import Seq2Seq
from transduce.config import Config, TranslationTaskConfig
from transduce.data.vocab import Vocab
from transduce.errors import UserError
from transduce.training import distributed
from transduce.training.fit import Log, RunOptions, check_new_run, fit, rank_log
from transduce.training.tasks.translation_files import from_files
from transduce.training.tasks.translation_prepared import from_prepared
from transduce.training.trainer import StepCallback
from transduce.training.validation import Validator


def bleu_validator(
    cfg: Config, vocab: Vocab, sources: Sequence[str], references: Sequence[str]
) -> Validator:
    """sacreBLEU BLEU and chrF of the model's translations of ``sources`` (beam
    ``train.valid_beam``; 1 = greedy) against ``references``."""
    from transduce.evaluation.bleu import corpus_scores
    from transduce.inference.translator import Translator

    def validate(model: Seq2Seq) -> dict[str, float]:
        translator = Translator(model, vocab, cfg)
        hyps = translator.translate(sources, translator.decode_config(beam=cfg.train.valid_beam))
        scores = corpus_scores(hyps, references)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return validate


def train_translation(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: bool = False,
    show_progress: bool | None = None,
    log: Log | None = None,
    callbacks: Sequence[StepCallback] = (),
    allow_change: Sequence[str] = (),
) -> dict[str, Any]:
    """Train a translation model on the files of ``cfg.task`` into ``out_dir``.

    Reads the training (and, if named, validation) files, reporting how many pairs were skipped
    for an empty side; learns the shared vocabulary (``vocab.model``; reused with ``resume``);
    trains with validation BLEU as the score that picks ``best.pt``. With ``task.prepared`` it
    trains from that prepared folder instead (``translation_prepared``). ``log`` receives
    one-line reports (default: stderr). Returns the Trainer's summary plus the data counts.
    Under torchrun every rank reads the data; rank 0 alone learns the vocabulary (the others
    receive it), writes files and reports.
    """
    world, _ = distributed.init_from_env(cfg.train.device)
    log = rank_log(log, world)  # one report, not one per rank
    if not isinstance(cfg.task, TranslationTaskConfig):
        raise UserError(f"task.name is {cfg.task.name!r}, not 'translation'")
    check_new_run(out_dir, resume)
    read: Any = (  # prepared: from transduce prepare
        from_prepared
        if cfg.task.prepared
        else functools.partial(from_files, allow_change=allow_change)
    )
    data = read(
        cfg,
        Path(out_dir),
        world,
        resume=resume,
        log=log,
        validator=functools.partial(bleu_validator, cfg),
    )
    options = RunOptions(resume, show_progress, callbacks, allow_change)
    return fit(cfg, out_dir, data, options, log=log)


__all__ = ["bleu_validator", "train_translation"]
