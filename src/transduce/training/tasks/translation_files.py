"""The translation task's data from its text files: parallel text -> a shared SentencePiece BPE
vocabulary (or one per side) -> pairs of ids; BPE-dropout draws each epoch's pairs anew."""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transduce.checkpoint import step_checkpoints, write_text_atomic
from transduce.config import Config, TranslationTaskConfig
from transduce.data.batching import Pair
from transduce.data.parallel import resolve_data_path
from transduce.data.vocab import VocabPair
from transduce.errors import UserError
from transduce.training import distributed
from transduce.training.config_change import allowed_keys
from transduce.training.feed import Resegment
from transduce.training.fit import Log, TaskData, epoch_seed
from transduce.training.validation import TextValidator, Validator

if TYPE_CHECKING:
    from transduce.data.parallel import ParallelText
    from transduce.data.subword import SentencePieceVocab


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


def _restore_vocabulary(saved: Path, paths: list[Path], log: Log) -> None:
    """Write the vocabulary files ``paths`` (one shared, or source and target) from the step
    checkpoint ``saved``, where a resumed run finds them missing: a vocabulary learned anew
    would differ from the one the checkpoint's model reads."""
    from transduce.checkpoint import load, vocab_from_dict

    vocab = vocab_from_dict(load(saved)["vocab"])
    if (len(paths) == 1) == isinstance(vocab, VocabPair):  # the other layout: refused later
        return
    sides = [vocab] if len(paths) == 1 else [getattr(vocab, "source"), getattr(vocab, "target")]
    for side, path in zip(sides, paths, strict=True):
        if not path.is_file():
            getattr(side, "save")(path)
    log(f"vocabulary: {', '.join(map(str, paths))} missing, restored from {saved}")


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
    kept = ["vocab.src.model", "vocab.tgt.model"] if task.shared_vocab else ["vocab.model"]
    if (
        resume
        and not all(p.is_file() for p in paths)
        and all((run_dir / name).is_file() for name in kept)
    ):  # the run's other layout: refused before a vocabulary is learned and written beside it
        raise UserError(
            f"{run_dir} holds {' and '.join(kept)}, but task.shared_vocab is now "
            f"{str(task.shared_vocab).lower()}: a resumed run keeps its checkpoint's vocabulary "
            "(--allow-change or not); a new vocabulary needs a new run"
        )
    saved = step_checkpoints(run_dir / "checkpoints") if resume else []
    if saved and not all(p.is_file() for p in paths):  # its checkpoint holds the vocabulary
        _restore_vocabulary(saved[-1], paths, log)
    if resume and all(p.is_file() for p in paths):
        loaded = [SentencePieceVocab.load(p) for p in paths]
        log(
            f"vocabulary: {' + '.join(str(len(v)) for v in loaded)} pieces from "
            f"{', '.join(map(str, paths))} (resumed run)"
        )
        return loaded[0] if task.shared_vocab else VocabPair(loaded[0], loaded[1])
    if not task.vocab_model:
        log(
            f"learning a BPE vocabulary of {task.vocab_size} pieces on {2 * len(train)} "
            "sentences (may take minutes on a large corpus)"
        )
    if task.vocab_model:  # an existing SentencePiece vocabulary, reused
        from transduce.data.prepare import reused_vocabulary

        learned = reused_vocabulary(task)
    elif task.shared_vocab:
        learned = [_learn(itertools.chain(train.source, train.target), task, cfg.train.seed)]
    else:
        learned = [
            _learn(train.source, task, cfg.train.seed),
            _learn(train.target, task, cfg.train.seed),
        ]
    for vocab, path in zip(learned, paths, strict=True):
        vocab.save(path)
    sample = f" (a sample of {task.vocab_sample} sentences)" if task.vocab_sample else ""
    kind = "shared" if task.shared_vocab else "source and target"
    how = (
        f"reused from {task.vocab_model}"
        if task.vocab_model
        else (f"learned on the training text{sample}")
    )
    log(
        f"vocabulary: {' + '.join(str(len(v)) for v in learned)} {kind} BPE pieces {how} -> "
        f"{', '.join(map(str, paths))}"
    )
    return learned[0] if task.shared_vocab else VocabPair(learned[0], learned[1])


