"""Forced decoding (``inference.scoring``, ``Translator.score``): the log-probability of a given
output equals the step-by-step sum of the model's log-probabilities, and the beam's own scores
of its outputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from inference_testkit import (
    VOCAB,
    random_sources,
    save_toy_translation_model,
    tiny_model,
)

from transduce.architectures import build_model
from transduce.config import ModelConfig
from transduce.data.vocab import BOS, EOS, PAD
from transduce.inference import beam_search
from transduce.inference.engine import DecodingModel
from transduce.inference.scoring import score_targets, token_log_probs


def tiny_rnn(seed: int):
    torch.manual_seed(seed)
    cfg = ModelConfig(architecture="rnn", n_layers=1, d_model=16, dropout=0.0)
    return build_model(cfg, src_vocab_size=VOCAB).eval()


def stepwise(model, src_row: torch.Tensor, target: list[int]) -> list[float]:
    """The log-probability of each token of ``target`` and of EOS, one cached step at a time."""
    src1 = src_row[src_row != PAD][None]
    memory, valid = model.encode(src1)
    cache = model.new_cache()
    out, last = [], BOS
    with torch.no_grad():
        for tok in [*target, EOS]:
            logits = model.decode(torch.tensor([[last]]), memory, valid, cache)[0, -1]
            out.append(F.log_softmax(logits.float(), dim=-1)[tok].item())
            last = tok
    return out


MODELS = {
    "transformer": lambda: tiny_model(1),
    "engine": lambda: DecodingModel(tiny_model(1)),
    "rnn": lambda: tiny_rnn(2),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_forced_decoding_equals_the_step_by_step_sum(kind: str) -> None:
    model = MODELS[kind]()
    gen = torch.Generator().manual_seed(0)
    src = random_sources(gen, [5, 2, 7, 3])
    targets = [[4, 5, 4], [], [3, 3, 5, 4, 4, 5], [5]]
    got = token_log_probs(model, src, targets)
    for i, target in enumerate(targets):
        want = stepwise(model, src[i], target)
        assert got[i] == pytest.approx(want, abs=1e-5)
    scores = score_targets(model, src, targets, alpha=0.6)
    assert [s.tokens for s in scores] == [4, 1, 7, 2]
    for s, lps in zip(scores, got, strict=True):
        assert s.log_prob == pytest.approx(sum(lps))
        assert s.per_token == pytest.approx(sum(lps) / len(lps))
        assert s.normalized == pytest.approx(sum(lps) / ((5 + len(lps)) / 6) ** 0.6)


@pytest.mark.parametrize("kind", list(MODELS))
def test_scores_of_the_beams_outputs_are_the_beams_own(kind: str) -> None:
    model = MODELS[kind]()
    src = random_sources(torch.Generator().manual_seed(3), [4, 6])
    hyps = beam_search(model, src, beam=3, alpha=0.6, max_len_offset=3, nbest=3)
    for i, sentence in enumerate(hyps):
        scores = score_targets(
            model, src[i : i + 1].expand(len(sentence), -1), [h.tokens for h in sentence], alpha=0.6
        )
        for h, s in zip(sentence, scores, strict=True):
            assert s.log_prob == pytest.approx(h.log_prob, abs=1e-5)
            assert s.normalized == pytest.approx(h.score, abs=1e-5)


def test_translator_scores_in_input_order_whatever_the_batches(tmp_path) -> None:
    from transduce.inference.translator import Translator

    t = Translator.load(save_toy_translation_model(tmp_path / "m.pt", {"max_len_offset": 4}))
    sources = ["the dog runs", "a cat", "", "the big red ball in the park"]
    targets = ["a cat", "", "the dog", "small"]
    one_by_one = [t.score([s], [g])[0] for s, g in zip(sources, targets, strict=True)]
    for batch_tokens in (1, 4000):
        together = t.score(sources, targets, t.decode_config(batch_tokens=batch_tokens))
        assert [p.log_prob for p in together] == pytest.approx([p.log_prob for p in one_by_one])
    # the translation's own score (its tokens re-encoded from the text: equal for this vocab)
    (best,) = t.translate_nbest(["the dog runs"], 1, t.decode_config(alpha=1.0))[0]
    (pair,) = t.score(["the dog runs"], [best.text], t.decode_config(alpha=1.0))
    assert pair.log_prob == pytest.approx(best.log_prob, abs=1e-4)
    assert pair.normalized == pytest.approx(best.score, abs=1e-4)


def test_targets_and_prefixes_read_with_the_target_vocabulary(tmp_path) -> None:
    """shared_vocab: false: a target (scored) and a prefix (forced) are the target side's text,
    encoded with the target vocabulary, not the source one."""
    from inference_testkit import save_toy_pair_translator

    from transduce.inference.translator import Translator

    t = Translator.load(save_toy_pair_translator(tmp_path / "pair.pt", {"max_len_offset": 4}))
    target = t.vocab.target
    text = "der hund rennt"
    (pair,) = t.score(["the dog runs"], [text], t.decode_config(alpha=1.0))
    src = torch.tensor([t.vocab.source.encode("the dog runs") + [EOS]])
    (want,) = score_targets(t.model, src, [target.encode(text)], alpha=1.0)
    assert (pair.tokens, pair.log_prob) == (want.tokens, pytest.approx(want.log_prob, abs=1e-4))
    # a prefix is forced as the target side's pieces: the output starts with them
    (out,) = t.translate(["the dog runs"], t.decode_config(), prefixes=["der hund"])
    assert target.encode(out)[: len(target.encode("der hund"))] == target.encode("der hund")
