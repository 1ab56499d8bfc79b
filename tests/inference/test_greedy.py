"""Greedy search on tiny real models against a cache-free reference, and on scripted tables."""

import pytest
import torch
from inference_testkit import (
    B_,
    A,
    ScriptedModel,
    naive_greedy,
    random_sources,
    tiny_model,
)

from transduce.data.vocab import EOS, PAD
from transduce.inference import greedy_search


def test_matches_full_forward_reference():
    offset, kinds = 3, set()
    # Models whose greedy outputs end at different steps within a batch: empty, early, cut off.
    for seed in (3, 9, 38, 39):
        model = tiny_model(seed)
        src = random_sources(torch.Generator().manual_seed(seed), [3, 1, 5, 2, 4, 6])
        limits = ((src != PAD).sum(1) + offset).tolist()
        out = greedy_search(model, src, max_len_offset=offset)
        assert out == [naive_greedy(model, row, n) for row, n in zip(src, limits, strict=True)]
        for y, n in zip(out, limits, strict=True):
            kinds.add("empty" if not y else "cut" if len(y) == n else "early")
    assert kinds == {"empty", "early", "cut"}


@pytest.mark.parametrize("seed", [3, 4])
def test_batched_equals_one_at_a_time(seed):
    model = tiny_model(seed)
    src = random_sources(torch.Generator().manual_seed(seed), [2, 6, 1, 4, 3, 5])
    batched = greedy_search(model, src, max_len_offset=4)
    single = [greedy_search(model, row[row != PAD][None], max_len_offset=4)[0] for row in src]
    assert batched == single


@pytest.mark.parametrize("offset", [0, 1, 2])
def test_never_longer_than_source_plus_offset(offset):
    hit = 0
    for seed in range(3):
        model = tiny_model(seed)
        src = random_sources(torch.Generator().manual_seed(10 + seed), [1, 2, 3, 4, 5, 6])
        lengths = (src != PAD).sum(1).tolist()
        for y, n in zip(greedy_search(model, src, max_len_offset=offset), lengths, strict=True):
            assert len(y) <= n + offset
            assert EOS not in y and PAD not in y
            hit += len(y) == n + offset
    assert hit > 0  # the cut-off was exercised


def test_fixed_max_len():
    model = ScriptedModel({4: lambda prefix: {A: 0.9, EOS: 0.1}, 5: {(): {EOS: 0.8, B_: 0.2}}})
    src = torch.tensor([[4, 4, 4, 4], [5, 5, PAD, PAD]])
    assert greedy_search(model, src, max_len=2) == [[A, A], []]
    assert greedy_search(model, src, max_len_offset=1) == [[A] * 5, []]
    assert greedy_search(model, src, max_len=0) == [[], []]


def test_finished_rows_leave_the_batch():
    script = {4: {(): {EOS: 0.6, A: 0.4}}, 5: {(): {A: 0.6, EOS: 0.4}, (A,): {B_: 0.7, EOS: 0.3}}}
    model = ScriptedModel(script)
    assert greedy_search(model, torch.tensor([[4], [5]])) == [[], [A, B_]]
    assert model.rows_per_call == [2, 1, 1]
    assert model.cross_rows == 2


def test_refuses_training_mode():
    model = tiny_model(0).train()
    with pytest.raises(ValueError, match="eval"):
        greedy_search(model, torch.tensor([[4, 5]]))
