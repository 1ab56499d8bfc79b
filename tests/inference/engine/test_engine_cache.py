"""The engine's cache against a naive reference (``torch.cat`` to append, ``index_select`` to
reorder): preallocated buffers that grow, row gathers into spare buffers, shrinking batches."""

from __future__ import annotations

import torch

from transduce.inference.engine.cache import EngineCache, EngineLayerCache


def test_append_and_reorder_match_naive_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    cache = EngineLayerCache()
    ref_k = ref_v = None
    n, h, dk, dv = 6, 2, 3, 5
    for step in range(40):  # past several doublings of the 16-position start capacity
        new = 1 if step % 7 else 3  # sometimes several positions at once
        k, v = torch.randn(n, h, new, dk, generator=gen), torch.randn(n, h, new, dv, generator=gen)
        out_k, out_v = cache.append(k, v)
        ref_k = k if ref_k is None else torch.cat([ref_k, k], 2)
        ref_v = v if ref_v is None else torch.cat([ref_v, v], 2)
        assert torch.equal(out_k, ref_k) and torch.equal(out_v, ref_v)
        if step % 3 == 0:  # permute, duplicate and (sometimes) drop rows, as beam search does
            n_new = n if step % 9 else max(n - 1, 2)
            index = torch.randint(0, n, (n_new,), generator=gen)
            cache.reorder(index)
            ref_k, ref_v, n = ref_k[index], ref_v[index], n_new
            assert torch.equal(cache.self_k, ref_k) and torch.equal(cache.self_v, ref_v)
    assert cache.self_k.size(2) == ref_k.size(2) > 40


def test_reorder_can_grow_the_rows() -> None:
    cache = EngineLayerCache()
    k = torch.arange(2.0).view(2, 1, 1, 1)
    cache.append(k, k)
    index = torch.tensor([0, 0, 0, 1, 1, 1])  # B sentences -> B*W beams
    cache.reorder(index)
    assert cache.self_k.flatten().tolist() == [0, 0, 0, 1, 1, 1]
    out_k, _ = cache.append(torch.full((6, 1, 1, 1), 7.0), torch.zeros(6, 1, 1, 1))
    assert out_k.shape == (6, 1, 2, 1) and out_k[:, 0, 1, 0].tolist() == [7.0] * 6


def test_select_sources_leaves_hypothesis_rows() -> None:
    cache = EngineCache(2)
    for layer in cache.layers:
        layer.cross_k = layer.cross_v = torch.arange(3.0)
        layer.append(torch.zeros(6, 1, 1, 1), torch.zeros(6, 1, 1, 1))
    cache.select_sources(torch.tensor([2, 0]))
    cache.reorder(torch.tensor([5, 4, 1, 0]))
    for layer in cache.layers:
        assert layer.cross_k.tolist() == [2.0, 0.0] and layer.self_k.size(0) == 4


def test_reorder_moving_few_rows_copies_them_in_place() -> None:
    """EngineCache.reorder copies only the changed rows when at most half change (beam search
    keeps hypotheses in their parents' slots); the result equals a gather either way."""
    gen = torch.Generator().manual_seed(3)
    cache = EngineCache(2)
    n = 8
    refs = []
    for layer in cache.layers:
        k, v = torch.randn(n, 2, 5, 3, generator=gen), torch.randn(n, 2, 5, 4, generator=gen)
        layer.append(k, v)
        refs.append((k, v))
    buffers = [layer.self_k.data_ptr() for layer in cache.layers]
    for index in (
        torch.tensor([0, 0, 2, 3, 3, 5, 6, 7]),  # two rows change: in place
        torch.arange(n),  # nothing changes
        torch.tensor([1, 1, 1, 1, 4, 4, 4, 4]),  # six change: gathered
    ):
        cache.reorder(index)
        refs = [(k[index], v[index]) for k, v in refs]
        for layer, (k, v) in zip(cache.layers, refs, strict=True):
            assert torch.equal(layer.self_k, k) and torch.equal(layer.self_v, v)
        if index.tolist() == [0, 0, 2, 3, 3, 5, 6, 7]:
            assert [layer.self_k.data_ptr() for layer in cache.layers] == buffers


def test_in_place_moves_after_dropped_rows_and_growth() -> None:
    """Beam search's sequence: rows dropped (the buffers keep more rows than are live), then
    steps that move a few rows in place, across capacity doublings."""
    gen = torch.Generator().manual_seed(4)
    cache = EngineCache(1)
    layer = cache.layers[0]
    n = 12
    ref_k = ref_v = None
    for step in range(40):
        k, v = torch.randn(n, 2, 1, 3, generator=gen), torch.randn(n, 2, 1, 4, generator=gen)
        layer.append(k, v)
        ref_k = k if ref_k is None else torch.cat([ref_k, k], 2)
        ref_v = v if ref_v is None else torch.cat([ref_v, v], 2)
        if step in (3, 20):  # drop rows: a gather into fewer rows than the buffers hold
            index = torch.randperm(n, generator=gen)[: n - 4]
        else:  # one or two rows take another's place: moved in place
            index = torch.arange(n)
            moved = torch.randint(0, n, (2,), generator=gen)
            index[moved] = torch.randint(0, n, (2,), generator=gen)
        cache.reorder(index)
        ref_k, ref_v, n = ref_k[index], ref_v[index], index.numel()
        assert torch.equal(layer.self_k, ref_k) and torch.equal(layer.self_v, ref_v)
    assert n == 4 and layer.self_k.size(2) == 40


def test_moved_rows_are_counted_on_cpus_only() -> None:
    """The in-place reorder counts the rows that move (a read of the device: on a GPU a wait for
    it every step); off a CPU the cache gathers every row instead."""
    from transduce.inference.engine.cache import _moved_rows

    keys, index = torch.zeros(4, 2, 3, 5), torch.tensor([0, 1, 1, 3])
    moved = _moved_rows(index, keys)
    assert moved is not None and (moved[0].tolist(), moved[1].tolist()) == ([2], [1])
    assert _moved_rows(index.to("meta"), keys.to("meta")) is None
