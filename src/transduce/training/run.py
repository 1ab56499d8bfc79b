"""From a Config to a trained run folder: the task's data, the model, the Trainer.

``train`` picks by ``task.name``: a synthetic task (``train_synthetic``) or ``translation``
(``train_translation``): parallel text files -> a shared SentencePiece BPE vocabulary ->
a Transformer trained with validation loss, perplexity and BLEU.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from transduce.architectures import Seq2Seq, build_model
from transduce.config import Config, SyntheticTaskConfig, TranslationTaskConfig
from transduce.data.batching import Pair
from transduce.data.parallel import resolve_data_path
from transduce.data.synthetic import TextPair, make_task
from transduce.data.vocab import Vocab, VocabPair, vocab_sizes
from transduce.errors import UserError
from transduce.evaluation.accuracy import (
    position_accuracy,
    sequence_accuracy,
    token_accuracy,
)
from transduce.inference.search import predict_ids, searchable
from transduce.training import distributed
from transduce.training.config_change import allowed_keys
from transduce.training.trainer import Resegment, StepCallback, Trainer, Validator

if TYPE_CHECKING:
    from transduce.data.parallel import ParallelText
    from transduce.data.subword import SentencePieceVocab

Log = Callable[[str], None]


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
    task = make_task(cfg.task)
    train = encode_pairs(task.vocab, task.train)
    valid = encode_pairs(task.vocab, task.valid)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, src_vocab_size=len(task.vocab))
    trainer = Trainer(
        cfg,
        model,
        task.vocab,
        train,
        run_dir=Path(out_dir),
        valid_pairs=valid,
        validator=accuracy_validator(cfg, valid),
        score_key="seq_accuracy",
        resume=resume,
        show_progress=show_progress,
        callbacks=callbacks,
        allow_change=allow_change,
    )
    return trainer.train()


# --- translation ----------------------------------------------------------------------------------


def stderr_log(message: str) -> None:
    print(f"transduce: {message}", file=sys.stderr, flush=True)


def _silent(message: str) -> None:
    """The log of ranks other than 0."""


def _translation(cfg: Config) -> TranslationTaskConfig:
    """``cfg.task``, which must be a translation task."""
    if not isinstance(cfg.task, TranslationTaskConfig):
        raise UserError(f"task.name is {cfg.task.name!r}, not 'translation'")
    return cfg.task


def _read_split(cfg: Config, split: str, log: Log) -> ParallelText | None:
    from transduce.data.parallel import read_parallel

    src_key, tgt_key = f"{split}_src", f"{split}_tgt"
    src_value, tgt_value = getattr(cfg.task, src_key), getattr(cfg.task, tgt_key)
    if not src_value and not tgt_value:
        return None
    for key, value in ((src_key, src_value), (tgt_key, tgt_value)):
        if not value:
            raise UserError(f"task.{key} is not set; name the {split} {key[-3:]} file")
    src, tgt = resolve_data_path(src_value, src_key), resolve_data_path(tgt_value, tgt_key)
    text = read_parallel(src, tgt)
    notes = [f"{text.skipped} with an empty side skipped"] if text.skipped else []
    if text.normalised.describe():
        notes.append(f"{text.normalised.describe()} normalised")
    log(
        f"{split}: {len(text)} sentence pairs from {src} and {tgt}"
        + (f" ({'; '.join(notes)})" if notes else "")
    )
    if not len(text):
        raise UserError(f"{src} and {tgt}: no sentence pairs with both sides non-empty")
    return text


def _sides(vocab: SentencePieceVocab | VocabPair) -> tuple[SentencePieceVocab, SentencePieceVocab]:
    """(source vocabulary, target vocabulary): the one shared vocabulary twice, or the pair's."""
    if isinstance(vocab, VocabPair):
        return vocab.source, vocab.target  # type: ignore[return-value]  # SentencePiece both
    return vocab, vocab


def _learn(texts: Iterable[str], task: TranslationTaskConfig, seed: int) -> SentencePieceVocab:
    from transduce.data.subword import train_sentencepiece

    return train_sentencepiece(
        texts, task.vocab_size, input_sentence_size=task.vocab_sample, seed=seed
    )


