"""Steps through the cache's lineage table (``EngineCache.lineage``, ``lineage_steps``): a
beam's reorder moves rows of the table, not the cached keys, and every step, search and cache
view equals what the gathering cache and the model give."""

from __future__ import annotations

import pytest
import torch
from model_testkit import PAD, V, decode_reordered, tiny_batch, tiny_model

from transduce import kernels
from transduce.data.vocab import BOS
from transduce.inference import beam_search, greedy_search
from transduce.inference.engine import DecodingModel
from transduce.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels did not build")

# head sizes 8 (the kernel's plain loops) and 32 (four keys at once, the sums in registers)
_SIZES = [{}, {"d_model": 64, "d_k": 32, "d_v": 32, "d_ff": 64}]


def _reordered_steps(decoder, src: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, object]:
    """Steps of ``tgt`` (3, 5) with a beam's moves between them: rows tripled after the first
    step (3 -> 9), shuffled, then a sentence dropped (9 -> 6). Returns (all logits, cache)."""
    memory, valid = decoder.encode(src)
    cache = decoder.new_cache()
    out = [decoder.decode(tgt[:, :1], memory, valid, cache)]  # (3, 1, V)
    expand = torch.arange(3).repeat_interleave(3)  # (9,): 3 hypotheses a sentence
    cache.reorder(expand)
    tgt, out = tgt[expand], [out[0][expand]]
    shuffles = [
        torch.tensor([2, 0, 1, 3, 3, 5, 8, 6, 6]),
        torch.tensor([1, 1, 0, 4, 3, 5, 6, 8, 7]),
    ]
    for t, index in zip(range(1, 3), shuffles, strict=True):
        out.append(decoder.decode(tgt[:, t : t + 1], memory, valid, cache))
        cache.reorder(index)
        tgt = tgt[index]
        out = [o[index] for o in out]
    keep = torch.tensor([0, 2])  # sentence 1 finished: its hypotheses leave
    rows = (keep[:, None] * 3 + torch.arange(3)).view(-1)  # (6,)
    cache.reorder(rows)
    cache.select_sources(keep)
    memory, valid, tgt = memory[keep], valid[keep], tgt[rows]
    out = [o[rows] for o in out]
    for t in range(3, 5):
        out.append(decoder.decode(tgt[:, t : t + 1], memory, valid, cache))
    return torch.cat(out, 1), cache  # (6, 5, V)


@pytest.mark.parametrize("kw", _SIZES, ids=["head8", "head32"])
def test_steps_through_the_lineage_equal_the_model(kw: dict) -> None:
    model = tiny_model(**kw)
    src, tgt = tiny_batch()
    tgt = tgt.clamp(min=1)
    engine = DecodingModel(model, lineage_steps=True)
    with torch.no_grad():
        ours, cache = _reordered_steps(engine, src, tgt)
        ref, ref_cache = _reordered_steps(model, src, tgt)
        plain, _ = _reordered_steps(DecodingModel(model, lineage_steps=False), src, tgt)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-5)
    assert cache.lineage is not None  # the steps went through the table
    cache.settle()  # gathered: the views hold what the model's cache holds
    assert cache.lineage is None
    for layer, ref_layer in zip(cache.layers, ref_cache.layers, strict=True):
        torch.testing.assert_close(layer.self_k, ref_layer.self_k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer.self_v, ref_layer.self_v, atol=1e-5, rtol=1e-5)


def test_a_reorder_moves_the_table_not_the_keys() -> None:
    model = tiny_model(**_SIZES[1])
    src, tgt = tiny_batch()
    engine = DecodingModel(model)
    assert engine.lineage_steps  # on by default where the kernel runs
    with torch.no_grad():
        memory, valid = engine.encode(src)
        cache = engine.new_cache()
        engine.decode(tgt[:, :1].clamp(min=1), memory, valid, cache)
        assert cache.layers[0]._buffers[0][0].size(1) >= 16  # room past the first position
        engine.decode(tgt[:, 1:2].clamp(min=1), memory, valid, cache)
        # the two positions written (past them the buffers hold what memory held)
        buffers = [b[:, :2].clone() for layer in cache.layers for b in layer._buffers[0]]
        cache.reorder(torch.tensor([2, 2, 0]))
        assert torch.equal(cache.lineage[:, :2], torch.tensor([[2, 2], [2, 2], [0, 0]]))
        after = [b[:, :2] for layer in cache.layers for b in layer._buffers[0]]
    assert all(torch.equal(a, b) for a, b in zip(buffers, after, strict=True))


