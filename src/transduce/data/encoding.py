"""Cleaning and encoding sentence pairs in worker processes, written as shards of ids.

The reading process sends chunks of stripped (source, target) lines to a ``multiprocessing``
pool; each worker cleans its chunk (``Cleaning``), encodes what is kept with SentencePiece's
batch API and returns numpy arrays; ``ShardWriter`` appends them, in input order, to the files
that ``transduce.data.prepared`` describes. Per pair, Python does little: the ids are joined
and written by numpy.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from transduce.errors import UserError

__all__ = [
    "Chunk",
    "Cleaning",
    "Encoded",
    "Repeats",
    "ShardWriter",
    "cleaned",
    "encode_chunk",
    "init_worker",
]

# (source lines, target lines), stripped, neither side empty
Chunk = tuple[list[str], list[str]]
REMOVED = ("empty", "duplicate", "identical", "too_long", "ratio")


@dataclass(frozen=True)
class Cleaning:
    """The filters of a split (``valid`` keeps everything but empty sides)."""

    max_len: int = 0  # subword pieces per side, 0 = no limit
    ratio: float = 0.0  # longer side / shorter side in pieces, 0 = no limit
    identical: bool = False  # drop source == target
    dedup: bool = False  # drop repeats (done by the reading process)

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_len": self.max_len,
            "ratio": self.ratio,
            "identical": self.identical,
            "dedup": self.dedup,
        }


@dataclass
class Encoded:
    """A chunk's kept pairs: ids (dtype of the dataset) one pair after another, lengths
    (uint32), the kept pairs' numbers in the chunk, and what each filter removed."""

    src: np.ndarray
    tgt: np.ndarray
    src_lens: np.ndarray
    tgt_lens: np.ndarray
    kept: np.ndarray
    removed: dict[str, int] = field(default_factory=dict)


_worker: dict[str, Any] = {}


def init_worker(protos: list[bytes], cleaning: Cleaning, dtype: str) -> None:
    """Pool initializer: load the SentencePiece model(s) once per worker (source, target)."""
    import sentencepiece as spm

    processors = []
    for proto in protos:
        sp = spm.SentencePieceProcessor()
        sp.LoadFromSerializedProto(proto)
        processors.append(sp)
    _worker.update(src=processors[0], tgt=processors[-1], cleaning=cleaning, dtype=dtype)


def _flat(ids: list[list[int]], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter(map(len, ids), dtype=np.uint32, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lens.sum()))
    return flat, lens


def cleaned(
    sources: list[str],
    targets: list[str],
    cleaning: Cleaning,
    encode: Callable[[list[str], list[str]], tuple[list[list[int]], list[list[int]]]],
) -> tuple[list[int], list[list[int]], list[list[int]], dict[str, int]]:
    """The pairs of ``sources`` and ``targets`` (stripped text) that ``cleaning`` keeps, but for
    ``dedup`` (the caller's, across all chunks: ``Repeats``): (their numbers, their source ids,
    their target ids, what each filter removed). ``encode`` maps (sources, targets) to ids; text
    that encodes to nothing counts as empty; lengths are in pieces."""
    removed = dict.fromkeys(REMOVED, 0)
    rows = list(range(len(sources)))
    if cleaning.identical:  # before encoding: nothing spent on what is dropped
        rows = [i for i in rows if sources[i] != targets[i]]
        removed["identical"] = len(sources) - len(rows)
    src_ids, tgt_ids = encode([sources[i] for i in rows], [targets[i] for i in rows])
    src_lens = np.fromiter(map(len, src_ids), dtype=np.int64, count=len(rows))
    tgt_lens = np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(rows))
    keep = (src_lens > 0) & (tgt_lens > 0)
    removed["empty"] = int((~keep).sum())
    longer, shorter = np.maximum(src_lens, tgt_lens), np.minimum(src_lens, tgt_lens)
    for name, limit, bad in (
        ("too_long", cleaning.max_len, longer > cleaning.max_len),
        ("ratio", cleaning.ratio, longer > cleaning.ratio * shorter),
    ):
        if limit:
            removed[name] = int((keep & bad).sum())
            keep &= ~bad
    chosen = np.flatnonzero(keep).tolist()
    return (
        [rows[i] for i in chosen],
        [src_ids[i] for i in chosen],
        [tgt_ids[i] for i in chosen],
        removed,
    )


