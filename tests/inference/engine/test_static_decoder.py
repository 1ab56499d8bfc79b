"""StaticDecoder: the engine's steps on static buffers (what a CUDA graph replays) give the
engine's outputs, for the model variants, beams that drop sentences, buffers that grow and
sources with padding; on CUDA (where there is one) also captured and replayed."""

from __future__ import annotations

import pytest
import torch
from model_testkit import tiny_batch, tiny_model

from transduce.inference import beam_search, greedy_search
from transduce.inference.engine import DecodingModel
from transduce.inference.engine.static import MAX_SLOTS, StaticDecoder

VARIANTS = [
    {},
    {"norm": "pre"},
    {"positional": "learned"},
    {"tgt_vocab": 11, "tie_embeddings": False, "output_bias": True},
    {"activation": "swish", "d_k": 5, "d_v": 7, "n_heads": 3},
]


def _sources(seed: int = 0) -> torch.Tensor:
    """Five right-padded sources of different lengths: sentences finish at different steps."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 13, (5, 9), generator=g)  # model_testkit.V = 13
    for row, length in ((1, 6), (3, 3), (4, 8)):
        src[row, length:] = 0
    return src


def _engine(kw: dict) -> DecodingModel:
    # no fold of one sentence's encoder-decoder attention: the static step has none
    return DecodingModel(tiny_model(**kw), fold_one_sentence=False)


def _tokens(results) -> list:
    return [[h.tokens for h in hs] for hs in results]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(kw) or "base")
def test_searches_give_the_engine_s_outputs(kw: dict) -> None:
    engine = _engine(kw)
    static = StaticDecoder(engine, capacity=2)  # grows three times in 12 steps
    src = _sources()
    assert greedy_search(static, src, max_len=12) == greedy_search(engine, src, max_len=12)
    mine = beam_search(static, src, beam=3, max_len=12, nbest=2)
    ref = beam_search(engine, src, beam=3, max_len=12, nbest=2)
    assert _tokens(mine) == _tokens(ref)
    torch.testing.assert_close(
        torch.tensor([[h.score for h in hs] for hs in mine]),
        torch.tensor([[h.score for h in hs] for hs in ref]),
    )


def test_sentences_drop_and_hypotheses_move_in_the_buffers() -> None:
    """Outputs of different lengths (so that beam search drops sentences while others go on)
    and several beams (so that hypotheses change slots): the rows map must follow both."""
    engine = _engine({})
    src = _sources(3)
    ref = beam_search(engine, src, beam=4, max_len_offset=20)
    lengths = {len(hs[0].tokens) for hs in ref}
    assert len(lengths) > 2  # the case is what it claims
    for capacity in (1, 5, 64):
        got = beam_search(StaticDecoder(engine, capacity=capacity), src, beam=4, max_len_offset=20)
        assert _tokens(got) == _tokens(ref), capacity


def test_logits_and_length_of_every_step_equal_the_engine_s() -> None:
    """Step by step against the engine's cache, with a reorder and a dropped sentence between:
    the contract's calls, and ``length`` (which a logits processor may read), one by one."""
    engine = _engine({})
    src, tgt = tiny_batch()
    tgt = tgt[:, :4].repeat_interleave(2, 0)  # (B*G, 4), G = 2
    static = StaticDecoder(engine, capacity=2)
    with torch.no_grad():
        memory, valid = engine.encode(src)
        caches = [engine.new_cache(), static.new_cache()]
        models = [engine, static]
        outs: list[list[torch.Tensor]] = [[], []]
        for i, (model, cache) in enumerate(zip(models, caches, strict=True)):
            outs[i].append(model.decode(tgt[:, :1], memory, valid, cache))
            outs[i].append(model.decode(tgt[:, 1:2], memory, valid, cache))
            cache.reorder(torch.tensor([1, 1, 2, 3, 5, 4]))  # hypotheses move within a sentence
            outs[i].append(model.decode(tgt[:, 2:3], memory, valid, cache))
            keep = torch.tensor([0, 2])
            cache.reorder(torch.tensor([0, 1, 5, 4]))  # sentence 1 dropped, then
            cache.select_sources(keep)
            outs[i].append(model.decode(tgt[[0, 1, 4, 5], 3:4], memory[keep], valid[keep], cache))
            assert cache.length == 4
    for mine, ref in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(mine, ref)


