"""A prepared dataset: token ids encoded once, memory-mapped, read pair by pair.

``transduce prepare`` (``transduce.data.prepare``) writes a folder:

* ``manifest.json``: format and version, the id dtype, the vocabulary files with their SHA-256,
  the inputs (path, bytes, lines, SHA-256), the cleaning applied with what each filter removed,
  and per split its pairs, tokens and shards, each output file with its bytes and SHA-256.
* ``vocab.model`` (shared) or ``vocab.src.model`` and ``vocab.tgt.model``: SentencePiece models.
* per split (``train``, ``valid``) and shard ``K`` (``train.000``, ``train.001`` ...):
  ``SPLIT.K.src.bin`` and ``SPLIT.K.tgt.bin``, the ids of every pair one after another, no
  BOS/EOS, as raw little-endian ``uint16`` (vocabularies of at most 65,536 pieces) or
  ``uint32``; ``SPLIT.K.idx.npy``, int64 (pairs + 1, 2): where each pair's source and target
  start in the two ``.bin`` files (the last row: their lengths in ids).
* ``SPLIT.lengths.npy``: uint32 (pairs, 2), each pair's (source, target) length in ids, over
  all shards in order: the length index that batching reads without touching a pair.
* ``valid.src.txt`` and ``valid.tgt.txt``: the kept validation sentences as text (for BLEU).

``PreparedSplit`` opens a split with numpy memory maps: opening reads the length index only;
``split[i]`` reads pair ``i``'s ids, so a process holds in memory the pages of the pairs it
reads, whatever the corpus size.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from transduce.data.batching import Pair, spans
from transduce.data.flat_pairs import ArrayPairs
from transduce.errors import UserError

__all__ = ["FORMAT", "VERSION", "PreparedSplit", "file_sha256", "read_manifest", "vocab_files"]

FORMAT = "transduce-prepared"
VERSION = 1
MANIFEST = "manifest.json"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex, read in 1 MiB blocks."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    return h.hexdigest()


def vocab_files(shared: bool) -> list[str]:
    """The vocabulary file names of a prepared folder (and of a run folder)."""
    return ["vocab.model"] if shared else ["vocab.src.model", "vocab.tgt.model"]


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest of a prepared folder, its format and version checked, and the vocabulary
    files checked against their hashes (a UserError naming the file otherwise)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise UserError(f"{folder}: not a prepared dataset (no {MANIFEST}; run transduce prepare)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{path}: not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise UserError(
            f"{path}: format version {manifest.get('version')}, this transduce reads {VERSION}; "
            "prepare the data again"
        )
    _check_structure(manifest, path)
    for name, digest in manifest["vocab"]["sha256"].items():
        if file_sha256(folder / name) != digest:
            raise UserError(
                f"{folder / name}: vocabulary hash differs from {path}; the folder was changed "
                "after transduce prepare (prepare it again)"
            )
    return manifest


def _check_structure(manifest: dict[str, Any], path: Path) -> None:
    """A UserError naming what of a manifest's structure is missing or of the wrong type (an
    edited or damaged file), before anything reads it."""

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise UserError(f"{path}: damaged manifest ({what}); prepare the data again")

    vocab, splits = manifest.get("vocab"), manifest.get("splits")
    need(isinstance(vocab, dict), "no vocab section")
    assert isinstance(vocab, dict)
    need(isinstance(vocab.get("sha256"), dict) and bool(vocab["sha256"]), "no vocabulary hashes")
    need(isinstance(vocab.get("shared"), bool), "vocab.shared is not true or false")
    need(manifest.get("dtype") in ("uint16", "uint32"), f"dtype {manifest.get('dtype')!r}")
    need(isinstance(splits, dict) and "train" in splits, "no train split")
    assert isinstance(splits, dict)
    for name, split in splits.items():
        shards = split.get("shards") if isinstance(split, dict) else None
        need(isinstance(shards, list) and bool(shards), f"split {name!r} has no shards")
        assert isinstance(shards, list)
        for k, shard in enumerate(shards):
            need(
                isinstance(shard, dict)
                and isinstance(shard.get("name"), str)
                and isinstance(shard.get("pairs"), int)
                and shard["pairs"] >= 0,
                f"split {name!r}, shard {k}: no name or pair count",
            )


class PreparedSplit(ArrayPairs):
    """One split of a prepared folder as a sequence of (source ids, target ids) lists, like
    in-memory pairs; ``model_lengths()`` and ``select()`` let batching work from the length
    index alone (``transduce.data.batching.length_index``, ``select_pairs``)."""

    def __init__(self, folder: str | Path, split: str, manifest: dict[str, Any] | None = None):
        self.folder = Path(folder)
        self.manifest = manifest if manifest is not None else read_manifest(self.folder)
        if split not in self.manifest["splits"]:
            raise UserError(f"{self.folder}: no {split!r} split in the prepared dataset")
        info = self.manifest["splits"][split]
        self.split = split
        self.dtype = np.dtype(self.manifest["dtype"]).newbyteorder("<")
        self._shards = [self._open_shard(s["name"], s["pairs"]) for s in info["shards"]]
        counts = [s["pairs"] for s in info["shards"]]
        self._starts = np.cumsum([0, *counts], dtype=np.int64)
        lengths_path = self.folder / f"{split}.lengths.npy"
        self._lengths = self._load(lengths_path, mmap=False)
        if self._lengths.shape != (int(self._starts[-1]), 2):
            raise UserError(
                f"{lengths_path}: a table of shape {self._lengths.shape}, the manifest says "
                f"{int(self._starts[-1])} pairs (a table of that many rows of 2 lengths); "
                "prepare the data again"
            )
        for k, (shard, (index, _, _)) in enumerate(zip(info["shards"], self._shards, strict=True)):
            # each pair's ids as the index bounds them, against the length index (one pass)
            lengths = self._lengths[int(self._starts[k]) : int(self._starts[k + 1])]
            if index[0].any() or not np.array_equal(np.diff(index, axis=0), lengths):
                raise UserError(
                    f"{self.folder / (shard['name'] + '.idx.npy')}: its pairs' bounds disagree "
                    f"with {lengths_path}; the prepared folder is damaged or changed (prepare it "
                    "again)"
                )
        self._rows: np.ndarray | None = None  # the pairs numbered (select), or all

    def _load(self, path: Path, *, mmap: bool) -> np.ndarray:
        try:
            return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UserError(f"{path}: cannot read ({e})") from None

    def _open_shard(self, name: str, pairs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        index_path = self.folder / f"{name}.idx.npy"
        index = self._load(index_path, mmap=True)
        if index.shape != (pairs + 1, 2):
            raise UserError(
                f"{index_path}: {index.shape[0] - 1 if index.ndim == 2 else '?'} pairs, the "
                f"manifest says {pairs}; the prepared folder is incomplete or changed"
            )
        sides = []
        for side, column in (("src", 0), ("tgt", 1)):
            path = self.folder / f"{name}.{side}.bin"
            expected = int(index[-1, column]) * self.dtype.itemsize
            size = path.stat().st_size if path.is_file() else -1
            if size != expected:
                raise UserError(
                    f"{path}: {size} bytes, the index says {expected}; the prepared "
                    "folder is incomplete or changed"
                )
            # an empty file cannot be mapped
            sides.append(
                np.memmap(path, dtype=self.dtype, mode="r") if size else np.zeros(0, self.dtype)
            )
        return index, sides[0], sides[1]

    def check_ids(self, src_size: int, tgt_size: int) -> None:
        """A UserError naming the first shard file holding an id outside its vocabulary
        (``src_size`` / ``tgt_size`` ids): a damaged file would otherwise fail mid-run, in the
        model's embedding. Reads every shard once."""
        for info, (_, src, tgt) in zip(
            self.manifest["splits"][self.split]["shards"], self._shards, strict=True
        ):
            for side, ids, size in (("src", src, src_size), ("tgt", tgt, tgt_size)):
                if len(ids) and int(ids.max()) >= size:
                    raise UserError(
                        f"{self.folder / (info['name'] + '.' + side + '.bin')}: holds id "
                        f"{int(ids.max())}, the vocabulary has {size}; the prepared folder is "
                        "damaged or changed (prepare it again)"
                    )

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else int(self._starts[-1])

    def _pair_numbers(self, rows: np.ndarray) -> np.ndarray:
        """Numbers of this view (int array) -> numbers of the split's pairs."""
        return self._through(rows, self._rows)

    def _pair(self, k: int) -> Pair:
        pair = int(self._rows[k]) if self._rows is not None else k
        shard = int(np.searchsorted(self._starts, pair, side="right")) - 1
        index, src, tgt = self._shards[shard]
        row = pair - int(self._starts[shard])
        (s0, t0), (s1, t1) = index[row : row + 2].tolist()
        return src[s0:s1].tolist(), tgt[t0:t1].tolist()

    def ids_of(self, rows: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray]:
        """rows (B,) int, numbers of this view -> (the ``side`` ("src" or "tgt") ids of those
        pairs end to end, in that order, (total,) int64; each one's length (B,) int64): one
        gather a shard, no Python step per pair (``data.flat_pairs`` says why)."""
        column = ("src", "tgt").index(side)
        pairs = self._pair_numbers(rows)
        lens = self._lengths[pairs, column].astype(np.int64)  # (B,)
        out_begins = np.cumsum(lens) - lens  # (B,) where each pair's ids begin in the output
        out = np.empty(int(lens.sum()), dtype=np.int64)
        shard_of = np.searchsorted(self._starts, pairs, side="right") - 1  # (B,)
        for k in np.unique(shard_of).tolist():
            here = np.flatnonzero(shard_of == k)  # (b,) the pairs in shard k
            index, ids = self._shards[k][0], self._shards[k][1 + column]
            first = index[pairs[here] - self._starts[k], column].astype(np.int64)  # (b,)
            out[spans(out_begins[here], lens[here])] = ids[spans(first, lens[here])]
        return out, lens

    def model_lengths(self) -> np.ndarray:
        """(N, 2) int32: (source + EOS, BOS + target) lengths, from the length index alone."""
        table = self._lengths if self._rows is None else self._lengths[self._rows]
        return table.astype(np.int32) + 1

    def select(self, rows: np.ndarray) -> PreparedSplit:
        """A view of the pairs numbered ``rows`` (int array, numbers of this view), sharing the
        memory maps; nothing is read."""
        view = object.__new__(PreparedSplit)
        view.__dict__.update(self.__dict__)
        view._rows = self._pair_numbers(rows)
        return view