def _vocabulary(
    cfg: Config, run_dir: Path, train: ParallelText, *, resume: bool, log: Log
) -> SentencePieceVocab | VocabPair:
    """The run's vocabulary: ``vocab.model`` (shared) or ``vocab.src.model`` and
    ``vocab.tgt.model`` (``task.shared_vocab`` false) of the run when resuming, else learned on
    the training sentences (a sample of ``task.vocab_sample`` of them, if set) and saved there
    (the run folder is made first)."""
    from transduce.data.subword import SentencePieceVocab

    task = _translation(cfg)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{run_dir}: cannot create the run folder ({e.strerror or e})") from None
    names = ["vocab.model"] if task.shared_vocab else ["vocab.src.model", "vocab.tgt.model"]
    paths = [run_dir / name for name in names]
    if resume and all(p.is_file() for p in paths):
        loaded = [SentencePieceVocab.load(p) for p in paths]
        log(f"vocabulary: {' + '.join(str(len(v)) for v in loaded)} pieces from "
            f"{', '.join(map(str, paths))} (resumed run)")
        return loaded[0] if task.shared_vocab else VocabPair(loaded[0], loaded[1])
    if not task.vocab_model:
        log(f"learning a BPE vocabulary of {task.vocab_size} pieces on {2 * len(train)} "
            "sentences (may take minutes on a large corpus)")
    if task.vocab_model:  # an existing SentencePiece vocabulary, reused
        from transduce.data.prepare import reused_vocabulary

        learned = reused_vocabulary(task)
    elif task.shared_vocab:
        learned = [_learn(itertools.chain(train.source, train.target), task, cfg.train.seed)]
    else:
        learned = [_learn(train.source, task, cfg.train.seed),
                   _learn(train.target, task, cfg.train.seed)]  # fmt: skip
    for vocab, path in zip(learned, paths, strict=True):
        vocab.save(path)
    sample = f" (a sample of {task.vocab_sample} sentences)" if task.vocab_sample else ""
    kind = "shared" if task.shared_vocab else "source and target"
    how = f"reused from {task.vocab_model}" if task.vocab_model else (
        f"learned on the training text{sample}")
    log(f"vocabulary: {' + '.join(str(len(v)) for v in learned)} {kind} BPE pieces {how} -> "
        f"{', '.join(map(str, paths))}")
    return learned[0] if task.shared_vocab else VocabPair(learned[0], learned[1])


def _rank0_vocabulary(
    cfg: Config, run_dir: Path, train: ParallelText, *, resume: bool, log: Log,
    world: distributed.World,
) -> SentencePieceVocab | VocabPair:  # fmt: skip
    """``_vocabulary`` (and the run folder) on rank 0 only; the other ranks receive its bytes:
    no shared file system needed, no rank learning or writing a vocabulary of its own. Rank 0's
    UserError, if any, is raised on every rank, so none waits for a vocabulary that never
    comes."""
    from transduce.data.subword import SentencePieceVocab

    if not world.distributed:
        return _vocabulary(cfg, run_dir, train, resume=resume, log=log)
    vocab: SentencePieceVocab | VocabPair | None = None
    failure: Exception | None = None
    sent: list[bytes] | UserError = []
    if world.is_main:
        try:
            vocab = _vocabulary(cfg, run_dir, train, resume=resume, log=log)
            sent = [v.model_proto for v in dict.fromkeys(_sides(vocab))]
        except Exception as e:  # tell the others, then fail here as before
            failure = e
            sent = e if isinstance(e, UserError) else UserError(f"rank 0: {type(e).__name__}: {e}")
    received = distributed.all_gather_objects(sent, world)[0]
    if failure is not None:
        raise failure
    if isinstance(received, UserError):
        raise received
    if vocab is not None:
        return vocab
    protos = [SentencePieceVocab(p, name="rank 0's vocabulary") for p in received]
    return protos[0] if len(protos) == 1 else VocabPair(protos[0], protos[1])


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


def _validation(
    cfg: Config, vocab: SentencePieceVocab | VocabPair, valid_text: ParallelText | None,
    summary: dict[str, Any], log: Log,
) -> tuple[list[Pair], Validator | None]:
    """The validation pairs and the BLEU validator (none without validation files); adds the
    validation counts to ``summary``."""
    if valid_text is None:
        log(
            "no validation files (task.valid_src, task.valid_tgt): "
            "no BLEU, best.pt or early stopping"
        )
        return [], None
    n = _translation(cfg).max_valid_sentences or len(valid_text)
    sources, references = valid_text.source[:n], valid_text.target[:n]
    valid_pairs = list(
        zip(_sides(vocab)[0].encode_batch(sources), _sides(vocab)[1].encode_batch(references),
            strict=True)
    )
    summary.update(valid_pairs=len(valid_pairs), valid_skipped_empty=valid_text.skipped)
    if n < len(valid_text):
        log(f"valid: validating on the first {n} pairs (max_valid_sentences)")
    return valid_pairs, bleu_validator(cfg, vocab, sources, references)


def epoch_seed(seed: int, epoch: int) -> int:
    """The BPE-dropout seed of ``epoch``'s first side (the target's is one more): the same on
    every rank and after a resume."""
    return (seed * 1_000_003 + 2 * epoch) % 2**32


