"""``transduce prepare``: a config's training and validation files, encoded once into a
prepared folder (the format: ``transduce.data.prepared``).

Three streaming passes over the inputs, none of which holds the corpus in memory:

1. scan: each input's bytes, lines and SHA-256 (parallel files must have equal line counts);
2. the vocabulary: reused (``task.vocab_model``) or learned by SentencePiece on a random sample
   of ``task.vocab_sample`` sentences (default ``DEFAULT_VOCAB_SAMPLE``: SentencePiece holds what
   it learns from in memory, so a sample always applies), the sample drawn by line number;
3. encode: pairs read in chunks, cleaned and encoded in worker processes, written in order.

Memory: a bounded number of chunks in flight, one shard's offsets, and with ``clean_dedup``
a set of one 64-bit hash per distinct pair (about 70 bytes each).
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from transduce.config import Config, TranslationTaskConfig
from transduce.data.encoding import (
    REMOVED,
    Chunk,
    Cleaning,
    Encoded,
    Repeats,
    ShardWriter,
    encode_chunk,
    init_worker,
)
from transduce.data.parallel import GZIP_MAGIC, check_line, iter_lines, resolve_data_path
from transduce.data.prepared import FORMAT, MANIFEST, VERSION, file_sha256, vocab_files
from transduce.data.subword import SentencePieceVocab, train_sentencepiece
from transduce.errors import UserError

__all__ = [
    "DEFAULT_VOCAB_SAMPLE",
    "prepare",
    "reused_vocabulary",
    "scan_input",
    "task_cleaning",
    "vocabulary",
    "write_vocabulary",
]

Log = Callable[[str], None]
DEFAULT_VOCAB_SAMPLE = 1_000_000  # sentences SentencePiece learns from when vocab_sample is 0
CHUNK_PAIRS = 2000  # pairs per task sent to a worker


def _translation(cfg: Config, command: str = "prepare") -> TranslationTaskConfig:
    """The translation task of ``cfg``; a UserError naming ``command`` for another task."""
    if not isinstance(cfg.task, TranslationTaskConfig):
        learns = (
            "; a parsing run learns its vocabularies from task.parse_data when it trains "
            "(transduce train)"
            if cfg.task.name == "parsing"
            else ""
        )
        raise UserError(
            f"task.name is {cfg.task.name!r}; {command} needs a translation task{learns}"
        )
    return cfg.task


def scan_input(path: Path) -> dict[str, Any]:
    """``{"path", "bytes", "mtime_ns", "lines", "sha256", "blank"}`` of an input file (lines of
    the decompressed text for ``.gz``; the hash, size and modification time of the file as it
    is; ``blank``: nothing but whitespace in it)."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    lines, last, blank = 0, b"\n", True
    compressed = path.suffix.lower() == ".gz"
    try:
        with gzip.open(path, "rb") if compressed else open(path, "rb") as f:
            while block := f.read(1 << 20):
                if not lines and last == b"\n":  # the first block: what reading would refuse
                    _check_start(block, path, compressed)
                lines += block.count(b"\n")
                last = block[-1:]
                blank = blank and not block.strip()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # as parallel.iter_lines says it
        detail = "truncated" if isinstance(e, EOFError) else str(e)
        raise UserError(f"{path}: corrupt gzip file ({detail})") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e})") from None
    stat = path.stat()
    return {
        "path": str(path),
        "bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,  # unchanged with its size: trusted without hashing again
        "lines": lines + (last != b"\n"),
        "sha256": file_sha256(path),
        "blank": blank,
    }


def _check_start(block: bytes, path: Path, compressed: bool) -> None:
    """The errors reading the file would give on its first line (``parallel.iter_lines``),
    given before its lines are counted: a count of gzip bytes or of one line of \\r-ended
    ones would be reported as files of different lengths."""
    if block.startswith(GZIP_MAGIC) and not compressed:
        raise UserError(f"{path}: gzip data in a file not named .gz (name it so, or decompress it)")
    first = block.split(b"\n", 1)[0]
    check_line(first.decode("utf-8", errors="replace"), str(path), 1)


