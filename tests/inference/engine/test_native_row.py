"""The native one-row step (inference/engine/native_row.py): a sentence decoded alone, one
native call a step, computes what the model computes, for every kind of model, folded or not,
past the cache's first buffers, and hands its cache on to PyTorch's steps intact."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from model_testkit import tiny_batch, tiny_model

from transduce.inference import beam_search, greedy_search
from transduce.inference.engine import DecodingModel
from transduce.inference.engine.native_row import MAX_ROWS, RowPlan
from transduce.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels did not build")

_VARIANTS: list[dict[str, Any]] = [
    {},
    {"norm": "pre"},
    {"activation": "swish"},
    {"activation": "gelu"},
    {"positional": "learned"},
    {"position_unit": "word"},
    {"d_k": 5, "d_v": 7, "n_heads": 3},
    {"tgt_vocab": 11, "tie_embeddings": False},
    {"output_bias": True},
]


def _id(kw: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in kw.items()) or "base"


def _steps(model: Any, src: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """Logits (N, T, V) of ``tgt`` decoded one position at a time against ``src``'s memory."""
    with torch.no_grad():
        memory, valid = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, valid, cache) for t in range(tgt.size(1))]
    return torch.cat(steps, dim=1), cache


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "unfolded"])
@pytest.mark.parametrize("kw", _VARIANTS, ids=_id)
def test_native_steps_equal_the_model(kw: dict[str, Any], fold: bool) -> None:
    model = tiny_model(**kw)
    fast = DecodingModel(model, fold_one_sentence=fold, native_row_step=True)
    src, tgt = tiny_batch()
    for i in range(src.size(0)):  # sentences 1 and 2 have source padding
        out, cache = _steps(fast, src[i : i + 1], tgt[i : i + 1])
        ref, _ = _steps(model, src[i : i + 1], tgt[i : i + 1])
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert cache.row_state is not None  # the native step ran
        assert (cache.layers[0].cross_folded is not None) == fold
        assert cache.length == tgt.size(1)


@pytest.mark.parametrize("kw", _VARIANTS, ids=_id)
def test_int8_native_steps_equal_the_int8_engine(kw: dict[str, Any]) -> None:
    # the same int8 weights, the same quantisation of each product's input row, exact int8 sums
    model = tiny_model(**kw)
    fast = DecodingModel(model, int8=True, native_row_step=True)
    slow = DecodingModel(model, int8=True, native_row_step=False)
    src, tgt = tiny_batch()
    for i in range(src.size(0)):
        out, cache = _steps(fast, src[i : i + 1], tgt[i : i + 1])
        ref, _ = _steps(slow, src[i : i + 1], tgt[i : i + 1])
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert cache.row_state is not None and cache.layers[0].cross_folded is None
    with torch.no_grad():  # and int8, not float32: the float model's logits are further away
        full = model(src[:1], tgt[:1])
    out, _ = _steps(fast, src[:1], tgt[:1])
    assert (out - full).abs().max() > 1e-4


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
@pytest.mark.parametrize("fold", [True, False], ids=["folded", "unfolded"])
def test_the_hypotheses_of_one_sentence_in_one_step(fold: bool, int8: bool) -> None:
    # G = 4 hypothesis rows of one sentence (a beam), each with its own cache row
    model = tiny_model(norm="pre", activation="gelu")
    src, _ = tiny_batch()
    tgt = torch.randint(4, 11, (4, 6), generator=torch.Generator().manual_seed(6))
    fast = DecodingModel(model, fold_one_sentence=fold and not int8, int8=int8)
    slow = DecodingModel(
        model, fold_one_sentence=fold and not int8, int8=int8, native_row_step=False
    )
    out, cache = _steps(fast, src[1:2], tgt)
    ref, _ = _steps(slow, src[1:2], tgt)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert cache.row_state is not None and cache.row_state.rows == 4
    if not int8:
        with torch.no_grad():
            expected = model(src[1:2].expand(4, -1), tgt)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # a row's numbers are the same whatever the other rows: each sum in one order
    alone, _ = _steps(fast, src[1:2], tgt[2:3])
    assert torch.equal(alone[0], out[2])


def test_more_rows_than_a_native_step_takes_run_pytorch_s_step() -> None:
    model = tiny_model()
    src, _ = tiny_batch()
    tgt = torch.randint(4, 11, (MAX_ROWS + 1, 3), generator=torch.Generator().manual_seed(2))
    out, cache = _steps(DecodingModel(model, native_row_step=True), src[:1], tgt)
    with torch.no_grad():
        expected = model(src[:1].expand(MAX_ROWS + 1, -1), tgt)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert cache.row_state is None


def test_long_outputs_grow_the_buffers() -> None:
    model = tiny_model(max_positions=128)
    src, _ = tiny_batch()
    tgt = torch.randint(4, 13, (1, 40), generator=torch.Generator().manual_seed(3))
    out, cache = _steps(DecodingModel(model, native_row_step=True), src[1:2], tgt)
    with torch.no_grad():
        full = model(src[1:2], tgt)
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-5)
    assert cache.row_state.capacity >= 40  # grown from 16 twice


