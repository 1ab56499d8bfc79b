"""Translation from a prepared folder (``task.prepared``, written by ``transduce prepare``).

Every rank opens the folder's memory-mapped ids (it must be on storage every rank sees): the
batches come from the length index alone, and each rank reads only the pairs of its own
batches. The vocabulary is the folder's; the run folder keeps a copy and ``prepared.json``
(the folder and its manifest's SHA-256), checked when the run resumes, so that the data
position in a checkpoint always refers to the same data.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from transduce.architectures import build_model
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
from transduce.training.run import Log, bleu_validator
from transduce.training.trainer import StepCallback, Trainer, Validator

__all__ = ["train_prepared"]


def _open(task: TranslationTaskConfig) -> tuple[Path, dict[str, Any]]:
    folder = resolve_data_path(task.prepared, "prepared")
    manifest = read_manifest(folder)  # format, version and vocabulary hashes checked
    if manifest["vocab"]["shared"] != task.shared_vocab:
        raise UserError(
            f"{folder}: prepared with shared_vocab {str(manifest['vocab']['shared']).lower()}, "
            f"the config says {str(task.shared_vocab).lower()}"
        )
    if task.bpe_dropout:
        raise UserError("bpe_dropout needs the training text: train from the files, not from "
                        "task.prepared")  # fmt: skip
    return folder, manifest


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
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _vocabulary(folder: Path, shared: bool, run_dir: Path, *, is_main: bool) -> Any:
    loaded = [SentencePieceVocab.load(folder / name) for name in vocab_files(shared)]
    if is_main:
        for name in vocab_files(shared):
            shutil.copyfile(folder / name, run_dir / name)
    return loaded[0] if shared else VocabPair(loaded[0], loaded[1])


def _validation(
    cfg: Config, folder: Path, manifest: dict[str, Any], vocab: Any, log: Log
) -> tuple[list[Any], Validator | None]:
    if "valid" not in manifest["splits"]:
        log("no validation split in the prepared folder: no BLEU, best.pt or early stopping")
        return [], None
    assert isinstance(cfg.task, TranslationTaskConfig)
    split = PreparedSplit(folder, "valid", manifest)
    n = cfg.task.max_valid_sentences or len(split)
    sources = read_lines(folder / "valid.src.txt")[:n]
    references = read_lines(folder / "valid.tgt.txt")[:n]
    return list(split[:n]), bleu_validator(cfg, vocab, sources, references)


def train_prepared(
    cfg: Config, out_dir: str | Path, *, resume: bool = False, show_progress: bool | None = None,
    log: Log, callbacks: Sequence[StepCallback] = (), allow_change: Sequence[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """Train a translation model on the prepared folder ``task.prepared`` into ``out_dir``;
    the Trainer's summary plus the data counts."""
    world, _ = distributed.init_from_env(cfg.train.device)
    assert isinstance(cfg.task, TranslationTaskConfig)
    folder, manifest = _open(cfg.task)
    out = Path(out_dir)
    _run_record(folder, out, resume=resume, is_main=world.is_main)
    vocab = _vocabulary(folder, cfg.task.shared_vocab, out, is_main=world.is_main)
    train = PreparedSplit(folder, "train", manifest)
    info = manifest["splits"]["train"]
    log(f"train: {len(train)} prepared pairs ({manifest['dtype']} ids, {len(info['shards'])} "
        f"shard(s)) from {folder}")  # fmt: skip
    valid_pairs, validator = _validation(cfg, folder, manifest, vocab, log)
    torch.manual_seed(cfg.train.seed)
    src_size, tgt_size = vocab_sizes(vocab)
    model = build_model(cfg.model, src_vocab_size=src_size, tgt_vocab_size=tgt_size)
    trainer = Trainer(
        cfg, model, vocab, train, run_dir=out, valid_pairs=valid_pairs, validator=validator,
        score_key="bleu", resume=resume, show_progress=show_progress, callbacks=callbacks,
        allow_change=allow_change,
    )  # fmt: skip
    if trainer.n_filtered:
        log(f"train: {trainer.n_filtered} pairs longer than max_len={cfg.train.max_len} "
            "tokens left out")  # fmt: skip
    summary = trainer.train()
    return {**summary, "train_pairs": len(train), "valid_pairs": len(valid_pairs),
            "vocab_size": len(vocab), "prepared": str(folder)}  # fmt: skip