def _rank0_vocabulary(
    cfg: Config,
    run_dir: Path,
    train: ParallelText,
    *,
    resume: bool,
    log: Log,
    world: distributed.World,
) -> SentencePieceVocab | VocabPair:
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


def _validation(
    cfg: Config,
    vocab: SentencePieceVocab | VocabPair,
    valid_text: ParallelText | None,
    summary: dict[str, Any],
    log: Log,
    validator: TextValidator,
) -> tuple[list[Pair], Validator | None]:
    """The validation pairs and their ``validator`` (none without validation files); adds the
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
        zip(
            _sides(vocab)[0].encode_batch(sources),
            _sides(vocab)[1].encode_batch(references),
            strict=True,
        )
    )
    summary.update(valid_pairs=len(valid_pairs), valid_skipped_empty=valid_text.skipped)
    if n < len(valid_text):
        log(f"valid: validating on the first {n} pairs (max_valid_sentences)")
    return valid_pairs, validator(vocab, sources, references)


def _cleaned(
    task: TranslationTaskConfig,
    vocab: SentencePieceVocab | VocabPair,
    text: ParallelText,
    log: Log,
) -> tuple[ParallelText, list[Pair], dict[str, int]]:
    """The training text and its pairs after the ``task.clean_*`` filters, as ``transduce
    prepare`` cleans (``data.encoding.cleaned``; lengths in the vocabulary's deterministic
    pieces, BPE-dropout's epochs drawn from the kept text), and what each filter removed (empty
    without a filter: every pair kept, as read)."""
    from transduce.data.encoding import Cleaning, Repeats, cleaned
    from transduce.data.prepare import task_cleaning

    source, target = _sides(vocab)

    def encode(sources: list[str], targets: list[str]) -> tuple[Any, Any]:
        return source.encode_batch(sources), target.encode_batch(targets)

    cleaning = task_cleaning(task)
    if cleaning == Cleaning():
        return text, list(zip(*encode(text.source, text.target), strict=True)), {}
    rows: Sequence[int] = range(len(text))
    duplicates = 0
    if cleaning.dedup:  # the first of each pair kept
        repeats = Repeats()
        rows = [i for i in rows if not repeats.again(text.source[i], text.target[i])]
        duplicates = len(text) - len(rows)
    kept, src_ids, tgt_ids, removed = cleaned(
        [text.source[i] for i in rows], [text.target[i] for i in rows], cleaning, encode
    )
    removed = {name: n for name, n in {**removed, "duplicate": duplicates}.items() if n}
    rows = [rows[i] for i in kept]
    if not rows:
        raise UserError(
            f"{task.train_src} and {task.train_tgt}: no sentence pairs left after the "
            f"task.clean_* filters ({_removed(removed)} removed)"
        )
    log(f"train: {len(rows)} pairs kept by the task.clean_* filters ({_removed(removed)} removed)")
    kept_text = replace(
        text, source=[text.source[i] for i in rows], target=[text.target[i] for i in rows]
    )
    return kept_text, list(zip(src_ids, tgt_ids, strict=True)), removed


def _removed(removed: dict[str, int]) -> str:
    return ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in removed.items()) or "none"


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
        return list(
            zip(
                source.sample_batch(train.source, dropout=p, seed=seed),
                target.sample_batch(train.target, dropout=p, seed=(seed + 1) % 2**32),
                strict=True,
            )
        )

    return pairs


def _text_digest(text: ParallelText) -> str:
    """The SHA-256 of the training pairs as read (both sides, in order)."""
    digest = hashlib.sha256()
    for side in (text.source, text.target):
        for start in range(0, len(side), 100_000):  # in pieces: no copy of the whole text
            digest.update("\n".join(side[start : start + 100_000]).encode())
            digest.update(b"\n")
        digest.update(b"\0")
    return digest.hexdigest()


def _pairs(record: Any) -> Any:
    return record.get("pairs") if isinstance(record, dict) else "?"


def _text_record(
    text: ParallelText,
    task: TranslationTaskConfig,
    run_dir: Path,
    *,
    resume: bool,
    is_main: bool,
    allow_change: Sequence[str],
) -> Callable[[], None]:
    """Check (on resume) ``training_text.json``, and return what writes it once the run is
    accepted (``TaskData.after_start``): a resumed run takes up its place in the epoch of the
    same pairs, so other pairs would train on silently (another order, another count) and the
    resume would not be exact. A resume that allows other training files (``--allow-change
    task.train_src``/``train_tgt``) takes the new text, and records it."""
    record = {
        "train_src": task.train_src,
        "train_tgt": task.train_tgt,
        "pairs": len(text),
        "sha256": _text_digest(text),
    }
    path = run_dir / "training_text.json"
    allowed = allowed_keys(allow_change) & {"task.train_src", "task.train_tgt"}
    resuming = resume and bool(step_checkpoints(run_dir / "checkpoints"))
    if resuming and not path.is_file() and not allowed and is_main:  # said, not skipped silently
        print(
            f"transduce: note: {path} is missing: this resume cannot check that its training "
            "text is the one the run started with",
            file=sys.stderr,
        )
    if resume and path.is_file() and not allowed:
        try:
            before = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"{path}: cannot read the run's record of its text ({e})") from None
        if not isinstance(before, dict) or before.get("sha256") != record["sha256"]:
            raise UserError(
                f"{task.train_src} and {task.train_tgt}: not the training text this run started "
                f"with ({_pairs(before)} pairs, now {len(text)}; see {path}); resume with those "
                "files, or allow other ones: --allow-change train_src (and train_tgt)"
            )

    def write() -> None:
        if is_main:  # atomic: on resume the other ranks read it meanwhile
            write_text_atomic(path, json.dumps(record, indent=2) + "\n")

    return write


def from_files(
    cfg: Config,
    run_dir: Path,
    world: distributed.World,
    *,
    resume: bool,
    log: Log,
    validator: TextValidator,
    allow_change: Sequence[str] = (),
) -> TaskData:
    """The training and validation pairs of the files of ``cfg.task`` with the run's
    vocabulary (learned, or with ``resume`` read from ``run_dir``), ``validator`` of the
    validation sentences, and the counts of what was read. ``allow_change``: the resume's
    (``training_text.json``)."""
    task = _translation(cfg)
    if not task.train_src or not task.train_tgt:
        raise UserError(
            "task translation needs task.train_src and task.train_tgt (the training files)"
        )
    for key in ("valid_src", "valid_tgt"):  # before minutes of reading the training text
        if getattr(task, key):
            resolve_data_path(getattr(task, key), key)
    train_text = _read_split(cfg, "train", log)
    valid_text = _read_split(cfg, "valid", log)
    assert train_text is not None
    record_text = _text_record(
        train_text,
        task,
        run_dir,
        resume=resume,
        is_main=world.is_main,
        allow_change=allow_change,
    )
    vocab = _rank0_vocabulary(cfg, run_dir, train_text, resume=resume, log=log, world=world)
    train_text, train_pairs, removed = _cleaned(task, vocab, train_text, log)
    counts: dict[str, Any] = {
        "train_pairs": len(train_text),
        "train_skipped_empty": train_text.skipped,
        **({"train_removed": removed} if removed else {}),
        "vocab_size": len(vocab),
    }
    valid_pairs, bleu = _validation(cfg, vocab, valid_text, counts, log, validator)
    resegment = bpe_dropout_pairs(cfg, vocab, train_text)
    return TaskData(vocab, train_pairs, valid_pairs, bleu, "bleu", resegment, counts, record_text)


__all__ = ["bpe_dropout_pairs", "from_files"]
