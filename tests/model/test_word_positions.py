"""Positions counted in words (``position_unit: word``, beyond the paper): the pure functions on
hand cases, and a model that counts them decodes step by step, reordered and from a snapshot as
it decodes in one pass."""

from __future__ import annotations

import pytest
import torch
from model_testkit import decode_reordered, tiny_batch, tiny_model

from transduce.config import Config, ModelConfig, ParsingTaskConfig, from_dict
from transduce.errors import UserError
from transduce.inference.engine import DecodingModel
from transduce.model.positions import slot_positions, word_positions


def test_word_positions_by_hand() -> None:
    # "▁The ▁cat s ▁sat ." + EOS: starts at the words and at EOS
    starts = torch.tensor(
        [[True, True, False, True, False, True], [False, True, True, False, False, False]]
    )
    assert word_positions(starts).tolist() == [[0, 1, 1, 2, 2, 3], [0, 0, 1, 1, 1, 1]]


def test_slot_positions_by_hand() -> None:
    # inputs BOS (S (NP DT NN )NP (VP VBD: the next slot after each input holds this word
    slots = torch.tensor([[False, False, False, True, True, False, False, True]])
    assert slot_positions(slots).tolist() == [[0, 0, 0, 1, 2, 2, 2, 3]]
    assert slot_positions(slots[:, 3:], torch.tensor([0])).tolist() == [[1, 2, 2, 2, 3]]
    assert slot_positions(slots[:, 5:], torch.tensor([2])).tolist() == [[2, 2, 3]]


def test_the_query_for_a_slot_has_its_word_s_position() -> None:
    """Where the next output is a word slot, the input's position is the index of that word."""
    g = torch.Generator().manual_seed(0)
    outputs = torch.rand(4, 30, generator=g) < 0.4  # (N, T) which outputs are slots
    inputs = torch.cat([torch.zeros(4, 1, dtype=torch.bool), outputs[:, :-1]], 1)  # BOS first
    positions = slot_positions(inputs)
    for row in range(4):
        words = outputs[row].nonzero().squeeze(1).tolist()  # the output index of word k
        assert [positions[row, t].item() for t in words] == list(range(len(words)))


def test_cached_and_snapshot_steps_equal_one_pass() -> None:
    model = tiny_model(position_unit="word", tgt_vocab=11)
    src, tgt = tiny_batch()
    with torch.no_grad():
        full = model(src, tgt)
        for decoder in (model, DecodingModel(model)):
            memory, valid = decoder.encode(src)
            cache = decoder.new_cache()
            steps = [decoder.decode(tgt[:, t : t + 1], memory, valid, cache) for t in range(5)]
            torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
            assert cache.slots.tolist() == (tgt % 3 == 1).sum(1).tolist()


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_reordered_cache_keeps_each_row_s_word_count(snapshot: bool) -> None:
    model = tiny_model(position_unit="word", tgt_vocab=11)
    src, tgt = tiny_batch(seed=3)
    index = torch.tensor([2, 0, 0, 1])  # permute and duplicate rows, as beam search does
    decoder = DecodingModel(model) if snapshot else model
    rest, _ = decode_reordered(decoder, src, tgt, index)
    with torch.no_grad():
        expected = model(src[index], tgt[index])[:, 2:]
    torch.testing.assert_close(rest, expected, atol=1e-5, rtol=1e-5)


def test_positions_follow_the_words_not_the_tokens() -> None:
    """Splitting a word into more pieces leaves the other words' encodings where they were."""
    model = tiny_model(position_unit="word")
    one = torch.tensor([[3, 5, 7, 2]])  # three one-piece words (odd ids start words), EOS
    split = torch.tensor([[3, 4, 5, 7, 2]])  # the first word in two pieces
    with torch.no_grad():
        a, b = model.encoder.inputs(one), model.encoder.inputs(split)
    torch.testing.assert_close(a[:, 1:], b[:, 2:])


def test_set_word_units_checks_the_model_and_shapes() -> None:
    with pytest.raises(ValueError, match="position_unit: word"):
        tiny_model().set_word_units(
            torch.ones(13, dtype=torch.bool), torch.ones(13, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="shapes"):
        tiny_model(position_unit="word").set_word_units(
            torch.ones(12, dtype=torch.bool), torch.ones(13, dtype=torch.bool)
        )


def test_word_positions_need_a_parsing_task() -> None:
    with pytest.raises(UserError, match="task.name: parsing"):
        Config(model=ModelConfig(position_unit="word"))
    Config(model=ModelConfig(position_unit="word"), task=ParsingTaskConfig())


def test_a_stored_config_with_word_positions_loads_whatever_its_section_order() -> None:
    """Checkpoints store the model section before the task: the cross-section check sees both."""
    stored = {"model": {"position_unit": "word"}, "task": {"name": "parsing"}}
    assert from_dict(stored, stored=True).model.position_unit == "word"
