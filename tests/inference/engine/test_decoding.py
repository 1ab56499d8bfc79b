"""DecodingModel: single-position steps from a snapshot of the weights compute what
Transformer.decode computes, for every model variant, beams and low precision."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal, get_args, get_origin

import pytest
import torch
from model_testkit import decode_reordered, tiny_batch, tiny_model

from transduce.config import ARCHITECTURE_KEYS, ModelConfig
from transduce.inference import beam_search, greedy_search
from transduce.inference.engine import DecodingModel
from transduce.inference.engine.decoding import IMPLEMENTED
from transduce.kernels import native
from transduce.kernels.matmul import onednn_available
from transduce.kernels.projection import Projection


def _config_variants() -> list[dict[str, Any]]:
    """The base model and, for every field of ModelConfig, each other Literal value and the
    flipped bool: a new option of the model is compared here without anyone listing it."""
    out: list[dict[str, Any]] = [{}]
    hints = typing.get_type_hints(ModelConfig)
    for f in dataclasses.fields(ModelConfig):
        if f.name == "architecture":  # the engine is the Transformer's (rnn: see the test below)
            continue
        if f.name in ARCHITECTURE_KEYS["rnn"]:  # a Transformer refuses them off their defaults
            continue
        hint = hints[f.name]
        if get_origin(hint) is Literal:
            out += [{f.name: v} for v in get_args(hint) if v != f.default]
        elif hint is bool:
            out.append({f.name: not f.default})
    return out


_VARIANTS = [
    *_config_variants(),
    {"d_k": 5, "d_v": 7, "n_heads": 3},
    {"tgt_vocab": 11},
    {"tgt_vocab": 11, "tie_embeddings": False},
]


def test_variants_cover_every_literal_and_bool_of_the_model_config() -> None:
    flipped = {k for kw in _config_variants() for k in kw}
    assert {"norm", "positional", "tie_embeddings"} <= flipped


def test_a_model_option_the_engine_does_not_implement_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(IMPLEMENTED) == {f.name for f in dataclasses.fields(ModelConfig)}
    model = tiny_model(norm="pre")
    monkeypatch.delitem(IMPLEMENTED, "norm")  # as if ModelConfig had gained a field
    with pytest.raises(ValueError, match="ModelConfig.norm"):
        DecodingModel(model)
    monkeypatch.setitem(IMPLEMENTED, "norm", ("post",))  # a value it does not implement
    with pytest.raises(ValueError, match="ModelConfig.norm = 'pre'"):
        DecodingModel(model)


def _steps(model, src, tgt, g: int = 1) -> tuple[torch.Tensor, object]:
    """Logits (B*G, T, V) of ``tgt`` decoded one position at a time against ``src``'s memory."""
    with torch.no_grad():
        memory, valid = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, valid, cache) for t in range(tgt.size(1))]
    return torch.cat(steps, dim=1), cache


def _id(kw: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in kw.items()) or "base"


_MATMULS = [
    "mkl",
    pytest.param("onednn", marks=pytest.mark.skipif(not onednn_available(), reason="no oneDNN")),
]


@pytest.mark.parametrize("matmul", _MATMULS)
@pytest.mark.parametrize("kw", _VARIANTS, ids=_id)
def test_steps_equal_transformer_decode(kw: dict, matmul: str) -> None:
    model = tiny_model(**kw)
    src, tgt = tiny_batch()  # source padding in two rows
    fast, cache = _steps(DecodingModel(model, matmul=matmul), src, tgt)
    ref, _ = _steps(model, src, tgt)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # and the full pass, which shares no code with the steps
        full = model(src, tgt)
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)
    assert cache.length == tgt.size(1)
    cache.settle()  # the views made current (the steps attend through the lineage table)
    assert cache.layers[0].self_k.shape[:3] == (3, model.config.n_heads, tgt.size(1))


@pytest.mark.parametrize("kw", _VARIANTS, ids=_id)
def test_one_sentence_steps_equal_transformer_decode(kw: dict, monkeypatch) -> None:
    # one sentence (B = 1): folded encoder-decoder attention, one-row products in column blocks
    # (3 blocks: d_model 16 and the vocabulary need zero padding)
    one_row_calls = []
    one_row = Projection._one_row
    monkeypatch.setattr(
        Projection, "_one_row", lambda p, x, b: one_row_calls.append(1) or one_row(p, x, b)
    )
    model = tiny_model(**kw)
    # PyTorch's one-row path (the native step has its own tests: test_native_row.py)
    fast = DecodingModel(model, one_row_parts=3, fold_one_sentence=True, native_row_step=False)
    src, tgt = tiny_batch()
    for i in range(src.size(0)):  # sentences 1 and 2 have source padding
        out, cache = _steps(fast, src[i : i + 1], tgt[i : i + 1])
        ref, _ = _steps(model, src[i : i + 1], tgt[i : i + 1])
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert cache.layers[0].cross_folded is not None
    assert one_row_calls  # the column blocks were used