def test_a_reorder_that_moves_whole_sentences() -> None:
    """The contract allows a reorder to put sentences in another order before select_sources
    takes them in that order (no search does so today): the static rows must follow, from the
    first reorder of the batch on (no sentence dropped before) and after a drop."""
    engine = _engine({})
    src, tgt = tiny_batch()  # 3 sentences
    tgt = tgt[:, :4].repeat_interleave(2, 0)  # (B*G, 4), G = 2
    static = StaticDecoder(engine, capacity=8)
    with torch.no_grad():
        memory, valid = engine.encode(src)
        outs: list[list[torch.Tensor]] = [[], []]
        for i, model in enumerate((engine, static)):
            cache = model.new_cache()
            outs[i].append(model.decode(tgt[:, :1], memory, valid, cache))
            outs[i].append(model.decode(tgt[:, 1:2], memory, valid, cache))
            order = torch.tensor([2, 0, 1])
            cache.reorder(torch.tensor([5, 4, 0, 1, 3, 2]))  # sentences 2, 0, 1
            cache.select_sources(order)
            rows = torch.tensor([5, 4, 0, 1, 3, 2])
            outs[i].append(model.decode(tgt[rows, 2:3], memory[order], valid[order], cache))
            cache.reorder(torch.tensor([3, 2, 1, 0]))  # of 2, 0, 1: 0 then 2, 1 dropped
            cache.select_sources(torch.tensor([1, 0]))
            rows = torch.tensor([1, 0, 5, 4])
            keep = order[torch.tensor([1, 0])]
            outs[i].append(model.decode(tgt[rows, 3:4], memory[keep], valid[keep], cache))
    for mine, ref in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(mine, ref)


def test_later_searches_of_a_shape_reuse_its_slot_with_their_own_values() -> None:
    """A second batch of the same shapes runs on the first one's static tensors (on CUDA its
    graph): its own sources, keys and mask copied in, nothing of the first batch left over."""
    engine = _engine({})
    static = StaticDecoder(engine, capacity=4)
    first, second = _sources(1), _sources(2)
    assert first.shape == second.shape and not torch.equal(first, second)
    ref = [beam_search(engine, src, beam=3, max_len=10) for src in (first, second)]
    assert _tokens(beam_search(static, first, beam=3, max_len=10)) == _tokens(ref[0])
    kept = dict(static.slots)  # 4, 8 and 16 positions
    assert len(kept) == 3 and not any(slot.in_use() for slot in kept.values())
    assert _tokens(beam_search(static, second, beam=3, max_len=10)) == _tokens(ref[1])
    assert static.slots == kept and all(static.slots[k] is kept[k] for k in kept)  # reused
    assert greedy_search(static, second, max_len=10) == greedy_search(engine, second, max_len=10)


def test_searches_at_once_do_not_share_a_slot() -> None:
    """Two searches of one shape stepped in turn (two threads, say): the second gets a slot of
    its own while the first holds the kept one, and each gives the engine's logits."""
    engine = _engine({})
    static = StaticDecoder(engine, capacity=8)
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = engine.encode(src)
        ours = [static.new_cache(), static.new_cache()]
        theirs = [engine.new_cache(), engine.new_cache()]
        shifted = [tgt, tgt.roll(1, dims=0)]  # other tokens in each search
        for t in range(4):
            for mine, ref, tokens in zip(ours, theirs, shifted, strict=True):
                got = static.decode(tokens[:, t : t + 1], memory, valid, mine)
                want = engine.decode(tokens[:, t : t + 1], memory, valid, ref)
                torch.testing.assert_close(got, want)
        assert ours[0].steps is not None and ours[1].steps is not None
        assert ours[0].steps.slot is not ours[1].steps.slot
        assert len(static.slots) == 1  # the second's own slot is not kept