def bpe_dropout_pairs(
    cfg: Config, vocab: SentencePieceVocab | VocabPair, train: ParallelText
) -> Resegment | None:
    """Each epoch's training pairs under BPE-dropout ``task.bpe_dropout`` (None when 0): both
    sides segmented anew, seeded by ``train.seed``, the epoch and the side (the same pairs within
    a process, not across processes: ``SentencePieceVocab.sample_batch``)."""
    p = _translation(cfg).bpe_dropout
    if not p:
        return None
    source, target = _sides(vocab)

    def pairs(epoch: int) -> list[Pair]:
        seed = epoch_seed(cfg.train.seed, epoch)
        return list(zip(
            source.sample_batch(train.source, dropout=p, seed=seed),
            target.sample_batch(train.target, dropout=p, seed=(seed + 1) % 2**32),
            strict=True,
        ))  # fmt: skip

    return pairs


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
    trains from that prepared folder instead (``training.prepared_run``). ``log`` receives one-line
    reports (default: stderr). Returns the Trainer's summary plus the data counts. Under
    torchrun every rank reads the files; rank 0 alone learns the vocabulary (the others receive
    it), writes files and reports.
    """
    world, _ = distributed.init_from_env(cfg.train.device)
    log = (log or stderr_log) if world.is_main else _silent  # one report, not one per rank
    if cfg.task.name != "translation":
        raise UserError(f"task.name is {cfg.task.name!r}, not 'translation'")
    if _translation(cfg).prepared:  # memory-mapped ids from transduce prepare
        from transduce.training.prepared_run import (
            train_prepared,  # it imports this module
        )

        return train_prepared(cfg, out_dir, resume=resume, show_progress=show_progress, log=log,
                              callbacks=callbacks, allow_change=allow_change)  # fmt: skip
    if not cfg.task.train_src or not cfg.task.train_tgt:
        raise UserError(
            "task translation needs task.train_src and task.train_tgt (the training files)"
        )
    out = Path(out_dir)
    task = _translation(cfg)
    if task.clean_max_len or task.clean_ratio or task.clean_identical or task.clean_dedup:
        log("the task.clean_* keys apply to transduce prepare; training from the files keeps "
            "every pair with both sides non-empty")  # fmt: skip
    train_text = _read_split(cfg, "train", log)
    valid_text = _read_split(cfg, "valid", log)
    assert train_text is not None
    vocab = _rank0_vocabulary(cfg, out, train_text, resume=resume, log=log, world=world)
    train_pairs = list(
        zip(
            _sides(vocab)[0].encode_batch(train_text.source),
            _sides(vocab)[1].encode_batch(train_text.target),
            strict=True,
        )
    )
    if not any(max(len(a), len(b)) + 1 <= cfg.train.max_len for a, b in train_pairs):
        raise UserError(
            f"every training pair is longer than max_len={cfg.train.max_len} tokens "
            "(with EOS); raise max_len"
        )
    summary_data: dict[str, Any] = {
        "train_pairs": len(train_text), "train_skipped_empty": train_text.skipped,
        "vocab_size": len(vocab),
    }  # fmt: skip
    valid_pairs, validator = _validation(cfg, vocab, valid_text, summary_data, log)
    torch.manual_seed(cfg.train.seed)
    src_size, tgt_size = vocab_sizes(vocab)
    model = build_model(cfg.model, src_vocab_size=src_size, tgt_vocab_size=tgt_size)
    trainer = Trainer(
        cfg,
        model,
        vocab,
        train_pairs,
        run_dir=out,
        valid_pairs=valid_pairs,
        validator=validator,
        score_key="bleu",
        resume=resume,
        show_progress=show_progress,
        resegment=bpe_dropout_pairs(cfg, vocab, train_text),
        callbacks=callbacks,
        allow_change=allow_change,
    )
    if trainer.n_filtered:
        log(
            f"train: {trainer.n_filtered} pairs longer than max_len={cfg.train.max_len} "
            "tokens left out"
        )
    summary = trainer.train()
    return {**summary, **summary_data}


def train(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: bool = False,
    show_progress: bool | None = None,
    callbacks: Sequence[StepCallback] = (),
    allow_change: Sequence[str] = (),
) -> dict[str, Any]:
    """Train whatever ``cfg.task`` names: translation files, parsing (``training.parsing_run``)
    or a synthetic task. ``callbacks`` are called with the run's progress after every update.
    ``allow_change``: with ``resume``, config keys that may differ from the run's beyond those
    free to (``training/config_change.py``); checked here, before any data is read."""
    allowed_keys(allow_change)  # a UserError naming a key that does not exist
    if allow_change and not resume:
        raise UserError("allow_change (--allow-change) applies only when resuming (--resume)")
    if cfg.task.name == "translation":
        return train_translation(cfg, out_dir, resume=resume, show_progress=show_progress,
                                 callbacks=callbacks, allow_change=allow_change)  # fmt: skip
    if cfg.task.name == "parsing":
        from transduce.training.parsing_run import (
            train_parsing,  # it imports this module
        )

        return train_parsing(cfg, out_dir, resume=resume, show_progress=show_progress,
                             callbacks=callbacks, allow_change=allow_change)  # fmt: skip
    return train_synthetic(cfg, out_dir, resume=resume, show_progress=show_progress,
                           callbacks=callbacks, allow_change=allow_change)  # fmt: skip
