"""The model's key/value cache: appending concatenates positions, reordering selects hypothesis
rows (permuted, repeated, dropped), selecting sources leaves the hypothesis rows."""

from __future__ import annotations

import torch

from transduce.model.cache import DecoderCache, LayerCache


def test_append_concatenates_and_reorder_selects_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    cache = LayerCache()
    n, h, dk, dv = 4, 2, 3, 5
    k, v = torch.randn(n, h, 2, dk, generator=gen), torch.randn(n, h, 2, dv, generator=gen)
    assert cache.append(k, v) == (k, v)
    k2, v2 = torch.randn(n, h, 1, dk, generator=gen), torch.randn(n, h, 1, dv, generator=gen)
    out_k, out_v = cache.append(k2, v2)
    assert torch.equal(out_k, torch.cat([k, k2], 2)) and torch.equal(out_v, torch.cat([v, v2], 2))
    index = torch.tensor([3, 3, 0, 1, 1, 2])  # permuted, repeated, more rows (sentences -> beams)
    cache.reorder(index)
    assert torch.equal(cache.self_k, out_k[index]) and torch.equal(cache.self_v, out_v[index])
    cache.reorder(torch.tensor([5, 0]))  # fewer rows (finished hypotheses dropped)
    assert torch.equal(cache.self_k, out_k[index][[5, 0]])


def test_an_empty_cache_reorders_to_empty() -> None:
    cache = LayerCache()
    cache.reorder(torch.tensor([0, 0]))
    cache.select_sources(torch.tensor([0]))
    assert cache.self_k is None and cache.cross_k is None


def test_select_sources_leaves_hypothesis_rows() -> None:
    cache = DecoderCache(2)
    for layer in cache.layers:
        layer.cross_k = layer.cross_v = torch.arange(3.0)
        layer.append(torch.zeros(6, 1, 1, 1), torch.zeros(6, 1, 1, 1))
    cache.slots = torch.arange(6)
    cache.select_sources(torch.tensor([2, 0]))
    cache.reorder(torch.tensor([5, 4, 1, 0]))
    for layer in cache.layers:
        assert layer.cross_k.tolist() == [2.0, 0.0] and layer.self_k.size(0) == 4
    assert cache.slots.tolist() == [5, 4, 1, 0]