def _inputs(task: TranslationTaskConfig, valid: bool = True) -> dict[str, dict[str, Any]]:
    """The scan of every input file the task names (train and, if set and ``valid``, valid)."""
    with_valid = valid and bool(task.valid_src)
    keys = ["train_src", "train_tgt"] + (["valid_src", "valid_tgt"] if with_valid else [])
    for key in keys[:2]:
        if not getattr(task, key):
            raise UserError(f"task.{key} is not set; name the training files to prepare")
    found = {key: scan_input(resolve_data_path(getattr(task, key), key)) for key in keys}
    for key, scan in found.items():  # as reading it for training refuses it
        if scan.pop("blank"):
            raise UserError(f"{scan['path']} (task.{key}): all {scan['lines']} lines are empty")
    for split in ("train", "valid"):
        if f"{split}_src" in found:
            a, b = found[f"{split}_src"], found[f"{split}_tgt"]
            if a["lines"] != b["lines"]:
                raise UserError(
                    f"parallel files differ in length: {a['path']} has {a['lines']} "
                    f"lines, {b['path']} has {b['lines']} lines"
                )
    return found


def _sample(paths: list[Path], lines: list[int], k: int, seed: int) -> list[str]:
    """A uniform random sample of ``k`` of the lines of ``paths`` (all if fewer), read in one
    pass that decodes only the lines drawn."""
    total = sum(lines)
    chosen = np.random.default_rng(seed).choice(total, size=min(k, total), replace=False)
    chosen.sort()
    wanted, picked, base = chosen.tolist(), [], 0
    j = 0
    for path, n in zip(paths, lines, strict=True):
        for number, line in enumerate(iter_lines(path), start=base):
            if j == len(wanted):
                break
            if number == wanted[j]:
                picked.append(line)
                j += 1
        base += n
    return picked


def reused_vocabulary(task: TranslationTaskConfig) -> list[SentencePieceVocab]:
    """The vocabulary named by ``task.vocab_model``: a .model file or a folder of them."""
    where = resolve_data_path(task.vocab_model, "vocab_model")
    if where.is_dir():
        vocabs = [SentencePieceVocab.load(where / name) for name in vocab_files(task.shared_vocab)]
    elif not task.shared_vocab:
        raise UserError(
            f"task.vocab_model = {task.vocab_model!r}: with shared_vocab false, name "
            "a folder holding vocab.src.model and vocab.tgt.model"
        )
    else:
        vocabs = [SentencePieceVocab.load(where)]
    sizes = sorted({len(v) for v in vocabs})
    if task.vocab_size != TranslationTaskConfig().vocab_size and sizes != [task.vocab_size]:
        raise UserError(
            f"task.vocab_size is {task.vocab_size}, but the vocabulary of task.vocab_model "
            f"({task.vocab_model}) has {' and '.join(map(str, sizes))} pieces: a reused "
            "vocabulary keeps its size; leave vocab_size out"
        )
    return vocabs


def vocabulary(
    cfg: Config, inputs: dict[str, dict[str, Any]], log: Log
) -> list[SentencePieceVocab]:
    """[shared] or [source, target]: reused from ``task.vocab_model`` or learned on a sample of
    ``task.vocab_sample`` (or ``DEFAULT_VOCAB_SAMPLE``) training sentences."""
    task = _translation(cfg)
    if task.vocab_model:
        vocabs = reused_vocabulary(task)
        log(
            f"vocabulary: {' + '.join(str(len(v)) for v in vocabs)} pieces reused from "
            f"{task.vocab_model}"
        )
        return vocabs
    k = task.vocab_sample or DEFAULT_VOCAB_SAMPLE
    src, tgt = inputs["train_src"], inputs["train_tgt"]
    sides = [[src, tgt]] if task.shared_vocab else [[src], [tgt]]
    started = time.monotonic()
    vocabs = []
    for files in sides:
        sample = _sample(
            [Path(f["path"]) for f in files], [f["lines"] for f in files], k, cfg.train.seed
        )
        vocabs.append(train_sentencepiece(sample, task.vocab_size, seed=cfg.train.seed))
        del sample
    drawn = min(k, src["lines"] + tgt["lines"] if task.shared_vocab else src["lines"])
    log(
        f"vocabulary: {' + '.join(str(len(v)) for v in vocabs)} BPE pieces learned on a sample "
        f"of {drawn} lines in {time.monotonic() - started:.0f} s"
    )
    return vocabs


def task_cleaning(task: TranslationTaskConfig) -> Cleaning:
    """The filters of ``task``'s ``clean_*`` keys."""
    return Cleaning(task.clean_max_len, task.clean_ratio, task.clean_identical, task.clean_dedup)


