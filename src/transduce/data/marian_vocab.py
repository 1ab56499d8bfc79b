"""A vocabulary of pieces split by one SentencePiece model and joined back by another, with ids of
its own: the vocabulary of a Marian (OPUS-MT) model, ``source.spm`` and ``target.spm`` over one
joint ``vocab.json`` whose ids are not SentencePiece's (``transduce.export.huggingface``).

Ids follow every transduce vocabulary: PAD 0, BOS 1, EOS 2, UNK 3 (pieces ``<pad> <s> </s>
<unk>``), then the other pieces. ``encode`` splits text into pieces with the encoding model and
looks each up (a piece the list lacks is UNK), after a leading language token such as ``>>fra<<``
which is looked up whole (as ``MarianTokenizer`` does); ``decode`` drops the special ids, joins
the pieces with the decoding model and turns the remaining ``▁`` into spaces (as
``MarianTokenizer.convert_tokens_to_string``).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import sentencepiece as spm

from transduce.data.vocab import SPECIALS, UNK
from transduce.errors import UserError

__all__ = ["MarianVocab", "language_code"]

_N_SPECIAL = len(SPECIALS)


def sentencepiece_processor(proto: bytes, name: str) -> spm.SentencePieceProcessor:
    """The SentencePiece model serialized in ``proto``; a UserError naming it ``name``."""
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError, TypeError) as e:
        raise UserError(f"{name}: not a SentencePiece model ({e})") from None
    return sp


def language_code(text: str) -> tuple[str | None, str]:
    """'>>fra<< text' -> ('>>fra<<', ' text'); no code -> (None, text)."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return text[: end + 2], text[end + 2 :]
    return None, text


class MarianVocab:
    """``pieces`` by id (the specials first), text split by ``encoder_model`` and joined by
    ``decoder_model`` (serialized SentencePiece models; the same one for a one-sided vocabulary).
    """

    def __init__(self, pieces: Sequence[str], encoder_model: bytes, decoder_model: bytes) -> None:
        pieces = [str(p) for p in pieces]
        if tuple(pieces[:_N_SPECIAL]) != SPECIALS:
            raise UserError(f"a Marian vocabulary starts with {', '.join(SPECIALS)}")
        if len(set(pieces)) != len(pieces):
            raise UserError("a Marian vocabulary holds a piece twice")
        self.pieces = pieces
        self._index = {p: i for i, p in enumerate(pieces)}
        self.encoder_model, self.decoder_model = bytes(encoder_model), bytes(decoder_model)
        self._target: MarianVocab | None = None
        self._encoder = sentencepiece_processor(
            self.encoder_model, "the source SentencePiece model"
        )
        self._decoder = (
            self._encoder
            if self.decoder_model == self.encoder_model
            else sentencepiece_processor(self.decoder_model, "the target SentencePiece model")
        )

    def __len__(self) -> int:
        return len(self.pieces)

    def target_side(self) -> MarianVocab:
        """This vocabulary for target text (references, prefixes, what ``score`` reads): the same
        pieces, text split by the decoding model, as ``MarianTokenizer(text_target=...)``
        splits it with ``target.spm``; itself where one model serves both sides."""
        if self.decoder_model == self.encoder_model:
            return self
        if self._target is None:
            self._target = MarianVocab(self.pieces, self.decoder_model, self.decoder_model)
        return self._target

    def _ids(self, code: str | None, pieces: Sequence[str]) -> list[int]:
        get = self._index.get
        head = [] if code is None else [get(code, UNK)]
        return head + [get(p, UNK) for p in pieces]

    def encode(self, text: str) -> list[int]:
        code, rest = language_code(text)
        return self._ids(code, self._encoder.encode(rest, out_type=str))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` of each text, SentencePiece splitting them in one call."""
        split = [language_code(t) for t in texts]
        pieces = self._encoder.encode([rest for _, rest in split], out_type=str)
        return [self._ids(code, p) for (code, _), p in zip(split, pieces, strict=True)]

    def decode(self, ids: Sequence[int]) -> str:
        n = len(self.pieces)
        kept = []
        for i in ids:
            i = int(i)
            if not 0 <= i < n:
                raise ValueError(f"id {i} out of range for a vocabulary of {n}")
            if i >= _N_SPECIAL:
                kept.append(self.pieces[i])
        return self._decoder.decode_pieces(kept).replace("▁", " ").strip()

    def id_to_piece(self, i: int) -> str:
        return self.pieces[int(i)]

    def to_dict(self) -> dict[str, Any]:
        same = self.decoder_model == self.encoder_model
        return {
            "kind": "marian",
            "pieces": list(self.pieces),
            "encoder_model": base64.b64encode(self.encoder_model).decode("ascii"),
            # the encoder's when empty (one model for both sides)
            "decoder_model": "" if same else base64.b64encode(self.decoder_model).decode("ascii"),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MarianVocab:
        encoder = base64.b64decode(data["encoder_model"])
        decoder = base64.b64decode(data["decoder_model"]) if data["decoder_model"] else encoder
        return cls(list(data["pieces"]), encoder, decoder)
