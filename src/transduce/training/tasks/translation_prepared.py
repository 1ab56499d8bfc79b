"""The translation task's data from a prepared folder (``task.prepared``, written by ``transduce
prepare``).

Every rank opens the folder's memory-mapped ids (it must be on storage every rank sees): the
batches come from the length index alone, and each rank reads only the pairs of its own
batches. The vocabulary is the folder's; the run folder keeps a copy and ``prepared.json``
(the folder and its manifest's SHA-256), checked when the run resumes, so that the data
position in a checkpoint always refers to the same data.

The folder fixes the data: its files, vocabulary and cleaning. A data key of the config that
differs from what the folder was prepared with (and from its default) would be ignored and then
recorded in the checkpoint as if applied, so it is refused, naming the key.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

from transduce.checkpoint import write_text_atomic
from transduce.config import Config, TranslationTaskConfig
from transduce.data.parallel import read_lines, resolve_data_path
from transduce.data.prepared import (
    MANIFEST,
    PreparedSplit,
    file_sha256,
    read_manifest,
    vocab_files,
)
from transduce.data.subword import SentencePieceVocab
from transduce.data.vocab import VocabPair, vocab_sizes
from transduce.errors import UserError
from transduce.training import distributed
from transduce.training.fit import Log, TaskData
from transduce.training.validation import TextValidator, Validator

_FILE_KEYS = ("train_src", "train_tgt", "valid_src", "valid_tgt")
_CLEANING_KEYS = {
    "clean_max_len": "max_len",
    "clean_ratio": "ratio",
    "clean_identical": "identical",
    "clean_dedup": "dedup",
}


def _same_file(value: str, key: str, recorded: dict[str, Any]) -> bool:
    """Whether the config's ``value`` of file key ``key`` names the file the folder was prepared
    from, as it was then: a file of the recorded size and SHA-256, at the recorded path or
    elsewhere (the folder moved to another machine), or nothing left at the recorded path. The
    hash is read only when the sizes agree, and not at the recorded path while the file's
    modification time is the recorded one."""
    path = resolve_data_path(value, key, must_exist=False)
    here = path.resolve() == Path(recorded["path"]).resolve()
    if not path.is_file():
        return here  # removed since: the folder holds its data
    stat = path.stat()
    if stat.st_size != recorded.get("bytes"):
        return False
    if here and stat.st_mtime_ns == recorded.get("mtime_ns"):
        return True
    return file_sha256(path) == recorded.get("sha256")  # a size alone: other data trained


def _same_vocabulary(value: str, vocab: dict[str, Any]) -> bool:
    """Whether ``task.vocab_model`` ``value`` names the files of the folder's reused vocabulary
    (``vocab``: the manifest's record): their SHA-256s those of the folder's copies, or, where
    nothing is left at that name, the name the folder was prepared with."""
    path = resolve_data_path(value, "vocab_model", must_exist=False)
    names = vocab_files(vocab["shared"])
    if path.is_dir():
        files = [path / name for name in names]
    elif path.is_file() and len(names) == 1:
        files = [path]
    else:
        return value == vocab["source"]  # (moved away since: the folder holds its copies)
    return all(f.is_file() for f in files) and [file_sha256(f) for f in files] == [
        vocab["sha256"].get(name) for name in names
    ]


def _check_data_keys(task: TranslationTaskConfig, folder: Path, manifest: dict[str, Any]) -> None:
    """A UserError naming the first data key of ``task`` that is neither its default nor what
    ``folder`` was prepared with (``manifest``): the folder's data would silently stand in."""
    default = {f.name: getattr(TranslationTaskConfig(), f.name) for f in fields(task)}
    vocab, cleaning = manifest["vocab"], manifest.get("cleaning", {})
    sizes = set(vocab["sizes"])
    learned = vocab["source"] == "learned"
    reused = "" if learned else vocab["source"]
    if not learned and task.vocab_model and _same_vocabulary(task.vocab_model, vocab):
        reused = task.vocab_model  # the same files, named another way (or moved)
    prepared: dict[str, Any] = {
        # one size: what a reused vocabulary's size may be given as too (reused_vocabulary)
        "vocab_size": sizes.pop() if len(sizes) == 1 else None,
        "vocab_sample": vocab.get("sample") if learned else None,
        "vocab_model": reused,
        **{key: cleaning.get(name) for key, name in _CLEANING_KEYS.items()},
    }
    for key, was in prepared.items():
        value = getattr(task, key)
        if value != default[key] and value != was:
            if was is not None:
                shown = f"{key} {json.dumps(was)}"
            elif learned:  # two vocabularies of different sizes
                shown = f"vocabularies of {' and '.join(map(str, vocab['sizes']))} pieces"
            else:
                shown = f"the vocabulary of {vocab['source']}, reused (no {key} applies)"
            raise UserError(
                f"{folder}: prepared with {shown}, the config says {key} {json.dumps(value)}; a "
                f"prepared folder fixes its data: leave {key} out, or prepare again"
            )
    inputs = manifest.get("inputs", {})
    for key in _FILE_KEYS:
        value = getattr(task, key)
        if not value or (key in inputs and _same_file(value, key, inputs[key])):
            continue
        path = resolve_data_path(value, key, must_exist=False)
        if key in inputs and path.resolve() == Path(inputs[key]["path"]).resolve():
            raise UserError(
                f"{folder}: prepared from {key} {value}, which has changed since (its size or "
                f"SHA-256 differs); prepare again"
            )
        was = f"from {key} {inputs[key]['path']}" if key in inputs else f"without {key}"
        raise UserError(
            f"{folder}: prepared {was}, the config says {key} {value}; a prepared "
            f"folder fixes its data: leave {key} out, or prepare again"
        )


def _open(task: TranslationTaskConfig) -> tuple[Path, dict[str, Any]]:
    folder = resolve_data_path(task.prepared, "prepared", must_exist=False)  # (read_manifest)
    manifest = read_manifest(folder)  # format, version and vocabulary hashes checked
    if manifest["vocab"]["shared"] != task.shared_vocab:
        raise UserError(
            f"{folder}: prepared with shared_vocab {str(manifest['vocab']['shared']).lower()}, "
            f"the config says {str(task.shared_vocab).lower()}"
        )
    if task.bpe_dropout:
        raise UserError(
            "bpe_dropout needs the training text: train from the files, not from task.prepared"
        )
    _check_data_keys(task, folder, manifest)
    return folder, manifest


def _check_validation_keys(cfg: Config, folder: Path, manifest: dict[str, Any]) -> None:
    """``train.patience`` or ``task.max_valid_sentences`` with a folder prepared without a
    validation split: refused (there is no validation to stop on or to cut), as the files path
    refuses them without validation files."""
    assert isinstance(cfg.task, TranslationTaskConfig)
    if "valid" in manifest["splits"] or not (cfg.train.patience or cfg.task.max_valid_sentences):
        return
    key = "train.patience" if cfg.train.patience else "task.max_valid_sentences"
    raise UserError(
        f"{key} needs validation: {folder} was prepared without a validation split; prepare "
        "it again with task.valid_src and task.valid_tgt"
    )


def _run_record(folder: Path, run_dir: Path, *, resume: bool, is_main: bool) -> None:
    """Check (on resume) or write ``prepared.json`` and the vocabulary copies in the run."""
    record = {"prepared": str(folder.resolve()), "manifest_sha256": file_sha256(folder / MANIFEST)}
    path = run_dir / "prepared.json"
    if resume and path.is_file():
        before = json.loads(path.read_text(encoding="utf-8"))
        if before.get("manifest_sha256") != record["manifest_sha256"]:
            raise UserError(
                f"{folder}: not the prepared data this run started with ({before.get('prepared')},"
                f" see {path}); resume with that folder, or start a new run"
            )
    if is_main:  # atomic: on resume the other ranks read it meanwhile
        write_text_atomic(path, json.dumps(record, indent=2) + "\n")


def _vocabulary(folder: Path, shared: bool, run_dir: Path, *, is_main: bool) -> Any:
    loaded = [SentencePieceVocab.load(folder / name) for name in vocab_files(shared)]
    if is_main:
        for name in vocab_files(shared):
            shutil.copyfile(folder / name, run_dir / name)
    return loaded[0] if shared else VocabPair(loaded[0], loaded[1])


def _check_ids(split: PreparedSplit, vocab: Any) -> None:
    """``split``'s ids checked against the vocabulary (one shared, or a pair)."""
    src, tgt = vocab_sizes(vocab)
    split.check_ids(src, src if tgt is None else tgt)


def _validation(
    cfg: Config,
    folder: Path,
    manifest: dict[str, Any],
    vocab: Any,
    log: Log,
    validator: TextValidator,
) -> tuple[list[Any], Validator | None]:
    if "valid" not in manifest["splits"]:
        log("no validation split in the prepared folder: no BLEU, best.pt or early stopping")
        return [], None
    assert isinstance(cfg.task, TranslationTaskConfig)
    split = PreparedSplit(folder, "valid", manifest)
    _check_ids(split, vocab)
    n = cfg.task.max_valid_sentences or len(split)
    texts = []
    for side in ("src", "tgt"):  # line-aligned with the split, or BLEU fails at validation
        # written=True: its line 1 was any line of valid_src/valid_tgt, read as such there
        lines = read_lines(folder / f"valid.{side}.txt", written=True)
        if len(lines) != len(split):
            raise UserError(
                f"{folder / f'valid.{side}.txt'}: {len(lines)} lines, the validation split "
                f"{len(split)} pairs; the prepared folder was changed (prepare it again)"
            )
        texts.append(lines[:n])
    return list(split[:n]), validator(vocab, texts[0], texts[1])


def from_prepared(
    cfg: Config,
    run_dir: Path,
    world: distributed.World,
    *,
    resume: bool,
    log: Log,
    validator: TextValidator,
) -> TaskData:
    """The training and validation pairs of the prepared folder ``task.prepared`` with its
    vocabulary, ``validator`` of its validation sentences, and the counts of what was read;
    ``prepared.json`` and the vocabulary written to (or, with ``resume``, checked in)
    ``run_dir``."""
    assert isinstance(cfg.task, TranslationTaskConfig)
    folder, manifest = _open(cfg.task)
    _check_validation_keys(cfg, folder, manifest)
    _run_record(folder, run_dir, resume=resume, is_main=world.is_main)
    vocab = _vocabulary(folder, cfg.task.shared_vocab, run_dir, is_main=world.is_main)
    train = PreparedSplit(folder, "train", manifest)
    _check_ids(train, vocab)
    info = manifest["splits"]["train"]
    log(
        f"train: {len(train)} prepared pairs ({manifest['dtype']} ids, {len(info['shards'])} "
        f"shard(s)) from {folder}"
    )
    valid_pairs, bleu = _validation(cfg, folder, manifest, vocab, log, validator)
    counts = {
        "train_pairs": len(train),
        "valid_pairs": len(valid_pairs),
        "vocab_size": len(vocab),
        "prepared": str(folder),
    }
    return TaskData(vocab, train, valid_pairs, bleu, "bleu", counts=counts)


__all__ = ["from_prepared"]