def test_one_sentence_hypotheses_equal_expanded_memory() -> None:
    # G hypotheses of one sentence through the folded attention, then dropping the sentence
    model = tiny_model()
    src, _ = tiny_batch()
    tgt = torch.randint(4, 11, (4, 5), generator=torch.Generator().manual_seed(6))
    fast = DecodingModel(model, fold_one_sentence=True)
    out, cache = _steps(fast, src[1:2], tgt)
    with torch.no_grad():
        expected = model(src[1:2].expand(4, -1), tgt)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    cache.select_sources(torch.tensor([0]))
    assert cache.layers[0].cross_folded is not None
    cache.select_sources(torch.tensor([], dtype=torch.long))
    assert cache.layers[0].cross_folded is None


def test_the_last_sentence_of_a_batch_is_folded_from_its_own_memory() -> None:
    # three sentences for two steps, then only sentence 1 (as when the others finish)
    model = tiny_model()
    src, tgt = tiny_batch()
    index = torch.tensor([1])
    rest, cache = decode_reordered(DecodingModel(model, fold_one_sentence=True), src, tgt, index)
    with torch.no_grad():
        expected = model(src[index], tgt[index])[:, 2:]
    torch.testing.assert_close(rest, expected, atol=1e-5, rtol=1e-5)
    assert cache.layers[0].cross_folded is not None


def test_long_or_fully_padded_sources_are_not_folded() -> None:
    model = tiny_model()
    fast = DecodingModel(model, fold_one_sentence=True)
    tgt = torch.randint(4, 11, (1, 4), generator=torch.Generator().manual_seed(7))
    long_src = torch.randint(1, 13, (1, 20), generator=torch.Generator().manual_seed(8))
    padded = torch.zeros(1, 5, dtype=torch.long)  # no valid position: attention weights zero
    for src in (long_src, padded):
        out, cache = _steps(fast, src, tgt)
        ref, _ = _steps(model, src, tgt)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert cache.layers[0].cross_folded is None


def test_the_fold_keeps_the_weights_it_was_made_from() -> None:
    model = tiny_model()
    fast = DecodingModel(model, fold_one_sentence=True)
    src, tgt = tiny_batch()
    before, _ = _steps(fast, src[:1], tgt[:1])
    with torch.no_grad():
        model.decoder.layers[0].cross_attn.w_q.weight.mul_(2.0)
        model.decoder.layers[0].cross_attn.w_o.weight.mul_(2.0)
    after, _ = _steps(fast, src[:1], tgt[:1])
    torch.testing.assert_close(after, before)


def test_decode_in_training_mode_is_the_model_s() -> None:
    model = tiny_model(dropout=0.5)
    fast = DecodingModel(model)
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = model.encode(src)
        model.train()
        torch.manual_seed(4)
        mine = fast.decode(tgt[:, :1], memory, valid, fast.new_cache())
        torch.manual_seed(4)
        ref = model.decode(tgt[:, :1], memory, valid, model.new_cache())
    assert torch.equal(mine, ref)  # the model's own, with the same dropout masks


def test_one_row_parts_default_and_check() -> None:
    model = tiny_model()
    threads = torch.get_num_threads()
    assert DecodingModel(model, native_row_step=False).one_row_parts == threads
    # the native step takes one sentence's rows: no column blocks kept for PyTorch's one row
    assert DecodingModel(model).one_row_parts == (1 if native.available() else threads)
    assert DecodingModel(model.to(torch.bfloat16)).one_row_parts == 1
    with pytest.raises(ValueError, match="at least 1"):
        DecodingModel(tiny_model(), one_row_parts=0)
    with pytest.raises(ValueError, match="float32"):
        DecodingModel(tiny_model().to(torch.bfloat16), fold_one_sentence=True)


@pytest.mark.parametrize("matmul", _MATMULS)
@pytest.mark.parametrize("kw", _VARIANTS, ids=_id)
def test_encode_equals_transformer_encode(kw: dict, matmul: str) -> None:
    model = tiny_model(**kw)
    fast = DecodingModel(model, matmul=matmul)
    src, _ = tiny_batch()  # source padding in two rows
    with torch.no_grad():
        memory, valid = fast.encode(src)
        ref_memory, ref_valid = model.encode(src)
        one, _ = fast.encode(src[2:])  # one sentence, padded
    torch.testing.assert_close(memory, ref_memory, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(one, ref_memory[2:], atol=1e-5, rtol=1e-5)
    assert torch.equal(valid, ref_valid)


def test_encode_of_no_sentence_and_in_bf16() -> None:
    model = tiny_model()
    src, _ = tiny_batch()
    with torch.no_grad():
        empty, _ = DecodingModel(model).encode(src[:0])
        assert empty.shape == model.encode(src[:0])[0].shape == (0, src.size(1), 16)
        low = model.to(torch.bfloat16)
        memory, _ = DecodingModel(low).encode(src)
        ref, _ = low.encode(src)
    assert memory.dtype == torch.bfloat16
    torch.testing.assert_close(memory.float(), ref.float(), atol=0.02, rtol=0.02)


def test_encode_in_training_mode_is_the_model_s() -> None:
    model = tiny_model(dropout=0.5).train()
    fast = DecodingModel(model)
    src, _ = tiny_batch()
    torch.manual_seed(3)
    memory, _ = fast.encode(src)
    torch.manual_seed(3)
    assert torch.equal(memory, model.encode(src)[0])  # the same dropout masks


def test_grouped_hypotheses_equal_expanded_memory() -> None:
    # G hypotheses per sentence against one row of memory each, as beam search decodes
    model = tiny_model()
    src, _ = tiny_batch()
    g = 3
    tgt = torch.randint(4, 11, (src.size(0) * g, 5), generator=torch.Generator().manual_seed(5))
    rows = torch.arange(src.size(0)).repeat_interleave(g)
    fast, cache = _steps(DecodingModel(model), src, tgt)
    with torch.no_grad():
        expected = model(src[rows], tgt)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=1e-5)
    assert cache.layers[0].cross_k.size(0) == src.size(0)


