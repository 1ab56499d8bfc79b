"""Beam search on a scripted fake model: every hypothesis and score is worked out by hand.

Notation: A and B are the two symbols, a hypothesis ``[A]`` means the output A then EOS, and
lp(n) = ((5 + n) / 6) ** alpha with n counting EOS. The beam has W slots; a finished hypothesis
keeps its slot (see transduce.inference.beam).
"""

import math

import pytest
import torch
from inference_testkit import B_, A, ScriptedModel

from transduce.data.vocab import EOS, PAD
from transduce.inference import beam_search, greedy_search

B = B_


def src_for(*keys: int, length: int = 1) -> torch.Tensor:
    """One source sentence per key (the fake model reads the first token), ``length`` tokens."""
    return torch.tensor([[k] * length for k in keys])


def summary(hyps):
    return [(h.tokens, h.score, h.log_prob) for h in hyps]


def assert_hyps(hyps, expected):
    """expected: [(tokens, score, log_prob)] in order."""
    assert [h.tokens for h in hyps] == [e[0] for e in expected], summary(hyps)
    for h, (_, score, log_prob) in zip(hyps, expected, strict=True):
        assert h.score == pytest.approx(score, abs=1e-6)
        assert h.log_prob == pytest.approx(log_prob, abs=1e-6)


# [] (EOS at step 0) has p = 0.4; [A] has p = 0.6 * 0.6 = 0.36; [A, A] p = 0.24, never reached.
SHORT_OR_LONG = {4: {(): {EOS: 0.4, A: 0.6}, (A,): {EOS: 0.6, A: 0.4}, (A, A): {EOS: 1.0}}}


def test_alpha_zero_favours_the_short_hypothesis():
    # alpha 0: scores are log-probs: [] ln 0.4 = -0.91629 beats [A] ln 0.36 = -1.02165.
    out = beam_search(ScriptedModel(SHORT_OR_LONG), src_for(4), beam=2, alpha=0.0, nbest=2)
    assert_hyps(out[0], [([], math.log(0.4), math.log(0.4)), ([A], math.log(0.36), math.log(0.36))])


def test_large_alpha_favours_the_long_hypothesis():
    # alpha 1: [] -0.91629 / lp(1) = -0.91629; [A] -1.02165 / (7 / 6) = -0.87570, now the best.
    out = beam_search(ScriptedModel(SHORT_OR_LONG), src_for(4), beam=2, alpha=1.0, nbest=2)
    assert_hyps(
        out[0],
        [([A], math.log(0.36) / (7 / 6), math.log(0.36)), ([], math.log(0.4), math.log(0.4))],
    )
    assert out[0][0].score == pytest.approx(-0.8757011, abs=1e-6)


def test_nbest_sorted_by_normalised_score_not_log_prob():
    # W=3. Step 0: A .5 and B .3 live, [] (.2) finished. Step 1, 2 slots left; candidates
    # [A] .35, BB .18, [B] .12, AA .10, AB .05: [A] finishes, BB lives. Step 2: [B, B] (.18)
    # finishes, all 3 slots are finished. alpha 0.5: [A] ln .35 / sqrt(7/6) = -0.97195,
    # [B, B] ln .18 / sqrt(8/6) = -1.48506, [] ln .2 = -1.60944: [B, B] beats [] although its
    # probability is lower.
    script = {
        4: {
            (): {A: 0.5, B: 0.3, EOS: 0.2},
            (A,): {EOS: 0.7, A: 0.2, B: 0.1},
            (B,): {EOS: 0.4, B: 0.6},
        }
    }
    out = beam_search(ScriptedModel(script), src_for(4), beam=3, alpha=0.5, nbest=3)
    assert_hyps(
        out[0],
        [
            ([A], math.log(0.35) / math.sqrt(7 / 6), math.log(0.35)),
            ([B, B], math.log(0.18) / math.sqrt(8 / 6), math.log(0.18)),
            ([], math.log(0.2), math.log(0.2)),
        ],
    )
    assert [round(h.score, 5) for h in out[0]] == [-0.97195, -1.48506, -1.60944]
    top1 = beam_search(ScriptedModel(script), src_for(4), beam=3, alpha=0.5, nbest=1)
    assert summary(top1[0]) == summary(out[0][:1])