def _chunks(src: Path, tgt: Path, dedup: bool, removed: dict[str, int]) -> Iterator[Chunk]:
    """Chunks of (source, target) lines with both sides non-empty and, with ``dedup``, not seen
    before (64-bit hashes; ``removed`` counts what was left out)."""
    repeats = Repeats()
    sources: list[str] = []
    targets: list[str] = []
    for s, t in zip(iter_lines(src), iter_lines(tgt), strict=True):
        if not s or not t:
            removed["empty"] += 1
            continue
        if dedup and repeats.again(s, t):
            removed["duplicate"] += 1
            continue
        sources.append(s)
        targets.append(t)
        if len(sources) == CHUNK_PAIRS:
            yield sources, targets
            sources, targets = [], []
    if sources:
        yield sources, targets


def _encoded(
    chunks: Iterator[Chunk], protos: list[bytes], cleaning: Cleaning, dtype: str, workers: int
) -> Iterator[tuple[Chunk, Encoded]]:
    """Each chunk with its encoding, in order; ``workers`` > 1 encodes in that many processes,
    with at most 4 chunks per worker in flight (memory stays bounded)."""
    if workers <= 1:
        init_worker(protos, cleaning, dtype)
        for chunk in chunks:
            yield chunk, encode_chunk(chunk)
        return
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    with ctx.Pool(workers, initializer=init_worker, initargs=(protos, cleaning, dtype)) as pool:
        pending: collections.deque[tuple[Chunk, Any]] = collections.deque()
        for chunk in chunks:
            pending.append((chunk, pool.apply_async(encode_chunk, (chunk,))))
            if len(pending) >= 4 * workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()


class _Progress:
    """A tqdm bar of lines read on a terminal, else a log line every ``every`` seconds."""

    def __init__(self, split: str, total: int, show: bool | None, log: Log, every: float = 30):
        tty = sys.stderr.isatty() if show is None else show
        self.bar = tqdm(
            total=total,
            unit="pairs",
            unit_scale=True,
            desc=f"prepare {split}",
            disable=not tty,
            dynamic_ncols=True,
        )
        self.headless = not tty and show is not False
        self.split, self.total, self.log, self.every = split, total, log, every
        self.started = self.last = time.monotonic()
        self.done = 0

    def update(self, n: int) -> None:
        self.done += n
        self.bar.update(n)
        now = time.monotonic()
        if self.headless and now - self.last >= self.every:
            self.last = now
            self.log(
                f"prepare {self.split}: {self.done}/{self.total} lines, "
                f"{self.done / (now - self.started):.0f} pairs/s"
            )

    def close(self) -> float:
        self.bar.close()
        return time.monotonic() - self.started


def _split(
    folder: Path,
    split: str,
    inputs: dict[str, dict[str, Any]],
    protos: list[bytes],
    cleaning: Cleaning,
    settings: dict[str, Any],
    log: Log,
) -> dict[str, Any]:
    """Encode one split into ``folder``; its manifest entry."""
    src, tgt = Path(inputs[f"{split}_src"]["path"]), Path(inputs[f"{split}_tgt"]["path"])
    removed = dict.fromkeys(REMOVED, 0)
    writer = ShardWriter(folder, split, settings["dtype"], settings["shard_pairs"])
    lines = inputs[f"{split}_src"]["lines"]
    progress = _Progress(split, lines, settings["show_progress"], log)
    texts = (
        [open(folder / f"valid.{s}.txt", "w", encoding="utf-8") for s in ("src", "tgt")]
        if split == "valid"
        else []
    )
    workers = settings["workers"] if split == "train" else 1
    chunks = _chunks(src, tgt, cleaning.dedup, removed)
    for chunk, enc in _encoded(chunks, protos, cleaning, settings["dtype"], workers):
        writer.write(enc)
        for key, n in enc.removed.items():
            removed[key] += n
        for f, side in zip(texts, chunk, strict=False):
            f.writelines(side[i] + "\n" for i in enc.kept.tolist())
        progress.update(len(chunk[0]))
    for f in texts:
        f.close()
    seconds = progress.close()
    shards = writer.close()
    if not writer.pairs:  # (validation is not cleaned: its pairs with an empty side are gone)
        after = "after cleaning " if split == "train" else "with both sides non-empty "
        raise UserError(f"{src} and {tgt}: no sentence pairs left {after}({removed})")
    for shard in shards:
        shard["sha256"] = {
            kind: file_sha256(folder / f"{shard['name']}.{kind}")
            for kind in ("src.bin", "tgt.bin", "idx.npy")
        }
    log(
        f"{split}: {writer.pairs} of {lines} pairs kept in {len(shards)} shard(s), "
        f"{lines / max(seconds, 1e-9):.0f} pairs/s; removed "
        + ", ".join(f"{k} {v}" for k, v in removed.items())
    )
    return {
        "lines": lines,
        "pairs": writer.pairs,
        "removed": removed,
        "shards": shards,
        "seconds": round(seconds, 2),
        "lengths_sha256": file_sha256(folder / f"{split}.lengths.npy"),
    }