def test_slots_kept_are_bounded(monkeypatch) -> None:
    from transduce import kernels

    engine = _engine({})
    static = StaticDecoder(engine, capacity=16)
    g = torch.Generator().manual_seed(0)
    for n in range(1, MAX_SLOTS + 4):  # more batch sizes than slots: as many shapes
        src = torch.randint(4, 13, (n, 4), generator=g)
        assert greedy_search(static, src, max_len=4) == greedy_search(engine, src, max_len=4)
    assert len(static.slots) == MAX_SLOTS
    assert [key[0] for key in static.slots] == list(range(4, MAX_SLOTS + 4))  # the last used
    # and in bytes: room for the two largest, the last two used
    sizes = [slot.nbytes for slot in static.slots.values()]
    monkeypatch.setattr(kernels, "kept_graph_bytes", lambda device: sizes[-1] + sizes[-2])
    src = torch.randint(4, 13, (2, 5), generator=g)  # a new shape: the older go till it fits
    assert greedy_search(static, src, max_len=4) == greedy_search(engine, src, max_len=4)
    assert [key[:3] for key in static.slots] == [(MAX_SLOTS + 3, MAX_SLOTS + 3, 4), (2, 2, 5)]
    # a shape larger alone than the bound: decoded, not kept, the kept ones left
    src = torch.randint(4, 13, (4 * MAX_SLOTS, 5), generator=g)
    assert greedy_search(static, src, max_len=4) == greedy_search(engine, src, max_len=4)
    assert [key[:3] for key in static.slots] == [(MAX_SLOTS + 3, MAX_SLOTS + 3, 4), (2, 2, 5)]


def test_learned_positions_stop_where_the_engine_stops() -> None:
    engine = _engine({"positional": "learned", "max_positions": 10})
    static = StaticDecoder(engine, capacity=4)  # 4, then 8, then the 10 there are
    src = _sources()
    assert greedy_search(static, src, max_len=9) == greedy_search(engine, src, max_len=9)
    for model in (engine, static):
        with pytest.raises(ValueError, match="max_positions=10"):
            greedy_search(model, src, max_len=12)


def test_refusals() -> None:
    with pytest.raises(ValueError, match="word slots"):
        StaticDecoder(_engine({"position_unit": "word"}))
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device"):
        StaticDecoder(_engine({}), graphs=True)
    with pytest.raises(ValueError, match="capacity"):
        StaticDecoder(_engine({}), capacity=0)
    static = StaticDecoder(_engine({}))
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = static.encode(src)
        cache = static.new_cache()
        static.decode(tgt[:, :1], memory, valid, cache)
        static.decode(tgt[:, 1:2], memory, valid, cache)
        with pytest.raises(ValueError, match="one position a step"):
            static.decode(tgt[:, 2:4], memory, valid, cache)
        with pytest.raises(ValueError, match="2 target rows for 3 sentences"):
            static.decode(tgt[:2, 2:3], memory, valid, cache)
        # the engine's own buffers are let go once copied into the static ones
        assert all(layer.self_k is None for layer in cache.eager.layers)
        other = static.new_cache()  # rows that the first step's cache does not hold
        static.decode(tgt[:, :1], memory, valid, other)
        with pytest.raises(ValueError, match="6 target rows against a cache of 3 rows"):
            static.decode(tgt[:, 1:2].repeat_interleave(2, 0), memory, valid, other)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_replay_the_static_steps(dtype: torch.dtype) -> None:
    engine = DecodingModel(tiny_model().to("cuda", dtype))
    src = _sources().cuda()
    graphed = StaticDecoder(engine, capacity=4)
    assert graphed.graphs
    eager = StaticDecoder(engine, graphs=False, capacity=4)
    assert greedy_search(graphed, src, max_len=12) == greedy_search(eager, src, max_len=12)
    mine = beam_search(graphed, src, beam=3, max_len=12)
    assert _tokens(mine) == _tokens(beam_search(eager, src, beam=3, max_len=12))
    if dtype == torch.float32:
        assert _tokens(mine) == _tokens(beam_search(engine, src, beam=3, max_len=12))
    other = _sources(5).cuda()  # the same shapes: the graphs captured above replayed
    graphs = {key: tuple(slot.graphs) for key, slot in graphed.slots.items()}
    assert graphed.capture is not None
    captured = graphed.capture.captures
    assert captured >= len(graphs) and graphed.capture.seconds > 0
    again = beam_search(graphed, other, beam=3, max_len=12)
    assert _tokens(again) == _tokens(beam_search(eager, other, beam=3, max_len=12))
    assert all(
        all(a is b for a, b in zip(graphed.slots[key].graphs, both, strict=True))
        for key, both in graphs.items()
    )
    assert graphed.capture.captures == captured  # replayed, none captured again


