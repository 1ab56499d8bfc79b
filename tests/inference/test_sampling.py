"""Sampling (``inference.sampling``) on a scripted fake model: the sampled tokens follow the
scripted probabilities (after temperature), top-k and top-p cut exactly, a seed reproduces."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from inference_testkit import B_, A, ScriptedModel

from transduce.data.vocab import EOS, UNK
from transduce.inference.sampling import sample, sampling_probs

B = B_
FIRST = {
    4: {
        (): {A: 0.5, B: 0.3, EOS: 0.15, UNK: 0.05},
        (A,): {EOS: 1.0},
        (B,): {EOS: 1.0},
        (UNK,): {EOS: 1.0},
    }
}
N = 4000


def first_tokens(seed: int, **settings) -> Counter:
    gen = torch.Generator().manual_seed(seed)
    (hyps,) = sample(
        ScriptedModel(FIRST), torch.tensor([[4]]), samples=N, generator=gen, **settings
    )
    assert len(hyps) == N
    return Counter(h.tokens[0] if h.tokens else EOS for h in hyps)


def chi_square(counts: Counter, probs: dict[int, float]) -> float:
    assert set(counts) <= {t for t, p in probs.items() if p > 0}, counts
    return sum((counts[t] - N * p) ** 2 / (N * p) for t, p in probs.items() if p > 0)


# chi-square with 3 degrees of freedom exceeds 16.27 with probability 0.001
CHI2_3DOF = 16.27


def test_sampled_frequencies_follow_the_model() -> None:
    counts = first_tokens(0)
    assert chi_square(counts, FIRST[4][()]) < CHI2_3DOF, counts
    # and a wrong distribution is told apart: the test can fail
    assert chi_square(counts, {A: 0.4, B: 0.4, EOS: 0.15, UNK: 0.05}) > 100


def test_temperature_flattens_or_sharpens() -> None:
    for t in (0.5, 2.0):
        weights = {tok: p ** (1 / t) for tok, p in FIRST[4][()].items()}
        total = sum(weights.values())
        counts = first_tokens(1, temperature=t)
        assert chi_square(counts, {k: w / total for k, w in weights.items()}) < CHI2_3DOF, (
            t,
            counts,
        )


def test_top_k_and_top_p_cut_exactly() -> None:
    lprobs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    got = sampling_probs(lprobs, temperature=1.0, top_k=2, top_p=1.0)
    assert got.tolist()[0] == pytest.approx([0.625, 0.375, 0.0, 0.0])
    # the smallest set of the best tokens whose probability reaches top_p
    got = sampling_probs(lprobs, temperature=1.0, top_k=0, top_p=0.79)  # .5 + .3
    assert got.tolist()[0] == pytest.approx([0.625, 0.375, 0.0, 0.0])
    got = sampling_probs(lprobs, temperature=1.0, top_k=0, top_p=0.81)  # .5 + .3 + .15
    assert got.tolist()[0] == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    got = sampling_probs(lprobs, temperature=1.0, top_k=3, top_p=0.49)  # the best alone
    assert got.tolist()[0] == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert set(first_tokens(2, top_k=2)) == {A, B}
    counts = first_tokens(3, top_p=0.8)
    assert chi_square(counts, {A: 0.625, B: 0.375}) < CHI2_3DOF, counts
    assert set(first_tokens(4, top_k=1)) == {A}  # top-k 1 is greedy


@pytest.mark.parametrize("vocab", [6, 40, 100, 1000])
def test_ties_at_the_cut_are_broken_by_index(vocab: int) -> None:
    # torch.topk returns any of the tied entries (which ones changed with the row's length)
    x = torch.zeros(2, vocab)
    x[:, :2] = float("-inf")
    x[1, 5] = 1.0  # one above the tie: two places left for it
    kept = sampling_probs(x, temperature=1.0, top_k=3, top_p=1.0) > 0
    assert kept[0].nonzero().flatten().tolist() == [2, 3, 4]
    assert kept[1].nonzero().flatten().tolist() == [2, 3, 5]
    # the nucleus: of equal probabilities the lower index is kept first
    flat = torch.zeros(1, vocab).log_softmax(1)
    kept = sampling_probs(flat, temperature=1.0, top_k=0, top_p=2.5 / vocab) > 0
    assert kept[0].nonzero().flatten().tolist() == [0, 1, 2]


def test_a_seed_reproduces_and_log_probs_are_the_models() -> None:
    script = {4: lambda prefix: {A: 0.6, B: 0.3, EOS: 0.1}, 5: lambda prefix: {B: 0.5, EOS: 0.5}}
    src = torch.tensor([[4, 4], [5, 5]])

    def run(seed: int, **settings):
        gen = torch.Generator().manual_seed(seed)
        return sample(
            ScriptedModel(script),
            src,
            samples=5,
            generator=gen,
            alpha=0.6,
            max_len_offset=3,
            **settings,
        )

    first, again, other = run(7), run(7), run(8)
    assert [[h.tokens for h in s] for s in first] == [[h.tokens for h in s] for s in again]
    assert [[h.tokens for h in s] for s in first] != [[h.tokens for h in s] for s in other]
    probs = {4: {A: 0.6, B: 0.3, EOS: 0.1}, 5: {B: 0.5, EOS: 0.5}}
    for key, hyps in zip((4, 5), run(9, temperature=3.0), strict=True):
        assert len(hyps) == 5
        for h in hyps:
            assert len(h.tokens) <= 5  # 2 source tokens + 3
            # EOS counted with its probability, also where the limit forced it
            want = sum(math.log(probs[key][t]) for t in h.tokens) + math.log(probs[key][EOS])
            assert h.log_prob == pytest.approx(want, abs=1e-5)  # the model's, not tempered
            assert h.score == pytest.approx(want / ((6 + len(h.tokens)) / 6) ** 0.6, abs=1e-5)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_an_ended_sample_waits_for_the_others_and_a_forced_eos_is_drawn() -> None:
    # EOS has no probability at all: every sample runs to the length limit, where it is forced
    model = ScriptedModel({4: lambda prefix: {A: 1.0}})
    (hyps,) = sample(model, torch.tensor([[4]]), samples=3, max_len_offset=2)
    assert [h.tokens for h in hyps] == [[A] * 3] * 3
    assert all(h.log_prob == float("-inf") for h in hyps)


@pytest.mark.parametrize(
    "key,value",
    [("temperature", 0.0), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5), ("sampling_seed", -1)],
)
def test_sampling_settings_are_checked_naming_the_key(key: str, value: float) -> None:
    from transduce.config import DecodeConfig
    from transduce.errors import UserError

    with pytest.raises(UserError, match=key) as e:
        DecodeConfig(**{key: value})
    assert "\n" not in str(e.value)
    assert DecodeConfig().sampling is False  # off by default: the searches as before


def test_generate_samples_with_a_decode_config() -> None:
    from transduce.config import DecodeConfig
    from transduce.inference.search import generate

    cfg = DecodeConfig(sampling=True, sampling_seed=5, top_k=2, decode_batch=1)
    src = torch.tensor([[4], [4]])
    first = generate(ScriptedModel(FIRST), src, cfg, nbest=30)
    assert [len(h) for h in first] == [30, 30]
    assert {h.tokens[0] for hyps in first for h in hyps} == {A, B}  # top-k 2
    again = generate(ScriptedModel(FIRST), src, cfg, nbest=30)
    assert [[h.tokens for h in s] for s in first] == [[h.tokens for h in s] for s in again]


@pytest.mark.parametrize("kind", ["engine", "rnn"])
def test_real_models_sample_and_the_log_probs_are_their_scores(kind: str) -> None:
    from inference_testkit import VOCAB, no_pad, random_sources, tiny_model

    from transduce.architectures import build_model
    from transduce.config import ModelConfig
    from transduce.inference.engine import DecodingModel
    from transduce.inference.scoring import score_targets

    if kind == "engine":
        model = DecodingModel(tiny_model(3))
    else:
        torch.manual_seed(3)
        cfg = ModelConfig(architecture="rnn", n_layers=1, d_model=16, dropout=0.0)
        model = build_model(cfg, src_vocab_size=VOCAB).eval()
    src = random_sources(torch.Generator().manual_seed(4), [3, 5])
    gen = torch.Generator().manual_seed(0)
    out = sample(model, src, samples=4, temperature=1.5, generator=gen, max_len_offset=3)
    for i, hyps in enumerate(out):
        assert len(hyps) == 4
        scores = score_targets(model, no_pad(src[i]).expand(4, -1), [h.tokens for h in hyps], 0.6)
        assert [s.log_prob for s in scores] == pytest.approx([h.log_prob for h in hyps], abs=1e-5)


def test_a_temperature_near_zero_is_refused_naming_the_key() -> None:
    # 1e-300 overflows the division of the log-probabilities (inf, then NaN samples)
    from transduce.config import DecodeConfig
    from transduce.errors import UserError

    for t in (1e-300, 0.0, 1e3):
        with pytest.raises(UserError, match="temperature"):
            DecodeConfig(sampling=True, temperature=t)
    assert DecodeConfig(sampling=True, temperature=0.01).temperature == 0.01


def test_a_top_p_below_float32s_least_keeps_the_best_token() -> None:
    # 5e-324 is 0 in float32: "the tokens before it hold at least top_p" held for every token
    lprobs = torch.tensor([[0.5, 0.3, 0.2]]).log()
    got = sampling_probs(lprobs, temperature=1.0, top_k=0, top_p=5e-324)
    assert got.tolist() == [[1.0, 0.0, 0.0]]