def _out_folder(out_dir: str | Path) -> Path:
    folder = Path(out_dir)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder}: exists and is not an empty folder; prepare into a new one")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{folder}: cannot create the folder ({e.strerror or e})") from None
    return folder


def prepare(
    cfg: Config,
    out_dir: str | Path,
    *,
    workers: int = 0,
    shard_pairs: int = 1_000_000,
    show_progress: bool | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """Prepare the task's files into ``out_dir`` (a new or empty folder); returns the manifest,
    also written there last (its presence marks a complete folder). ``workers``: encoding
    processes (0 = one per CPU core); ``shard_pairs``: pairs per shard."""
    task = _translation(cfg)
    if shard_pairs <= 0:
        raise UserError(f"shard_pairs must be positive; got {shard_pairs}")
    if workers < 0:
        raise UserError(f"workers must be 0 (one per CPU core) or more; got {workers}")
    inputs = _inputs(task)
    folder = _out_folder(out_dir)
    try:
        return _prepare_into(folder, cfg, inputs, shard_pairs, workers, show_progress, log)
    except BaseException:  # (an interrupt too) a folder without its manifest is of no use
        for child in folder.iterdir():  # it was new or empty: all of it is this run's
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def _prepare_into(
    folder: Path,
    cfg: Config,
    inputs: dict[str, dict[str, Any]],
    shard_pairs: int,
    workers: int,
    show_progress: bool | None,
    log: Log,
) -> dict[str, Any]:
    """``prepare``'s work, into the new (or empty) ``folder``."""
    task = _translation(cfg)
    vocabs = vocabulary(cfg, inputs, log)
    names = vocab_files(task.shared_vocab)
    for vocab, name in zip(vocabs, names, strict=True):
        vocab.save(folder / name)
    size = max(len(v) for v in vocabs)
    settings = {
        "dtype": "uint16" if size <= 1 << 16 else "uint32",
        "shard_pairs": shard_pairs,
        "workers": workers or os.cpu_count() or 1,
        "show_progress": show_progress,
    }
    cleaning = task_cleaning(task)
    protos = [v.model_proto for v in vocabs]
    splits = {"train": _split(folder, "train", inputs, protos, cleaning, settings, log)}
    if "valid_src" in inputs:
        splits["valid"] = _split(folder, "valid", inputs, protos, Cleaning(), settings, log)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": settings["dtype"],
        "vocab": {
            "shared": task.shared_vocab,
            "sizes": [len(v) for v in vocabs],
            "sha256": {name: file_sha256(folder / name) for name in names},
            "source": task.vocab_model or "learned",
            "sample": 0 if task.vocab_model else task.vocab_sample or DEFAULT_VOCAB_SAMPLE,
        },
        "inputs": inputs,
        "cleaning": {"empty": True, **cleaning.as_dict()},
        "shard_pairs": shard_pairs,
        "workers": settings["workers"],
        "splits": splits,
        "config_digest": hashlib.sha256(
            json.dumps(cfg.to_dict()["task"], sort_keys=True).encode()
        ).hexdigest(),
    }
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)
    return manifest


def write_vocabulary(
    cfg: Config, out_dir: str | Path, log: Log = print, *, force: bool = False
) -> list[Path]:
    """``transduce vocab``: learn the task's vocabulary (as ``prepare`` does) into ``out_dir``;
    a vocabulary already there (a prepared folder's, a run's) is replaced only with ``force``.
    The folder is checked before the (long) learning."""
    task = _translation(cfg, "vocab")
    if task.vocab_model:
        raise UserError("task.vocab_model is set: there is nothing to learn")
    folder = Path(out_dir)
    paths = [folder / name for name in vocab_files(task.shared_vocab)]
    there = [p.name for p in paths if p.exists()]
    if there and not force:
        raise UserError(
            f"{folder}: holds {', '.join(there)} already (a prepared folder or a run may depend "
            "on it); choose another --out, or add --force to replace it"
        )
    inputs = _inputs(task, valid=False)  # a bad input named before the folder is made
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{folder}: cannot create the folder ({e.strerror or e})") from None
    vocabs = vocabulary(cfg, inputs, log)  # learned on the training text
    for vocab, path in zip(vocabs, paths, strict=True):
        vocab.save(path)
    return paths
