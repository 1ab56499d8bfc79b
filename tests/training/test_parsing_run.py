"""The parsing run's pieces that need no training: word units and BPE-dropout on the source."""

from __future__ import annotations

from transduce.config import Config, ParsingTaskConfig, TrainConfig
from transduce.data.subword import train_sentencepiece
from transduce.data.vocab import EOS, SPECIALS, TokenVocab, VocabPair
from transduce.parsing.parser import word_units
from transduce.training.tasks.parsing import source_dropout_pairs

SENTENCES = [
    s.split()
    for s in (
        "Pierre Vinken , 61 years old , will join the board as a nonexecutive director Nov. 29 .",
        "Mr. Vinken is chairman of Elsevier N.V. , the Dutch publishing group .",
        "Rudolph Agnew , 55 years old and former chairman of Consolidated Gold Fields PLC , was "
        "named a nonexecutive director of this British industrial conglomerate .",
    )
] * 20


def _source():
    return train_sentencepiece(
        [" ".join(s) for s in SENTENCES], 120, seed=1, hard_vocab_limit=False
    )


def test_word_units_mark_word_starts_and_slots() -> None:
    source = _source()
    target = TokenVocab.learn(["(S (NP NNP NNP )NP (VP VBD )VP . )S"])
    starts, slots = word_units(VocabPair(source, target))
    assert starts[EOS] and not starts[SPECIALS.index("<pad>")]
    assert all(
        starts[i] == source.id_to_piece(i).startswith("▁")
        for i in range(len(SPECIALS), len(source))
    )
    assert {target.id_to_piece(i) for i in range(len(target)) if slots[i]} == {"NNP", "VBD", "."}


def test_bpe_dropout_draws_each_epoch_anew_and_keeps_the_words() -> None:
    source = _source()
    targets = [[7, 8]] * len(SENTENCES)
    cfg = Config(task=ParsingTaskConfig(bpe_dropout=0.3), train=TrainConfig(seed=3))
    pairs = source_dropout_pairs(cfg, source, SENTENCES, targets)
    assert pairs is not None
    first, again, second = pairs(0), pairs(0), pairs(1)
    assert first == again and first != second  # the same epoch draws the same pieces
    plain = [source.encode(" ".join(s)) for s in SENTENCES]
    assert sum(map(len, (s for s, _ in first))) > sum(map(len, plain))  # more, smaller pieces
    for (ids, tgt), words in zip(first, SENTENCES, strict=True):
        assert tgt == [7, 8]
        assert source.decode(ids) == " ".join(words)
        assert sum(source.id_to_piece(i).startswith("▁") for i in ids) == len(words)
    assert (
        source_dropout_pairs(Config(task=ParsingTaskConfig()), source, SENTENCES, targets) is None
    )
