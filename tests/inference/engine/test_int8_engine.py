"""DecodingModel with int8 projections: every projection quantised, the rest as in float32, and
its outputs close to the float32 engine's for every model variant (the agreement of a trained
model's translations is tested in tests/inference/test_int8_translation.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_testkit import tiny_batch, tiny_model

from transduce.inference import beam_search, greedy_search
from transduce.inference.engine import DecodingModel
from transduce.kernels.projection import Int8Projection

VARIANTS = [
    {},
    {"norm": "pre"},
    {"positional": "learned"},
    {"tie_embeddings": False, "output_bias": True},
    {"activation": "gelu", "d_v": 4},
]


def _steps(model, src, tgt) -> torch.Tensor:
    """Logits (B, T, V) of ``tgt`` decoded one position at a time against ``src``'s memory."""
    with torch.no_grad():
        memory, valid = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, valid, cache) for t in range(tgt.size(1))]
    return torch.cat(steps, dim=1)


def test_every_projection_is_int8() -> None:
    fast = DecodingModel(tiny_model(), int8=True)
    assert fast.int8 and fast.layout.int8
    layers = (*fast.encoder_layers, *fast.layers)
    projections = [fast.generator] + [
        getattr(w, f.name)
        for w in layers
        for f in dataclasses.fields(w)
        if f.name
        in ("qkv", "self_out", "ffn_in", "ffn_out", "cross_query", "cross_kv", "cross_out")
    ]
    assert len(projections) == 1 + 4 * len(fast.encoder_layers) + 7 * len(fast.layers)
    assert all(isinstance(p, Int8Projection) for p in projections)
    assert not isinstance(DecodingModel(tiny_model()).generator, Int8Projection)


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(kw) or "base")
def test_int8_steps_are_close_to_float32(kw: dict) -> None:
    model = tiny_model(**kw)
    src, tgt = tiny_batch()
    ref = _steps(DecodingModel(model), src, tgt)
    int8 = _steps(DecodingModel(model, int8=True), src, tgt)
    error = (int8 - ref).abs().max() / ref.abs().max()
    # 8-bit weights and activations through a few layers: about a percent of the logits' range
    assert 0 < error < 0.05, error


def test_one_sentence_is_the_same_alone_and_in_a_batch() -> None:
    """No float32 fold for one sentence: its int8 steps are its steps in a batch (each row's
    activations quantised on their own), and close to float32."""
    model = tiny_model()
    src, tgt = tiny_batch()
    int8 = DecodingModel(model, int8=True)
    assert all(layer.fold is None for layer in int8.layers)
    alone = _steps(int8, src[:1], tgt[:1])
    torch.testing.assert_close(alone, _steps(int8, src, tgt)[:1], atol=1e-5, rtol=1e-5)
    ref = _steps(DecodingModel(model), src[:1], tgt[:1])
    error = (alone - ref).abs().max() / ref.abs().max()
    assert 0 < error < 0.05, error
    with pytest.raises(ValueError, match="alone would be translated otherwise"):
        DecodingModel(model, int8=True, fold_one_sentence=True)


def test_several_positions_run_the_int8_steps() -> None:
    # scoring decodes a whole target at once: with int8 through the same int8 steps, so that
    # a score is the int8 model's (not the float model's)
    model = tiny_model()
    fast = DecodingModel(model, int8=True)
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = fast.encode(src)
        whole = fast.decode(tgt, memory, valid)
        float_model = model.decode(tgt, memory, valid)
    torch.testing.assert_close(whole, _steps(fast, src, tgt), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(whole, float_model, atol=1e-5)


def test_searches_run_on_int8() -> None:
    model = tiny_model(tgt_vocab=None)
    fast = DecodingModel(model, int8=True)
    src, _ = tiny_batch()
    out = greedy_search(fast, src, max_len=6)
    assert len(out) == src.size(0)
    beams = beam_search(fast, src, beam=3, max_len=6, nbest=3)
    assert [len(hs) for hs in beams] == [3] * src.size(0)


def test_int8_needs_float32_weights() -> None:
    with pytest.raises(ValueError, match="float32 CPU weights"):
        DecodingModel(tiny_model().to(torch.bfloat16), int8=True)