def test_the_same_numbers_on_any_number_of_threads() -> None:
    # each output is summed by one thread in one order, whatever the split
    model = tiny_model(d_model=64, d_ff=96, n_heads=4)
    fast = DecodingModel(model, native_row_step=True)
    src, tgt = tiny_batch()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, _ = _steps(fast, src[:1], tgt[:1])
        torch.set_num_threads(2)
        two, _ = _steps(fast, src[:1], tgt[:1])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_pytorch_steps_after_native_ones_see_the_same_cache() -> None:
    # native steps, then two hypotheses of the sentence, swapped (a reorder in the native
    # steps' buffers), back to one row (native again), then two positions at once (the model's
    # path, reading the views the buffers make), then native: as the engine computes without
    # the native step
    model = tiny_model()
    src, _ = tiny_batch()
    tgt = torch.randint(4, 13, (1, 10), generator=torch.Generator().manual_seed(4))

    def run(engine: DecodingModel) -> list[torch.Tensor]:
        out = []
        with torch.no_grad():
            memory, valid = engine.encode(src[1:2])
            cache = engine.new_cache()
            for t in range(3):
                out.append(engine.decode(tgt[:, t : t + 1], memory, valid, cache))
            cache.reorder(torch.tensor([0, 0]))
            two = torch.cat([tgt[:, 3:4], tgt[:, 4:5]])  # (2, 1): the hypotheses part here
            out.append(engine.decode(two, memory, valid, cache))
            cache.reorder(torch.tensor([1, 0]))
            out.append(engine.decode(tgt[:, 4:5].expand(2, 1), memory, valid, cache))
            cache.reorder(torch.tensor([1]))
            out.append(engine.decode(tgt[:, 5:6], memory, valid, cache))
            out.append(engine.decode(tgt[:, 6:8], memory, valid, cache))
            for t in range(8, 10):
                out.append(engine.decode(tgt[:, t : t + 1], memory, valid, cache))
        return out

    native_out = run(DecodingModel(model, native_row_step=True))
    torch_out = run(DecodingModel(model, native_row_step=False))
    for a, b in zip(native_out, torch_out, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_native_steps_after_several_positions_at_once() -> None:
    # the model's own decode of a prefix leaves its cross-attention keys as views
    model = tiny_model()
    src, tgt = tiny_batch()
    for engine in (DecodingModel(model, fold_one_sentence=False), DecodingModel(model)):
        with torch.no_grad():
            memory, valid = engine.encode(src[1:2])
            cache = engine.new_cache()
            prefix = engine.decode(tgt[1:2, :3], memory, valid, cache)
            rest = [engine.decode(tgt[1:2, t : t + 1], memory, valid, cache) for t in (3, 4)]
            full = model(src[1:2], tgt[1:2])
        torch.testing.assert_close(torch.cat([prefix, *rest], 1), full, atol=1e-5, rtol=1e-5)
        assert cache.row_state is not None


def test_a_fully_padded_source_takes_pytorch_s_step() -> None:
    # no valid source position: PyTorch's attention gives zero weights, a softmax would give NaN
    model = tiny_model()
    fast = DecodingModel(model, native_row_step=True)
    src = torch.zeros(1, 5, dtype=torch.long)
    tgt = torch.randint(4, 11, (1, 4), generator=torch.Generator().manual_seed(7))
    out, cache = _steps(fast, src, tgt)
    ref, _ = _steps(model, src, tgt)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert cache.row_state is None


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
def test_searches_give_the_pytorch_step_s_outputs(int8: bool) -> None:
    model = tiny_model(d_model=32, d_ff=64, n_heads=4)
    src, _ = tiny_batch()
    torch_engine = DecodingModel(model, int8=int8, native_row_step=False)
    native_engine = DecodingModel(model, int8=int8)
    assert native_engine.row_plan is not None
    for i in range(src.size(0)):
        one = src[i : i + 1]
        native_out = greedy_search(native_engine, one, max_len=12)
        assert native_out == greedy_search(torch_engine, one, max_len=12)
        native_beams = beam_search(native_engine, one, beam=4, max_len=12)
        torch_beams = beam_search(torch_engine, one, beam=4, max_len=12)
        assert [h.tokens for h in native_beams[0]] == [h.tokens for h in torch_beams[0]]
        for a, b in zip(native_beams[0], torch_beams[0], strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-5)


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
def test_a_beams_reorder_moves_rows_in_the_native_steps_buffers(
    int8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One sentence's beam: a reorder copies the rows that move within the buffers the native
    steps write and keeps their state, rather than settling it (made anew the next step): the
    same hypotheses and scores bit for bit, the state made once for the beam's rows."""
    from transduce.inference.engine.cache import EngineCache

    model = tiny_model(d_model=32, d_ff=64, n_heads=4, tie_embeddings=False, tgt_vocab=13)
    src, _ = tiny_batch()
    engine = DecodingModel(model, int8=int8)
    if engine.row_plan is None:
        pytest.skip("no native step for this model here (int8 without int8 dot products)")
    made: list[int] = []
    real_state = DecodingModel._row_state
    monkeypatch.setattr(DecodingModel, "_row_state", lambda *a: made.append(1) or real_state(*a))
    moved = 0
    for i in range(src.size(0)):
        one = src[i : i + 1]
        made.clear()
        kept = beam_search(engine, one, beam=4, max_len=8, nbest=4)
        # once for the first step's row, once for the beam's 4 (max_len 8 stays within the
        # first buffers' capacity)
        assert len(made) == 2
        with monkeypatch.context() as m:
            m.setattr(EngineCache, "_reorder_native_rows", lambda self, index: False)
            made.clear()
            settled = beam_search(engine, one, beam=4, max_len=8, nbest=4)
            moved += len(made) > 2  # the old way made it anew after every reorder
        assert [[(h.tokens, h.score) for h in hs] for hs in kept] == [
            [(h.tokens, h.score) for h in hs] for hs in settled
        ]
    assert moved == src.size(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reordering_the_row_buffers_is_a_gather_of_their_first_positions(
    dtype: torch.dtype,
) -> None:
    g = torch.Generator().manual_seed(3)
    full = [torch.randn(6, 9, 2, 3, generator=g).to(dtype) for _ in range(4)]  # (rows, cap, H, K)
    buffers = [b.narrow(0, 0, 5) for b in full]  # the 5 rows in use, as the native steps' state
    index = torch.tensor([2, 0, 1, 3, 2])  # a cycle of three rows, one kept, one row copied twice
    want = [b.clone() for b in full]
    for b in want:
        b[:5, :4] = b[:5, :4].index_select(0, index)
    assert native.reorder_row_buffers(buffers, index, 4) == 4  # rows 0, 1, 2 and 4 move
    for got, expected in zip(full, want, strict=True):
        assert torch.equal(got, expected)  # positions 4.. and row 5 untouched
    assert native.reorder_row_buffers(buffers, torch.arange(5), 4) == 0
    with pytest.raises(RuntimeError, match="rows 0 .. N-1"):
        native.reorder_row_buffers(buffers, torch.tensor([0, 5, 1, 2, 3]), 4)
    # a buffer refused (too few positions) leaves the ones before it as they were
    before = full[0].clone()
    short = torch.zeros(5, 3, 2, 3, dtype=dtype)
    with pytest.raises(RuntimeError, match="capacity >= t"):
        native.reorder_row_buffers([buffers[0], short], index, 4)
    assert torch.equal(full[0], before)


def test_where_it_does_not_apply_it_is_refused_or_off() -> None:
    model = tiny_model()
    assert DecodingModel(model).row_plan is not None  # on by default on float32 CPU weights
    assert DecodingModel(model, native_row_step=False).row_plan is None
    plan = DecodingModel(model, int8=True).row_plan  # int8 products in int8
    assert plan is not None and plan.int8_weights.dtype == torch.int8
    with pytest.raises(ValueError, match="native_row_step needs"):
        DecodingModel(tiny_model().to(torch.bfloat16), native_row_step=True)
    eps = tiny_model()
    eps.decoder.layers[0].norms[0].eps = 1e-3  # one epsilon is the kernel's
    assert RowPlan.of(eps) is None


def test_int8_quantised_to_7_bits_takes_pytorch_s_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # int8 forced on a CPU without int8 dot products: the engine quantises to 7 bits there
    monkeypatch.setattr("transduce.kernels.quantized._reduce_range", lambda: True)
    assert RowPlan.of(tiny_model(), int8=True) is None
    assert RowPlan.of(tiny_model()) is not None  # float32 is not concerned


def test_the_kernel_refuses_weights_of_other_dims() -> None:
    plan = RowPlan.of(tiny_model())
    assert plan is not None
    d = plan.dims[1]
    buffers = [torch.zeros(1, 4, plan.dims[2], plan.dims[3])] * (2 * plan.dims[0])
    cross = [torch.zeros(1, plan.dims[2], 3, plan.dims[3])] * (3 * plan.dims[0])
    none = torch.empty(0, dtype=torch.int8), torch.empty(0, dtype=torch.int32)
    x = torch.zeros(1, d)
    with pytest.raises(RuntimeError, match="packed float32 tensor"):
        native.decoder_row_step(
            x, plan.weights[1:], *none, plan.dims, buffers, 0, cross, False, plan.eps
        )
    with pytest.raises(RuntimeError, match="capacity > t"):
        native.decoder_row_step(x, plan.weights, *none, plan.dims, buffers, 4, cross, False, 0.1)
    q = RowPlan.of(tiny_model(), int8=True)
    assert q is not None
    with pytest.raises(RuntimeError, match="int8 weights and row sums"):
        native.decoder_row_step(
            x, q.weights, q.int8_weights[1:], q.row_sums, q.dims, buffers, 0, cross, False, 0.1
        )
