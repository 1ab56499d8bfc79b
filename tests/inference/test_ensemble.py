"""Ensembles (``inference.ensemble``): the mean of the members' probabilities per step, for
every search; a Transformer and a recurrent model together."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from inference_testkit import B_, VOCAB, A, ScriptedModel, random_sources, tiny_model

from transduce.architectures import build_model
from transduce.config import ModelConfig
from transduce.data.vocab import EOS, UNK
from transduce.inference import beam_search, greedy_search, length_penalty
from transduce.inference.engine import DecodingModel
from transduce.inference.ensemble import Ensemble
from transduce.inference.scoring import score_targets

B = B_
# Model 1 prefers A then EOS, model 2 B then EOS; the mixture's first step: A .45, B .45, EOS .1
ONE = {4: {(): {A: 0.8, B: 0.1, EOS: 0.1}, (A,): {EOS: 0.9, A: 0.1}, (B,): {EOS: 0.2, B: 0.8}}}
TWO = {4: {(): {A: 0.1, B: 0.8, EOS: 0.1}, (A,): {EOS: 0.5, A: 0.5}, (B,): {EOS: 0.7, B: 0.3}}}


def mixture(prefix: tuple[int, ...]) -> dict[int, float]:
    """The hand-computed mean of the two scripts after ``prefix`` (their default: EOS 1)."""
    one, two = (s[4].get(prefix, {EOS: 1.0}) for s in (ONE, TWO))
    return {t: (one.get(t, 0.0) + two.get(t, 0.0)) / 2 for t in set(one) | set(two)}


def ensemble() -> Ensemble:
    return Ensemble([ScriptedModel(ONE), ScriptedModel(TWO)])


def test_step_distribution_is_the_mean_of_the_members() -> None:
    model = ensemble()
    memory, valid = model.encode(torch.tensor([[4, 4]]))
    cache = model.new_cache()
    out = model.decode(torch.tensor([[1]]), memory, valid, cache)[0, -1].exp()
    assert out[A].item() == pytest.approx(0.45) and out[B].item() == pytest.approx(0.45)
    assert out[EOS].item() == pytest.approx(0.1) and out.sum().item() == pytest.approx(1.0)
    cache.reorder(torch.tensor([0, 0]))
    out = model.decode(torch.tensor([[A], [B]]), memory, valid, cache)[:, -1].exp()
    assert out[0, EOS].item() == pytest.approx(0.7) and out[0, A].item() == pytest.approx(0.3)
    assert out[1, EOS].item() == pytest.approx(0.45) and out[1, B].item() == pytest.approx(0.55)


def test_searches_over_the_mixture() -> None:
    # Greedy takes A (.45, tied with B: the lower index) then EOS (.7). The beam of 3: step 0
    # finishes [] (.1), keeps A and B; step 1 (2 slots): [A] .45 * .7 = .315 finishes and B B
    # (.45 * .55) lives, beating [B] .45 * .45 and A A .45 * .3; step 2: [B, B] .2475 (both
    # members end after B B). Neither member alone ranks these so: model 1 gives [B, B] .064.
    assert greedy_search(ensemble(), torch.tensor([[4]])) == [[A]]
    (hyps,) = beam_search(ensemble(), torch.tensor([[4]]), beam=3, alpha=0.0, nbest=3)
    assert [h.tokens for h in hyps] == [[A], [B, B], []]
    assert [h.log_prob for h in hyps] == pytest.approx(
        [math.log(0.315), math.log(0.2475), math.log(0.1)]
    )


def test_beam_over_the_ensemble_is_brute_force_on_a_tiny_case() -> None:
    """Every output of up to 3 tokens over the mixture's hand-computed probabilities, ranked."""

    def prob(y: tuple[int, ...]) -> float:
        p = 1.0
        for t in range(len(y)):
            p *= mixture(y[:t]).get(y[t], 0.0)
        return p * mixture(y).get(EOS, 0.0)

    for alpha in (0.0, 1.0):
        outputs = [y for n in range(4) for y in itertools.product((A, B), repeat=n)]
        scored = [
            (math.log(prob(y)) / length_penalty(len(y) + 1, alpha), list(y))
            for y in outputs
            if prob(y) > 0
        ]
        best = max(scored)
        (hyps,) = beam_search(
            ensemble(), torch.tensor([[4]]), beam=4, alpha=alpha, max_len_offset=2
        )
        assert hyps[0].tokens == best[1] and hyps[0].score == pytest.approx(best[0], abs=1e-6)


def test_a_transformer_and_a_recurrent_model_together() -> None:
    torch.manual_seed(5)
    rnn = build_model(
        ModelConfig(architecture="rnn", n_layers=1, d_model=16, dropout=0.0), src_vocab_size=VOCAB
    ).eval()
    transformer = DecodingModel(tiny_model(2))
    model = Ensemble([transformer, rnn])
    src = random_sources(torch.Generator().manual_seed(1), [4, 2, 5])
    targets = [[A, B], [], [UNK, A, A]]
    got = score_targets(model, src, targets, alpha=0.6)
    # the ensemble's log-probability of each token is log of the mean of the members'
    from inference_testkit import no_pad

    from transduce.inference.scoring import token_log_probs

    for i, y in enumerate(targets):
        one, two = (token_log_probs(m, no_pad(src[i]), [y])[0] for m in (transformer, rnn))
        want = sum(math.log((math.exp(a) + math.exp(b)) / 2) for a, b in zip(one, two, strict=True))
        assert got[i].log_prob == pytest.approx(want, abs=1e-5)
    hyps = beam_search(model, src, beam=2, alpha=0.6, max_len_offset=2, nbest=2)
    for i, sentence in enumerate(hyps):
        for h in sentence:
            (s,) = score_targets(model, no_pad(src[i]), [h.tokens], alpha=0.6)
            assert s.log_prob == pytest.approx(h.log_prob, abs=1e-5)
    assert len(greedy_search(model, src, max_len_offset=2)) == 3