def test_the_gpu_s_search_on_the_static_steps(monkeypatch) -> None:
    """Beam search as it runs on a GPU (no reads taken for cheap: every sentence's rows stay
    until one is done, reorders of the whole batch take the static steps' short path) gives
    the engine's outputs, sentences dropped on the way included."""
    from transduce import kernels

    engine = _engine({})
    src = _sources(3)
    ref = beam_search(engine, src, beam=4, max_len=12, nbest=2)
    monkeypatch.setattr(kernels, "reads_are_cheap", lambda device: False)
    static = StaticDecoder(engine, capacity=4)
    mine = beam_search(static, src, beam=4, max_len=12, nbest=2)
    assert _tokens(mine) == _tokens(ref)
    torch.testing.assert_close(
        torch.tensor([[h.score for h in hs] for hs in mine]),
        torch.tensor([[h.score for h in hs] for hs in ref]),
    )


def test_graphs_asked_for_where_they_cannot_be_are_refused(tmp_path) -> None:
    """``searchable(graphs=True)`` and ``Translator.load(graphs=True)``: a ValueError / a
    UserError in one line off CUDA, for a model without the engine and for a model the static
    steps refuse (positions counted in words, the parser's)."""
    from inference_testkit import save_toy_translation_model

    from transduce.errors import UserError
    from transduce.inference.search import searchable
    from transduce.inference.translator import Translator
    from transduce.recurrent.model import RecurrentSeq2Seq

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device"):
            searchable(tiny_model(), graphs=True)
        path = save_toy_translation_model(tmp_path / "m.pt", {"beam": 2})
        with pytest.raises(UserError, match="CUDA graphs needs a CUDA device, not cpu"):
            Translator.load(path, graphs=True)
        loaded = Translator.load(path)
        with pytest.raises(UserError, match="CUDA graphs needs a CUDA device, not cpu"):
            Translator.of_model(loaded.model, loaded.vocab, loaded.cfg, "bf16", graphs=True)
        assert next(loaded.model.parameters()).dtype == torch.float32  # refused before converting
    assert type(searchable(tiny_model())) is DecodingModel  # not asked for: the engine
    rnn = RecurrentSeq2Seq.__new__(RecurrentSeq2Seq)  # any model without the engine
    with pytest.raises(ValueError, match="decoding on CUDA graphs runs on the Transformer"):
        searchable(rnn, graphs=True)
    with pytest.raises(ValueError, match="counts them in word slots"):
        searchable(tiny_model(position_unit="word"), graphs=True)
    if torch.cuda.is_available():
        assert isinstance(searchable(tiny_model().cuda(), graphs=True), StaticDecoder)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batches_of_many_shapes_on_cuda_graphs() -> None:
    """More shapes of batch than slots kept (as a translation file's batches of different
    lengths): each batch's outputs are the engine's, the slots never more than MAX_SLOTS."""
    from transduce.inference.search import searchable

    model = tiny_model().cuda()
    graphed, engine = searchable(model, graphs=True), searchable(model)
    assert isinstance(graphed, StaticDecoder)
    g = torch.Generator().manual_seed(0)
    for rows in range(1, MAX_SLOTS + 4):
        src = torch.randint(4, 13, (rows, 3 + rows % 3), generator=g).cuda()  # model_testkit.V
        assert _tokens(beam_search(graphed, src, beam=3, max_len=10, nbest=2)) == _tokens(
            beam_search(engine, src, beam=3, max_len=10, nbest=2)
        )
        assert len(graphed.slots) <= MAX_SLOTS


