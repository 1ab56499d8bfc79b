"""Subword vocabularies with SentencePiece (Kudo & Richardson, 2018).

The paper encodes WMT En-De with a shared source-target byte-pair encoding (section 5.1); here
``train_sentencepiece`` trains such a shared BPE vocabulary on raw, untokenized sentences (no
Moses tokenizer needed: SentencePiece treats whitespace as a symbol, so ``decode`` gives back
detokenized text).

Choices:

* Special ids are those of every transduce vocabulary: PAD 0, BOS 1, EOS 2, UNK 3 (pieces
  ``<pad> <s> </s> <unk>``); a model file with other special ids is refused.
* Text is normalized with SentencePiece's default rule ``nmt_nfkc`` (NFKC plus folding of odd
  whitespace; runs of spaces collapse to one, leading/trailing spaces are dropped). So
  ``decode(encode(s)) == s`` holds for NFKC-normal text with single spaces; characters never seen
  in training encode as UNK, which ``decode`` drops.
* ``vocab_size`` is exact (SentencePiece's ``hard_vocab_limit``): a size the data cannot fill is a
  ``UserError`` quoting the largest size that works, rather than a silently smaller vocabulary
  (pass ``hard_vocab_limit=False`` to accept one).
* Training is deterministic: same sentences and options give the same model bytes. The random
  seed only matters for options that sample (``input_sentence_size``).
"""

from __future__ import annotations

import base64
import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import sentencepiece as spm

from transduce.data.parallel import iter_lines
from transduce.data.vocab import BOS, EOS, PAD, SPECIALS, UNK
from transduce.errors import UserError

__all__ = ["SentencePieceVocab", "train_sentencepiece", "train_sentencepiece_files"]

_N_SPECIAL = len(SPECIALS)


