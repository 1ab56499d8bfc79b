import gzip
import itertools
import os
from pathlib import Path

import pytest

from transduce.checkpoint import vocab_from_dict
from transduce.data.subword import (
    SentencePieceVocab,
    train_sentencepiece,
    train_sentencepiece_files,
)
from transduce.data.vocab import BOS, EOS, PAD, UNK
from transduce.errors import UserError

EN = [
    "A man in an orange hat starring at something.",
    "A Boston Terrier is running on lush green grass in front of a white fence.",
    "A girl in karate uniform breaking a stick with a front kick.",
    "Five people wearing winter jackets and helmets stand in the snow, with snowmobiles in the background.",
    "People are fixing the roof of a house.",
    "A man in light colored clothing photographs a group of men wearing dark suits and hats standing around a woman dressed in a strapless gown.",
    "A group of people standing in front of an igloo.",
    "A boy in a red uniform is attempting to avoid getting out at home plate, while the catcher in the blue uniform is attempting to catch him.",
    "A guy works on a building.",
    "A man in a vest is sitting in a chair and holding magazines.",
]
DE = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
    "Ein Mädchen in einem Karateanzug bricht einen Stock mit einem Tritt.",
    "Fünf Leute in Winterjacken und mit Helmen stehen im Schnee mit Schneemobilen im Hintergrund.",
    "Leute Reparieren das Dach eines Hauses.",
    "Ein hell gekleideter Mann fotografiert eine Gruppe von Männern in dunklen Anzügen und mit Hüten, die um eine Frau in einem trägerlosen Kleid herum stehen.",
    "Eine Gruppe von Menschen steht vor einem Iglu.",
    "Ein Junge in einem roten Trikot versucht, die Home Base zu erreichen, während der Catcher im blauen Trikot versucht, ihn zu fangen.",
    "Ein Typ arbeitet an einem Gebäude.",
    "Ein Mann in einer Weste sitzt auf einem Stuhl und hält Magazine.",
]
TEXT = (EN + DE) * 3


@pytest.fixture(scope="module")
def vocab() -> SentencePieceVocab:
    return train_sentencepiece(TEXT, 300)


def test_special_ids(vocab):
    assert len(vocab) == 300
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert [vocab.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    ids = vocab.encode_batch(EN + DE)
    # encode adds no BOS/EOS and never produces pad
    assert all(i > UNK for seq in ids for i in seq)


def test_round_trip(vocab):
    for s in EN + DE + ["A dog in the snow.", "Zwei Männer, ein Hund."]:
        assert vocab.decode(vocab.encode(s)) == s


def test_decode_drops_special_ids(vocab):
    ids = vocab.encode("A man in a hat.")
    assert vocab.decode([BOS, *ids, EOS, PAD, PAD]) == "A man in a hat."
    assert vocab.decode([UNK, *ids]) == "A man in a hat."
    with pytest.raises(ValueError):
        vocab.decode([len(vocab)])


def test_unseen_character_is_unk(vocab):
    assert UNK in vocab.encode("A man in a 帽子.")


def test_encode_batch_equals_encode(vocab):
    assert vocab.encode_batch(EN) == [vocab.encode(s) for s in EN]


def test_bpe_merges_frequent_words(vocab):
    assert len(vocab.encode("A man in a")) < len("A man in a")


def test_bpe_dropout_same_seed_same_pieces_other_seed_others(vocab):
    a = vocab.sample_batch(EN + DE, dropout=0.3, seed=7)
    vocab.sample_batch(DE, dropout=0.3, seed=8)  # drawing in between changes nothing
    assert vocab.sample_batch(EN + DE, dropout=0.3, seed=7) == a
    assert vocab.sample_batch(EN + DE, dropout=0.3, seed=9) != a


def test_bpe_dropout_splits_more_and_keeps_the_text(vocab):
    plain = vocab.encode_batch(EN + DE)
    sampled = vocab.sample_batch(EN + DE, dropout=0.3, seed=1)
    assert sampled != plain
    assert [vocab.decode(ids) for ids in sampled] == EN + DE
    # skipping merges can only leave more pieces, never fewer
    assert all(len(s) >= len(p) for s, p in zip(sampled, plain, strict=True))
    assert sum(map(len, sampled)) > sum(map(len, plain))
    # a merge skipped with probability ~1 leaves (almost) single characters
    chars = vocab.sample_batch(["A man in a hat."], dropout=0.999, seed=1)[0]
    assert len(chars) >= len("Amaninahat.")


def test_bpe_dropout_zero_is_encode_and_range_checked(vocab):
    assert vocab.sample_batch(EN, dropout=0.0, seed=3) == vocab.encode_batch(EN)
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="dropout"):
            vocab.sample_batch(EN, dropout=bad, seed=3)