def test_sampling_and_prefixes_on_the_static_steps() -> None:
    """The Translator's other searches on a GPU take the static steps too: samples (rows of a
    sentence dropped together) and prefixes forced through a wrapper give the engine's."""
    from transduce.inference.prefix import PrefixConstrained
    from transduce.inference.sampling import sample

    engine = _engine({})
    static = StaticDecoder(engine, capacity=4)
    src = _sources(4)

    def drawn(model):  # noqa: ANN001, ANN202
        g = torch.Generator().manual_seed(7)
        out = sample(model, src, samples=3, generator=g, max_len_offset=6)
        return [[h.tokens for h in hs] for hs in out]

    assert drawn(static) == drawn(engine)
    prefixes = [[5, 6], [], [7], [8, 9, 10], [4]]
    assert _tokens(beam_search(PrefixConstrained(static, prefixes), src, beam=3, max_len=9)) == (
        _tokens(beam_search(PrefixConstrained(engine, prefixes), src, beam=3, max_len=9))
    )


def test_an_ensemble_of_static_decoders() -> None:
    """``Translator.load_ensemble(..., graphs=True)``'s members: an Ensemble of static decoders
    (each member's cache its own static buffers) gives the Ensemble of engines' outputs."""
    from transduce.inference.ensemble import Ensemble

    engines = [_engine({}), DecodingModel(tiny_model(seed=1), fold_one_sentence=False)]
    src = _sources(2)
    statics = Ensemble([StaticDecoder(e, capacity=4) for e in engines])
    mine = beam_search(statics, src, beam=3, max_len=10, nbest=2)
    ref = beam_search(Ensemble(engines), src, beam=3, max_len=10, nbest=2)
    assert _tokens(mine) == _tokens(ref)
    torch.testing.assert_close(
        torch.tensor([[h.score for h in hs] for hs in mine]),
        torch.tensor([[h.score for h in hs] for hs in ref]),
    )


def test_the_translator_takes_graphs_where_they_apply(tmp_path, monkeypatch) -> None:
    """``graphs=None`` (the default): a Transformer counting positions in tokens on a device
    that captures CUDA graphs decodes on them; the parser's word positions, other models and
    CPUs step by step; ``graphs=False`` keeps the engine on a GPU."""
    from inference_testkit import save_toy_translation_model

    from transduce import kernels
    from transduce.inference.search import graphs_apply
    from transduce.inference.translator import Translator
    from transduce.recurrent.model import RecurrentSeq2Seq

    path = save_toy_translation_model(tmp_path / "m.pt", {"beam": 2})
    assert type(Translator.load(path).decoding) is DecodingModel  # a CPU
    assert not graphs_apply(tiny_model())
    rnn = RecurrentSeq2Seq.__new__(RecurrentSeq2Seq)
    with monkeypatch.context() as patched:  # as on a GPU
        patched.setattr(kernels, "graphs_capture", lambda device: True)
        assert graphs_apply(tiny_model())
        assert not graphs_apply(tiny_model(position_unit="word"))
        assert not graphs_apply(rnn)
    if torch.cuda.is_available():
        on_gpu = Translator.load(path, "cuda")
        assert isinstance(on_gpu.decoding, StaticDecoder) and on_gpu.decoding.graphs
        assert type(Translator.load(path, "cuda", graphs=False).decoding) is DecodingModel
        engine = Translator.load(path, "cuda", graphs=False)
        src = ["a b c", "d e"]
        assert on_gpu.translate(src) == engine.translate(src)


def test_many_searches_on_both_sides_of_the_cache(monkeypatch) -> None:
    """Searches of recurring shapes, as on a GPU (reads not cheap), with the capacity growing
    and sentences dropped on the way: each reorder gathers the cache into its other side, so
    later searches start on either side of a kept slot, and all give the engine's outputs."""
    from transduce import kernels

    monkeypatch.setattr(kernels, "reads_are_cheap", lambda device: False)
    engine = _engine({})
    static = StaticDecoder(engine, capacity=2)
    sides_at_start = set()
    for it in range(30):
        g = torch.Generator().manual_seed(it % 5)  # the same shapes again: slots reused
        src = torch.randint(4, 13, (2 + it % 3, 6), generator=g)  # model_testkit.V = 13
        src[0, 3 + it % 3 :] = 0
        sides_at_start |= {slot.side for slot in static.slots.values()}
        beam, offset = 2 + it % 3, it % 7
        mine = beam_search(static, src, beam=beam, max_len_offset=offset, nbest=beam)
        ref = beam_search(engine, src, beam=beam, max_len_offset=offset, nbest=beam)
        assert _tokens(mine) == _tokens(ref), it
    assert sides_at_start == {0, 1}