class SentencePieceVocab:
    """A SentencePiece model as a transduce ``Vocab`` (text <-> ids, no BOS/EOS added)."""

    def __init__(self, model_proto: bytes, *, name: str = "sentencepiece model") -> None:
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self._proto)
        except (RuntimeError, OSError, TypeError) as e:
            raise UserError(f"{name}: not a SentencePiece model ({e})") from None
        ids = (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id(), self._sp.unk_id())
        if ids != (PAD, BOS, EOS, UNK):
            raise UserError(
                f"{name}: special ids pad/bos/eos/unk are {ids}, transduce needs "
                f"{(PAD, BOS, EOS, UNK)}; train it with train_sentencepiece (or pad_id=0 "
                "bos_id=1 eos_id=2 unk_id=3)"
            )

    # -- the Vocab protocol ------------------------------------------------------------------
    def __len__(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` of many sentences in one call (SentencePiece encodes them in C++)."""
        return self._sp.encode(list(texts), out_type=int)

    def sample_batch(self, texts: Sequence[str], *, dropout: float, seed: int) -> list[list[int]]:
        """``encode_batch`` with BPE-dropout (Provilkov et al., 2020): while a word is merged, each
        merge is skipped with probability ``dropout``, so a word gets one of its many possible
        segmentations (the same pieces, more of them). For training only; translation uses the
        deterministic ``encode``. Meant for BPE models (``train_sentencepiece``'s default): for
        a unigram model SentencePiece reads ``dropout`` as its sampling's smoothing instead.

        Within one process the same ``(texts, dropout, seed)`` give the same ids (SentencePiece's
        generator is seeded with ``seed``, a process-wide setting, and encodes on one thread);
        another process draws differently (sentencepiece 0.2.3, measured), so a resumed run's
        pieces are not the first run's (its checkpoints keep the current epoch's, which a
        resume finishes on: ``training/feed.py``) and the Trainer refuses it with several
        processes.
        """
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if dropout == 0.0:
            return self.encode_batch(texts)
        spm.set_random_generator_seed(seed)
        return self._sp.encode(
            list(texts),
            out_type=int,
            enable_sampling=True,
            alpha=dropout,
            nbest_size=-1,
            num_threads=1,
        )

    def decode(self, ids: Sequence[int]) -> str:
        n = len(self)
        kept = []
        for i in ids:
            i = int(i)
            if i >= n or i < 0:
                raise ValueError(f"id {i} out of range for a vocabulary of {n}")
            if i >= _N_SPECIAL:
                kept.append(i)
        return self._sp.decode(kept)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "sentencepiece", "model": base64.b64encode(self._proto).decode("ascii")}

    # -- extras ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SentencePieceVocab:
        return cls(base64.b64decode(data["model"]), name="checkpoint vocabulary")

    @property
    def model_proto(self) -> bytes:
        """The serialized model (the bytes of a ``.model`` file)."""
        return self._proto

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of ``text`` (for inspection)."""
        return self._sp.encode(text, out_type=str)

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def save(self, path: str | Path) -> None:
        """Write the ``.model`` file (usable by any SentencePiece tool), atomically."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(self._proto)
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise UserError(f"{path}: cannot write ({e.strerror or e})") from None

    @classmethod
    def load(cls, path: str | Path) -> SentencePieceVocab:
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise UserError(f"{path}: no such file") from None
        except OSError as e:
            raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
        return cls(data, name=str(path))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SentencePieceVocab) and other._proto == self._proto

    def __hash__(self) -> int:
        return hash(self._proto)

    def __repr__(self) -> str:
        return f"SentencePieceVocab(size={len(self)})"


class _Sentences:
    """The sentence iterator handed to SentencePiece: skips empty lines, counts the others, and
    keeps an exception raised while reading (SentencePiece would turn it into a RuntimeError).
    A sentence over ``limit`` bytes, which SentencePiece would leave out in silence (its
    characters then unknown to the vocabulary), is given in pieces cut at spaces (pieces never
    cross a space: nothing is lost), a word over the limit at a character boundary."""

    def __init__(self, texts: Iterable[str], limit: int) -> None:
        self._it = iter(texts)
        self._limit = limit
        self._cut: list[str] = []  # the rest of a sentence given in pieces
        self.count = 0
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._cut:
            return self._cut.pop()
        try:
            while True:
                t = next(self._it).strip()
                if t:
                    self.count += 1
                    if len(t.encode()) > self._limit:
                        self._cut = _cut(t, self._limit)[::-1]
                        return self._cut.pop()
                    return t
        except StopIteration:
            raise
        except BaseException as e:
            self.error = e
            raise StopIteration from None


def _cut(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` UTF-8 bytes, cut at spaces where it can be."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for word in text.split():
        n = len(word.encode())
        while n > limit:  # a word longer than the limit: at a character boundary
            if current:
                pieces.append(" ".join(current))
                current, size = [], 0
            # a character over the limit alone (a 4-byte one under 4) goes whole: never none
            head = word.encode()[:limit].decode(errors="ignore") or word[0]
            pieces.append(head)
            word = word[len(head) :]
            n = len(word.encode())
        if not word:  # all of it given above
            continue
        if current and size + 1 + n > limit:
            pieces.append(" ".join(current))
            current, size = [], 0
        size += n + (1 if current else 0)
        current.append(word)
    if current:
        pieces.append(" ".join(current))
    return pieces


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    *,
    model_type: Literal["bpe", "unigram", "char", "word"] = "bpe",
    character_coverage: float = 1.0,
    normalization: str = "nmt_nfkc",
    hard_vocab_limit: bool = True,
    input_sentence_size: int = 0,
    max_sentence_length: int = 4192,
    seed: int = 1,
    threads: int = 1,
) -> SentencePieceVocab:
    """Train a SentencePiece vocabulary of ``vocab_size`` pieces (4 specials included) on
    sentences held in memory. For a shared source-target vocabulary pass both sides, e.g.
    ``itertools.chain(pair.source, pair.target)``. Empty sentences are ignored.

    ``input_sentence_size`` > 0 trains on a random sample of that many sentences (seeded by
    ``seed``); 0 uses them all. ``max_sentence_length`` is in bytes; longer sentences are given to
    SentencePiece in pieces cut at spaces (it would leave them out). ``threads`` > 1 is faster
    for ``unigram``.
    """
    if vocab_size <= _N_SPECIAL:
        raise UserError(
            f"vocab_size must be more than {_N_SPECIAL} (the special ids), got {vocab_size}"
        )
    sentences = _Sentences(texts, max_sentence_length)
    buf = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences,
            model_writer=buf,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            normalization_rule_name=normalization,
            hard_vocab_limit=hard_vocab_limit,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            max_sentence_length=max_sentence_length,
            num_threads=threads,
            pad_id=PAD,
            bos_id=BOS,
            eos_id=EOS,
            unk_id=UNK,
            pad_piece=SPECIALS[PAD],
            bos_piece=SPECIALS[BOS],
            eos_piece=SPECIALS[EOS],
            unk_piece=SPECIALS[UNK],
            minloglevel=2,
        )
    except RuntimeError as e:
        if sentences.error is not None:
            raise sentences.error from None
        msg = str(e)
        if sentences.count == 0:
            raise UserError(
                "cannot train a SentencePiece vocabulary: no non-empty sentences"
            ) from None
        m = re.search(r"size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
        if m:
            raise UserError(
                f"vocab_size {m.group(1)} is too large for this training text "
                f"({sentences.count} sentences): use at most {m.group(2)}, or more text"
            ) from None
        m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", msg)
        if m:
            raise UserError(
                f"vocab_size {m.group(1)} is too small for this text: it needs at least "
                f"{m.group(2)} (one piece per character plus the special pieces); use a larger "
                f"vocab_size or a smaller character_coverage (now {character_coverage})"
            ) from None
        raise UserError(f"SentencePiece training failed: {msg.split('] ')[-1]}") from None
    if sentences.error is not None:
        raise sentences.error
    return SentencePieceVocab(buf.getvalue())


def train_sentencepiece_files(
    paths: Sequence[str | Path], vocab_size: int, **options: Any
) -> SentencePieceVocab:
    """``train_sentencepiece`` on the lines of text files (plain or ``.gz``), e.g. the source
    and target training files for a shared vocabulary."""
    return train_sentencepiece(
        (line for p in paths for line in iter_lines(p)), vocab_size, **options
    )
