"""Prefix-constrained decoding (``inference.prefix``): outputs start with their prefix, the
rest is searched, and the scores are those of the whole output."""

from __future__ import annotations

import math

import pytest
import torch
from inference_testkit import B_, A, ScriptedModel, no_pad, random_sources, tiny_model

from transduce.data.vocab import EOS
from transduce.inference import beam_search, greedy_search
from transduce.inference.engine import DecodingModel
from transduce.inference.prefix import PrefixConstrained
from transduce.inference.sampling import sample
from transduce.inference.scoring import score_targets

B = B_
# Greedy takes A then EOS: [A] (.6 * .9). Forced to start with B: B .3, then B .7, then EOS .8.
SCRIPT = {
    4: {
        (): {A: 0.6, B: 0.3, EOS: 0.1},
        (A,): {EOS: 0.9, A: 0.1},
        (B,): {B: 0.7, EOS: 0.3},
        (B, B): {EOS: 0.8, A: 0.2},
    }
}


def test_the_prefix_is_forced_with_the_models_probability() -> None:
    src = torch.tensor([[4, 4]])
    assert greedy_search(ScriptedModel(SCRIPT), src) == [[A]]
    assert greedy_search(PrefixConstrained(ScriptedModel(SCRIPT), [[B]]), src) == [[B, B]]
    (hyps,) = beam_search(
        PrefixConstrained(ScriptedModel(SCRIPT), [[B]]), src, beam=2, alpha=0.0, nbest=2
    )
    assert [h.tokens for h in hyps] == [[B, B], [B]]
    # the prefix's probability counts: .3 * .7 * .8 and .3 * .3
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(0.168), math.log(0.09)])
    # the whole prefix given: only EOS is left to choose
    assert greedy_search(PrefixConstrained(ScriptedModel(SCRIPT), [[B, B, A]]), src) == [[B, B, A]]
    gen = torch.Generator().manual_seed(0)
    (samples,) = sample(
        PrefixConstrained(ScriptedModel(SCRIPT), [[B]]), src, samples=20, generator=gen
    )
    assert all(h.tokens[:1] == [B] for h in samples)


@pytest.mark.parametrize("engine", [False, True])
def test_the_greedy_outputs_own_start_gives_the_greedy_output(engine: bool) -> None:
    model = tiny_model(4)
    model = DecodingModel(model) if engine else model
    src = random_sources(torch.Generator().manual_seed(2), [5, 3, 6, 2])
    free = greedy_search(model, src, max_len_offset=4)
    for k in range(max(len(y) for y in free) + 1):
        prefixes = [y[:k] for y in free]
        assert greedy_search(PrefixConstrained(model, prefixes), src, max_len_offset=4) == free


def test_beam_with_prefixes_of_different_lengths_in_one_batch() -> None:
    model = DecodingModel(tiny_model(6))
    src = random_sources(torch.Generator().manual_seed(7), [4, 6, 3])
    prefixes = [[B, B, A], [], [A]]
    together = beam_search(
        PrefixConstrained(model, prefixes), src, beam=3, alpha=0.6, max_len_offset=3, nbest=2
    )
    for i, hyps in enumerate(together):
        alone = beam_search(
            PrefixConstrained(model, [prefixes[i]]),
            no_pad(src[i]),
            beam=3,
            alpha=0.6,
            max_len_offset=3,
            nbest=2,
        )[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        for h in hyps:
            assert h.tokens[: len(prefixes[i])] == prefixes[i]
            (s,) = score_targets(model, no_pad(src[i]), [h.tokens], alpha=0.6)
            assert s.log_prob == pytest.approx(h.log_prob, abs=1e-5)
            assert s.normalized == pytest.approx(h.score, abs=1e-5)
    with pytest.raises(ValueError, match="prefixes"):
        greedy_search(PrefixConstrained(model, [[A]]), src)