# Greedy takes A (.5) then A (.4) then EOS: [A, A], p = .2. The best is [B], p = .4 * .9 = .36.
GREEDY_TRAP = {
    4: {(): {A: 0.5, B: 0.4, EOS: 0.1}, (A,): {A: 0.4, B: 0.3, EOS: 0.3}, (B,): {EOS: 0.9, A: 0.1}}
}


def test_beam_finds_what_greedy_misses_and_stops_early():
    model = ScriptedModel(GREEDY_TRAP)
    out = beam_search(model, src_for(4), beam=2, alpha=0.0, max_len_offset=20)
    assert_hyps(out[0], [([B], math.log(0.36), math.log(0.36))])
    # After step 1, [B] (ln .36) is finished and the only live hypothesis, AA, has ln .2 already:
    # nothing can beat [B], so the search stops after 2 decoder calls instead of running to 21.
    assert len(model.rows_per_call) == 2


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_one_is_greedy(alpha):
    assert greedy_search(ScriptedModel(GREEDY_TRAP), src_for(4)) == [[A, A]]
    out = beam_search(ScriptedModel(GREEDY_TRAP), src_for(4), beam=1, alpha=alpha)
    assert_hyps(out[0], [([A, A], math.log(0.2) / (8 / 6) ** alpha, math.log(0.2))])


def test_eos_at_different_steps_and_finished_sentences_leave_the_batch():
    # Sentence 4 ends at step 0 ([] p .9; [A] could reach at most .1). Sentence 5: [] (.1)
    # finishes at step 0, A A lives on, [A, A] (.729) finishes at step 2 and fills the beam.
    script = {
        4: {(): {EOS: 0.9, A: 0.1}},
        5: {(): {A: 0.9, EOS: 0.1}, (A,): {A: 0.9, EOS: 0.1}, (A, A): {EOS: 0.9, A: 0.1}},
    }
    model = ScriptedModel(script)
    out = beam_search(model, src_for(4, 5), beam=2, alpha=0.0, nbest=1)
    assert_hyps(out[0], [([], math.log(0.9), math.log(0.9))])
    assert_hyps(out[1], [([A, A], math.log(0.729), math.log(0.729))])
    # Step 0 runs once per sentence (2 rows); then only sentence 5's 2 beams are decoded.
    assert model.rows_per_call == [2, 2, 2]
    # With nbest 2, sentence 4 needs a second finished hypothesis: [A] (p .1, the fake's
    # default EOS 1.0 after A) at step 1; then it leaves and sentence 5 goes on alone.
    model = ScriptedModel(script)
    out = beam_search(model, src_for(4, 5), beam=2, alpha=0.0, nbest=2)
    assert_hyps(out[0], [([], math.log(0.9), math.log(0.9)), ([A], math.log(0.1), math.log(0.1))])
    assert_hyps(
        out[1], [([A, A], math.log(0.729), math.log(0.729)), ([], math.log(0.1), math.log(0.1))]
    )
    assert model.rows_per_call == [2, 4, 2]
    assert model.cross_rows == 2  # "cross-attention keys" computed once per sentence
    assert greedy_search(ScriptedModel(script), src_for(4, 5)) == [[], [A, A]]


def test_cross_keys_once_per_sentence_with_wide_beam():
    script = {4: {(): {A: 0.6, EOS: 0.4}}, 5: {(): {B: 0.7, EOS: 0.3}}}
    model = ScriptedModel(script, default={A: 0.3, B: 0.2, EOS: 0.5})
    beam_search(model, src_for(4, 5, length=3), beam=4, alpha=0.6, max_len_offset=2, nbest=4)
    assert model.cross_rows == 2
    assert model.rows_per_call[0] == 2 and all(r in (4, 8) for r in model.rows_per_call[1:])