def test_rows_must_be_a_multiple_of_sentences() -> None:
    model = DecodingModel(tiny_model())
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = model.encode(src)
        with pytest.raises(ValueError, match="not a multiple"):
            model.decode(tgt[:2, :1].repeat(2, 1), memory, valid, model.new_cache())


def test_reordered_cache_equals_decoding_the_reordered_batch() -> None:
    model = tiny_model()
    src, tgt = tiny_batch()
    index = torch.tensor([2, 0, 0, 1])  # permute and duplicate rows, as beam search does
    rest, _ = decode_reordered(DecodingModel(model), src, tgt, index)
    with torch.no_grad():
        expected = model(src[index], tgt[index])[:, 2:]
    torch.testing.assert_close(rest, expected, atol=1e-5, rtol=1e-5)


def test_several_positions_or_no_cache_run_the_model() -> None:
    model = tiny_model()
    fast = DecodingModel(model)
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = fast.encode(src)
        assert torch.equal(fast.decode(tgt, memory, valid), model.decode(tgt, memory, valid))
        # a prefix of 3 positions through the model, then steps on the same cache
        cache = fast.new_cache()
        out = [fast.decode(tgt[:, :3], memory, valid, cache)]
        out += [fast.decode(tgt[:, t : t + 1], memory, valid, cache) for t in (3, 4)]
        expected = model.decode(tgt, memory, valid)
    torch.testing.assert_close(torch.cat(out, dim=1), expected, atol=1e-5, rtol=1e-5)


def test_bf16_model_is_close_to_its_transformer_decode() -> None:
    model = tiny_model().to(torch.bfloat16)
    src, tgt = tiny_batch()
    fast, cache = _steps(DecodingModel(model), src, tgt)
    ref, _ = _steps(model, src, tgt)
    assert fast.dtype == torch.bfloat16
    # float32 attention on the CPU, as Transformer.decode: the cache holds float32
    assert cache.layers[0].self_k.dtype == torch.float32
    torch.testing.assert_close(fast.float(), ref.float(), atol=0.05, rtol=0.05)


def test_snapshot_keeps_the_weights_it_was_made_from() -> None:
    model = tiny_model()
    fast = DecodingModel(model)
    src, tgt = tiny_batch()
    before, _ = _steps(fast, src, tgt)
    with torch.no_grad():  # change a decoder projection in place (as an optimizer step does)
        model.decoder.layers[0].ffn.w_1.weight.mul_(2.0)
    after, _ = _steps(fast, src, tgt)
    changed, _ = _steps(DecodingModel(model), src, tgt)
    torch.testing.assert_close(after, before)  # the documented snapshot semantics
    assert not torch.allclose(changed, before, atol=1e-3)  # a new one sees the change


@pytest.mark.parametrize("matmul", _MATMULS)
def test_searches_give_the_model_s_outputs(matmul: str) -> None:
    model = tiny_model(tgt_vocab=None)
    fast = DecodingModel(model, matmul=matmul)
    src, _ = tiny_batch()
    assert greedy_search(fast, src, max_len=6) == greedy_search(model, src, max_len=6)
    mine = beam_search(fast, src, beam=3, max_len=6, nbest=3)
    ref = beam_search(model, src, beam=3, max_len=6, nbest=3)
    assert [[h.tokens for h in hs] for hs in mine] == [[h.tokens for h in hs] for hs in ref]
    torch.testing.assert_close(
        torch.tensor([[h.score for h in hs] for hs in mine]),
        torch.tensor([[h.score for h in hs] for hs in ref]),
    )


def test_training_mode_is_the_model_s_and_searches_refuse_it() -> None:
    model = tiny_model()
    fast = DecodingModel(model)
    src, _ = tiny_batch()
    model.train()
    assert fast.training
    with pytest.raises(ValueError, match="training mode"):
        greedy_search(fast, src, max_len=3)
    model.eval()
    assert not fast.training


def test_an_unknown_matmul_is_refused() -> None:
    with pytest.raises(ValueError, match="'blas'"):
        DecodingModel(tiny_model(), matmul="blas")  # type: ignore[arg-type]
