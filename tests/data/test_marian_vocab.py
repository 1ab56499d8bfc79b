"""MarianVocab (transduce.data.marian_vocab): pieces split by one SentencePiece model, joined by
another, ids of its own; stored in model files like the other vocabularies."""

from __future__ import annotations

import io
import json

import pytest
import sentencepiece as spm

from transduce.checkpoint import vocab_from_dict
from transduce.data.marian_vocab import MarianVocab
from transduce.data.vocab import EOS, SPECIALS, UNK
from transduce.errors import UserError

LINES = ["the cat sat on the mat", "a dog ran home", "the red ball"] * 30


def _model(lines: list[str]) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, vocab_size=20, minloglevel=2
    )
    return out.getvalue()


@pytest.fixture(scope="module")
def vocab() -> MarianVocab:
    source, target = _model(LINES), _model([s.upper() for s in LINES])
    pieces = [*SPECIALS, ">>fra<<"]
    for proto in (source, target):
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(3, sp.get_piece_size()):  # SentencePiece's specials are 0..2
            if sp.id_to_piece(i) not in pieces:
                pieces.append(sp.id_to_piece(i))
    return MarianVocab(pieces, source, target)


def test_encode_looks_pieces_up_and_decode_joins_them(vocab: MarianVocab) -> None:
    source = spm.SentencePieceProcessor(model_proto=vocab.encoder_model)
    target = spm.SentencePieceProcessor(model_proto=vocab.decoder_model)
    ids = vocab.encode("the cat")
    assert [vocab.id_to_piece(i) for i in ids] == source.encode("the cat", out_type=str)
    assert vocab.encode_batch(["the cat", "zzz"]) == [ids, vocab.encode("zzz")]
    assert UNK in vocab.encode("zzz")  # a piece the list lacks
    upper = [vocab.pieces.index(p) for p in target.encode("THE RED BALL", out_type=str)]
    assert vocab.decode([*upper, EOS, 0]) == "THE RED BALL"  # specials dropped
    assert vocab.encode(">>fra<< the")[0] == vocab.pieces.index(">>fra<<")


def test_stored_as_plain_data_and_back(vocab: MarianVocab) -> None:
    data = json.loads(json.dumps(vocab.to_dict()))  # JSON: safetensors metadata holds it too
    back = vocab_from_dict(data)
    assert isinstance(back, MarianVocab) and back.pieces == vocab.pieces
    assert back.encode("the red ball") == vocab.encode("the red ball")
    one = MarianVocab(vocab.pieces, vocab.encoder_model, vocab.encoder_model)
    assert one.to_dict()["decoder_model"] == ""  # one model stored once
    assert vocab_from_dict(one.to_dict()).decoder_model == vocab.encoder_model


def test_specials_first_and_pieces_once(vocab: MarianVocab) -> None:
    with pytest.raises(UserError, match="starts with"):
        MarianVocab(["</s>", *vocab.pieces[1:]], vocab.encoder_model, vocab.decoder_model)
    with pytest.raises(UserError, match="twice"):
        MarianVocab([*vocab.pieces, vocab.pieces[5]], vocab.encoder_model, vocab.decoder_model)