def test_pytorch_steps_after_lineage_steps_see_the_gathered_cache() -> None:
    """Decoding several positions at once (the model's own code) after reordered steps reads
    the views, which ``settle`` gathers first."""
    model = tiny_model(**_SIZES[1])
    src, tgt = tiny_batch()
    tgt = tgt.clamp(min=1)
    index = torch.tensor([1, 1, 0])
    ours, _ = decode_reordered(DecodingModel(model), src, tgt, index, at_once=True)
    ref, _ = decode_reordered(model, src, tgt, index, at_once=True)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("int8", [False, True])
def test_searches_give_the_gathering_cache_s_outputs(int8: bool) -> None:
    """Beams and greedy over a batch whose sentences finish at different steps (the last one
    left then goes on alone, through a sentence's native steps): outputs and scores equal."""
    model = tiny_model(**_SIZES[1])
    g = torch.Generator().manual_seed(5)
    src = torch.randint(3, V, (5, 7), generator=g)
    src[1, 4:] = PAD
    engines = [DecodingModel(model, int8=int8, lineage_steps=on) for on in (True, False)]
    beams = [beam_search(e, src, beam=3, max_len=12, nbest=2) for e in engines]
    assert [[h.tokens for h in s] for s in beams[0]] == [[h.tokens for h in s] for s in beams[1]]
    for a, b in zip(beams[0], beams[1], strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
    greedy = [greedy_search(e, src, max_len=12) for e in engines]
    assert greedy[0] == greedy[1]


def test_where_it_does_not_run_it_is_refused_or_off(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match="float32 CPU weights"):
        DecodingModel(tiny_model().to(torch.bfloat16), lineage_steps=True)
    with pytest.raises(ValueError, match="lineage_steps needs attention='auto'"):
        DecodingModel(model, attention="formula", lineage_steps=True)
    for pinned in ("formula", "fused"):  # a pinned attention path is kept: no table
        assert not DecodingModel(model, attention=pinned).lineage_steps
    off = DecodingModel(model, lineage_steps=False)
    assert not off.lineage_steps and off.new_cache().lineage_steps is False
    calls: list[int] = []
    real = native.cached_self_attention
    monkeypatch.setattr(native, "cached_self_attention", lambda *a: calls.append(1) or real(*a))
    src, tgt = tiny_batch()
    step = torch.full((3, 1), BOS)
    for decoder in (off, DecodingModel(model)):
        memory, valid = decoder.encode(src)
        cache = decoder.new_cache()
        decoder.decode(step, memory, valid, cache)  # gradients on: PyTorch's step
        assert cache.lineage is None and cache.layers[0].self_k is not None
    assert calls == []
    with torch.no_grad():  # the layers in Python (not in one native batch step)
        python_layers = DecodingModel(model, native_batch_step=False)
        python_layers.decode(step, memory, valid, python_layers.new_cache())
    assert calls == [1] * model.config.n_layers
    with pytest.raises(RuntimeError, match="under no_grad"):
        kernels.cached_self_attention(*(torch.zeros(1, 1, 1, 8),) * 3, *(None,) * 3, 0)  # type: ignore[arg-type]


def test_long_outputs_grow_the_buffers_and_the_table() -> None:
    """40 positions (the buffers and the table start with room for 16), a random beam move
    after every step."""
    model = tiny_model(**_SIZES[1])
    src, _ = tiny_batch()
    g = torch.Generator().manual_seed(3)
    steps = torch.randint(1, V, (6, 40), generator=g)
    moves = [torch.randint(0, 6, (6,), generator=g) for _ in range(40)]
    out = []
    with torch.no_grad():
        for decoder in (DecodingModel(model), model):
            memory, valid = decoder.encode(src)
            memory, valid = memory.repeat_interleave(2, 0), valid.repeat_interleave(2, 0)
            cache, logits = decoder.new_cache(), []
            for t in range(40):
                logits.append(decoder.decode(steps[:, t : t + 1], memory, valid, cache))
                cache.reorder(moves[t])
                memory, valid = memory[moves[t]], valid[moves[t]]
                logits = [x[moves[t]] for x in logits]
            out.append(torch.cat(logits, 1))
    torch.testing.assert_close(out[0], out[1], atol=1e-5, rtol=1e-5)


def test_the_first_buffers_hold_twice_the_source_and_beams_keep_no_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch's first buffers have room for twice its source length, so an output that long
    never grows (copies) them; and beam search leaves hypotheses where they fall (no
    ``parent_slots``) while the cache moves table rows, not keys: the same outputs either way."""
    from transduce import kernels
    from transduce.inference import beam_choice

    model = tiny_model(**_SIZES[1])
    g = torch.Generator().manual_seed(7)
    src = torch.randint(3, V, (20, 12), generator=g)  # 80 hypothesis rows: parent_slots' size
    engine = DecodingModel(model)
    with torch.no_grad():
        memory, valid = engine.encode(src)
        cache = engine.new_cache()
        step = torch.full((20, 1), BOS)
        engine.decode(step, memory, valid, cache)
        first = [layer._buffers[0][0] for layer in cache.layers]
        assert all(b.size(1) >= 24 for b in first)
        for _ in range(22):
            engine.decode(step, memory, valid, cache)
        assert [layer._buffers[0][0].data_ptr() for layer in cache.layers] == [
            b.data_ptr() for b in first
        ]
    calls: list[int] = []
    real = beam_choice.parent_slots
    monkeypatch.setattr(beam_choice, "parent_slots", lambda *a: calls.append(1) or real(*a))
    # PyTorch's choice, where parent_slots is called from Python (the native kernel's in-place
    # order is tested against it in tests/inference/test_beam_select.py)
    monkeypatch.setattr(kernels, "beam_select_runs", lambda device: False)
    outs = []
    for on in (True, False):
        calls.clear()
        out = beam_search(DecodingModel(model, lineage_steps=on), src, beam=4, max_len=10)
        outs.append([[(h.tokens, round(h.score, 4)) for h in hyps] for hyps in out])
        assert (calls == []) == on  # the gathering cache moves rows: its hypotheses keep slots
    assert outs[0] == outs[1]
    # the native choice is asked for parents' slots where the cache moves rows, never on the table
    monkeypatch.undo()
    asked: list[bool] = []
    real_select = kernels.beam_select

    def select(*args: object) -> kernels.BeamChoice:
        asked.append(bool(args[-1]))  # in_place
        return real_select(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels, "beam_select", select)
    for on in (True, False):
        asked.clear()
        beam_search(DecodingModel(model, lineage_steps=on), src, beam=4, max_len=10)
        assert asked and any(asked) != on


def test_wrapping_caches_say_whether_a_reorder_moves_rows() -> None:
    """A prefix's cache says what its inner cache says; an ensemble's moves rows where any
    member's does (the search then keeps parent slots)."""
    from types import SimpleNamespace

    from transduce.inference.contract import reorder_moves_rows
    from transduce.inference.ensemble import EnsembleCache
    from transduce.inference.prefix import PrefixCache

    table, rows = SimpleNamespace(reorder_moves_rows=False), SimpleNamespace()
    forced = torch.full((1, 1), -1)
    assert reorder_moves_rows(PrefixCache(table, forced)) is False  # type: ignore[arg-type]
    assert reorder_moves_rows(PrefixCache(rows, forced)) is True  # type: ignore[arg-type]
    assert reorder_moves_rows(EnsembleCache([table, table])) is False  # type: ignore[list-item]
    assert reorder_moves_rows(EnsembleCache([table, rows])) is True  # type: ignore[list-item]
