import pytest
import torch
from inference_testkit import random_sources, tiny_model

from transduce.config import DecodeConfig
from transduce.inference import beam_search, generate, greedy_search


def test_beam_one_uses_greedy_with_beam_scores():
    model = tiny_model(0)
    src = random_sources(torch.Generator().manual_seed(0), [3, 1, 5, 2])
    cfg = DecodeConfig(beam=1, alpha=0.6, max_len_offset=3)
    out = generate(model, src, cfg)
    assert [hyps[0].tokens for hyps in out] == greedy_search(model, src, max_len_offset=3)
    reference = beam_search(model, src, beam=1, alpha=0.6, max_len_offset=3)
    for hyps, ref in zip(out, reference, strict=True):
        assert len(hyps) == 1
        assert hyps[0].tokens == ref[0].tokens
        assert hyps[0].score == pytest.approx(ref[0].score, abs=1e-5)
        assert hyps[0].log_prob == pytest.approx(ref[0].log_prob, abs=1e-5)
    with pytest.raises(ValueError, match="nbest"):
        generate(model, src, cfg, nbest=2)


def test_beam_and_decode_batches():
    model = tiny_model(1)
    src = random_sources(torch.Generator().manual_seed(1), [3, 1, 5, 2, 4])
    cfg = DecodeConfig(beam=3, alpha=0.6, max_len_offset=2, decode_batch=2)
    out = generate(model, src, cfg, nbest=2)
    reference = beam_search(model, src, beam=3, alpha=0.6, max_len_offset=2, nbest=2)
    assert len(out) == 5
    for hyps, ref in zip(out, reference, strict=True):
        assert [h.tokens for h in hyps] == [h.tokens for h in ref]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in ref], abs=1e-5)