class Repeats:
    """``clean_dedup``'s memory: which (source, target) pairs were seen (64-bit hashes)."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def again(self, source: str, target: str) -> bool:
        """Whether the pair was seen before; remembers it."""
        key = hash((source, target))
        if key in self._seen:
            return True
        self._seen.add(key)
        return False


def encode_chunk(chunk: Chunk) -> Encoded:
    """Clean and encode one chunk in a worker (after ``init_worker``)."""

    def encode(sources: list[str], targets: list[str]) -> tuple[Any, Any]:
        return (
            _worker["src"].encode(sources, out_type=int),
            _worker["tgt"].encode(targets, out_type=int),
        )

    rows, src_ids, tgt_ids, removed = cleaned(*chunk, _worker["cleaning"], encode)
    src, src_n = _flat(src_ids, _worker["dtype"])
    tgt, tgt_n = _flat(tgt_ids, _worker["dtype"])
    return Encoded(src, tgt, src_n, tgt_n, np.asarray(rows, dtype=np.int64), removed)


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "wb")
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror or e})") from None


class ShardWriter:
    """Appends encoded chunks to ``SPLIT.K.{src,tgt}.bin`` shards of at most ``shard_pairs``
    pairs, each with its ``SPLIT.K.idx.npy``; the lengths of all pairs go to a raw file that
    ``close`` turns into ``SPLIT.lengths.npy``. Memory: the offsets of one shard."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_pairs: int) -> None:
        self.folder, self.split, self.dtype, self.shard_pairs = folder, split, dtype, shard_pairs
        self.shards: list[dict[str, Any]] = []
        self.pairs = 0
        self._lengths_path = folder / f".{split}.lengths.tmp"
        self._lengths = _open(self._lengths_path)
        self._files: tuple[BinaryIO, BinaryIO] | None = None
        self._lens: list[np.ndarray] = []  # (n, 2) int64 lengths of the open shard's pairs

    def write(self, enc: Encoded) -> None:
        lens = np.stack([enc.src_lens, enc.tgt_lens], axis=1).astype(np.int64)
        lens.astype("<u4").tofile(self._lengths)
        src_ends, tgt_ends = np.cumsum(enc.src_lens), np.cumsum(enc.tgt_lens)
        start = 0
        while start < len(lens):  # split the chunk where a shard fills up
            if self._files is None:
                self._open_shard()
            open_pairs = sum(len(x) for x in self._lens)
            stop = min(len(lens), start + self.shard_pairs - open_pairs)
            s0 = int(src_ends[start - 1]) if start else 0
            t0 = int(tgt_ends[start - 1]) if start else 0
            assert self._files is not None
            enc.src[s0 : int(src_ends[stop - 1])].astype(self.dtype).tofile(self._files[0])
            enc.tgt[t0 : int(tgt_ends[stop - 1])].astype(self.dtype).tofile(self._files[1])
            self._lens.append(lens[start:stop])
            self.pairs += stop - start
            if open_pairs + stop - start >= self.shard_pairs:
                self._close_shard()
            start = stop

    def _name(self) -> str:
        return f"{self.split}.{len(self.shards):03d}"

    def _open_shard(self) -> None:
        name = self._name()
        self._files = (
            _open(self.folder / f"{name}.src.bin"),
            _open(self.folder / f"{name}.tgt.bin"),
        )
        self._lens = []

    def _close_shard(self) -> None:
        assert self._files is not None
        for f in self._files:
            f.close()
        lens = np.concatenate(self._lens) if self._lens else np.zeros((0, 2), np.int64)
        offsets = np.zeros((len(lens) + 1, 2), dtype=np.int64)
        np.cumsum(lens, axis=0, out=offsets[1:])
        name = self._name()
        np.save(self.folder / f"{name}.idx.npy", offsets)
        self.shards.append(
            {
                "name": name,
                "pairs": len(lens),
                "src_tokens": int(offsets[-1, 0]),
                "tgt_tokens": int(offsets[-1, 1]),
            }
        )
        self._files, self._lens = None, []

    def close(self) -> list[dict[str, Any]]:
        """Finish the open shard (one empty shard for an empty split) and the length index;
        returns the shards (name, pairs, tokens)."""
        if self._files is not None or not self.shards:
            if self._files is None:
                self._open_shard()
            self._close_shard()
        self._lengths.close()
        header = {"descr": "<u4", "fortran_order": False, "shape": (self.pairs, 2)}
        with open(self.folder / f"{self.split}.lengths.npy", "wb") as out:
            np.lib.format.write_array_header_1_0(out, header)
            with open(self._lengths_path, "rb") as raw:  # block by block: memory stays flat
                shutil.copyfileobj(raw, out, 1 << 20)
        self._lengths_path.unlink()
        return self.shards