def test_bound_uses_the_longest_possible_length():
    # alpha 2, source of 1 token + offset 2: at most 3 tokens. Step 0: [] (p .5) finishes with
    # score ln .5 = -0.69315; A (ln .3 = -1.20397) lives. An upper bound with the live
    # hypothesis's next length, -1.20397 / lp(2) = -1.20397 / (7/6)**2 = -0.88455, would stop
    # here. But A can grow to [A, A, A] (p .3, |Y| = 4): -1.20397 / (9/6)**2 = -0.53510, the best.
    script = {
        4: {(): {EOS: 0.5, A: 0.3, B: 0.2}, (A,): {A: 1.0}, (A, A): {A: 1.0}, (A, A, A): {EOS: 1.0}}
    }
    out = beam_search(ScriptedModel(script), src_for(4), beam=2, alpha=2.0, max_len_offset=2)
    assert_hyps(out[0], [([A, A, A], math.log(0.3) / 2.25, math.log(0.3))])
    assert out[0][0].score == pytest.approx(-0.5350990, abs=1e-6)
    out = beam_search(
        ScriptedModel(script), src_for(4), beam=2, alpha=2.0, max_len_offset=2, nbest=2
    )
    assert_hyps(
        out[0],
        [([A, A, A], math.log(0.3) / 2.25, math.log(0.3)), ([], math.log(0.5), math.log(0.5))],
    )


def test_max_length_forces_eos_with_its_probability():
    # Every prefix: A .9, EOS .1. Source of 2 tokens + offset 3: at most 5 tokens; at step 5 EOS
    # is forced and scored with its probability .1. alpha 2: [A]*5 scores
    # (5 ln .9 + ln .1) / (11/6)**2 = -2.82939 / 3.36111 = -0.84180; [] scores ln .1 = -2.30259.
    model = ScriptedModel({4: lambda prefix: {A: 0.9, EOS: 0.1}})
    out = beam_search(model, src_for(4, length=2), beam=2, alpha=2.0, max_len_offset=3, nbest=2)
    lp5 = 5 * math.log(0.9) + math.log(0.1)
    assert_hyps(out[0], [([A] * 5, lp5 / (11 / 6) ** 2, lp5), ([], math.log(0.1), math.log(0.1))])
    assert out[0][0].score == pytest.approx(-0.8418013, abs=1e-6)
    assert len(model.rows_per_call) == 6  # steps 0..5
    # alpha 0: [] is best, but the search must still run to the cut-off (a live hypothesis has
    # a higher log-prob than ln .1 until step 5) and then stops.
    model = ScriptedModel({4: lambda prefix: {A: 0.9, EOS: 0.1}})
    out = beam_search(model, src_for(4, length=2), beam=2, alpha=0.0, max_len_offset=3, nbest=2)
    assert_hyps(out[0], [([], math.log(0.1), math.log(0.1)), ([A] * 5, lp5, lp5)])
    assert greedy_search(model, src_for(4, length=2), max_len_offset=3) == [[A] * 5]


def test_max_len_counts_non_pad_source_tokens():
    model = ScriptedModel({4: lambda p: {A: 0.9, EOS: 0.1}})
    src = torch.tensor([[4, 4, 4], [4, PAD, PAD]])
    out = beam_search(model, src, beam=2, alpha=10.0, max_len_offset=1, nbest=2)
    assert [h.tokens for h in out[0]] == [[A] * 4, []]
    assert [h.tokens for h in out[1]] == [[A] * 2, []]
    out = beam_search(model, src, beam=2, alpha=10.0, max_len=0)
    assert [[h.tokens for h in hyps] for hyps in out] == [[[]], [[]]]


def test_invalid_arguments():
    model = ScriptedModel(SHORT_OR_LONG)
    with pytest.raises(ValueError, match="nbest"):
        beam_search(model, src_for(4), beam=2, nbest=3)
    with pytest.raises(ValueError, match="beam"):
        beam_search(model, src_for(4), beam=0)
    model.training = True
    with pytest.raises(ValueError, match="eval"):
        beam_search(model, src_for(4), beam=2)