def test_deterministic():
    a = train_sentencepiece(TEXT, 200)
    b = train_sentencepiece(iter(TEXT), 200)
    assert a.model_proto == b.model_proto


def test_dict_round_trip(vocab):
    d = vocab.to_dict()
    assert d["kind"] == "sentencepiece" and isinstance(d["model"], str)
    again = vocab_from_dict(d)
    assert isinstance(again, SentencePieceVocab)
    assert again == vocab
    assert again.encode_batch(EN + DE) == vocab.encode_batch(EN + DE)


def test_save_load(vocab, tmp_path):
    path = tmp_path / "spm.model"
    vocab.save(path)
    loaded = SentencePieceVocab.load(path)
    assert loaded.encode_batch(DE) == vocab.encode_batch(DE)
    assert len(loaded) == len(vocab)


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        SentencePieceVocab.load(tmp_path / "missing.model")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(UserError, match="bad.model"):
        SentencePieceVocab.load(bad)


def test_foreign_special_ids_refused():
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT), model_writer=buf, vocab_size=100, minloglevel=2
    )  # sentencepiece defaults: unk 0, bos 1, eos 2, no pad
    with pytest.raises(UserError, match="special ids"):
        SentencePieceVocab(buf.getvalue())


def test_vocab_too_large_is_user_error():
    with pytest.raises(UserError, match=r"vocab_size 5000 is too large.*at most \d+"):
        train_sentencepiece(TEXT, 5000)


def test_vocab_too_small_is_user_error():
    with pytest.raises(UserError, match=r"vocab_size 20 is too small.*at least \d+"):
        train_sentencepiece(TEXT, 20)


def test_soft_limit():
    v = train_sentencepiece(TEXT, 5000, hard_vocab_limit=False)
    assert 4 < len(v) < 5000


def test_no_sentences():
    with pytest.raises(UserError, match="no non-empty sentences"):
        train_sentencepiece(["", "  "], 100)


def test_train_from_files(tmp_path, vocab):
    en = tmp_path / "x.en.gz"
    with gzip.open(en, "wt", encoding="utf-8") as f:
        f.write("\n".join(EN * 3) + "\n")
    de = tmp_path / "x.de"
    de.write_text("\n".join(DE * 3) + "\n", encoding="utf-8")
    from_files = train_sentencepiece_files([en, de], 300)
    from_memory = train_sentencepiece(itertools.chain(EN * 3, DE * 3), 300)
    assert from_files.model_proto == from_memory.model_proto


def test_train_from_files_read_error_propagates(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\n")
    with pytest.raises(UserError, match=r"bad\.txt: line 2"):
        train_sentencepiece_files([bad], 100)


def test_multi30k_shared_vocab():
    root = os.environ.get("TRANSDUCE_DATA")
    if not root:
        pytest.skip("TRANSDUCE_DATA is not set (folder holding multi30k/)")
    from transduce.data.parallel import read_parallel

    m = Path(root) / "multi30k"
    pt = read_parallel(m / "val.en.gz", m / "val.de.gz")
    v = train_sentencepiece(itertools.chain(pt.source, pt.target), 1000)
    assert len(v) == 1000
    ok = sum(v.decode(ids) == s for ids, s in zip(v.encode_batch(pt.target), pt.target))
    assert ok / len(pt) > 0.99


def test_a_sentence_over_the_length_limit_still_teaches_its_characters() -> None:
    # SentencePiece leaves a sentence of over max_sentence_length bytes out: a character seen
    # only there was <unk> though it was in the training text
    from transduce.data.subword import _cut
    from transduce.data.vocab import UNK

    plain = ["the cat sat on the mat"] * 50
    long = " ".join(["a dog ran far"] * 400 + ["Ω"])  # 5,600 bytes, Ω only here
    vocab = train_sentencepiece([*plain, long], 40, max_sentence_length=4192)
    assert UNK not in vocab.encode("Ω")
    for limit in (7, 10):
        text = "ab cd " * 10 + "x" * 25 + " éé " * 3
        pieces = _cut(text, limit)
        assert all(len(p.encode()) <= limit for p in pieces)
        assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    assert _cut("😀😀 a", 3) == ["😀", "😀", "a"]  # a character over the limit: whole, not a hang
