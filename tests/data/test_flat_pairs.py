"""FlatPairs: the same pairs as the list they were made from, and the same batches read from them
as ``collate`` makes of the list (the Trainer's reader takes the flat way for lists)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from transduce.config import TrainConfig
from transduce.data.batching import group_reader, length_index, select_pairs, token_batch_arrays
from transduce.data.flat_pairs import FlatPairs
from transduce.training import distributed
from transduce.training.feed import BatchFeed


def random_pairs(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Pairs of 0-30 ids each (empty sides included), ids up to a large vocabulary's."""
    rng = random.Random(seed)

    def side() -> list[int]:
        return [rng.randrange(4, 60_000) for _ in range(rng.choice([0, 1, 2, 5, 17, 30]))]

    return [(side(), side()) for _ in range(n)]


def test_flat_pairs_read_as_the_list() -> None:
    pairs = random_pairs(300)
    flat = FlatPairs(pairs)
    assert len(flat) == 300 and list(flat) == pairs
    assert flat[0] == pairs[0] and flat[-1] == pairs[-1] and flat[5:9] == pairs[5:9]
    assert isinstance(flat[3][0], list) and all(isinstance(x, int) for x in flat[3][0])
    with pytest.raises(IndexError):
        flat[300]
    np.testing.assert_array_equal(flat.model_lengths(), length_index(pairs))
    assert len(FlatPairs([])) == 0 and FlatPairs([]).model_lengths().shape == (0, 2)


def test_views_select_as_lists_do() -> None:
    pairs = random_pairs(200, seed=1)
    flat = FlatPairs(pairs)
    rows = np.array([7, 3, 3, 150, 0, 199])
    view = select_pairs(flat, rows)
    assert isinstance(view, FlatPairs)
    want = select_pairs(pairs, rows)
    assert list(view) == want and view[-1] == want[-1]
    np.testing.assert_array_equal(view.model_lengths(), length_index(want))
    inner = select_pairs(view, np.array([5, 0]))  # a view of a view: numbers of the view
    assert list(inner) == [want[5], want[0]]
    ids, lens = view.ids_of(np.array([], dtype=np.int64), "tgt")
    assert ids.shape == (0,) and lens.shape == (0,)
    for bad in ([-1], [6], [0, 200]):  # numpy indexing would wrap -1 to the last pair
        with pytest.raises(IndexError, match="pair numbers"):
            view.ids_of(np.array(bad), "src")
    with pytest.raises(IndexError, match="pair numbers"):
        select_pairs(flat, np.array([-1]))


@pytest.mark.parametrize("pad_multiple,update_freq", [(1, 1), (8, 2)])
def test_batches_read_from_flat_pairs_equal_the_lists(pad_multiple: int, update_freq: int) -> None:
    pairs = [p for p in random_pairs(500, seed=2) if p[0] and p[1]]  # training skips empty sides
    batches = token_batch_arrays(
        length_index(pairs), 400, seed=3, epoch=1, pad_multiple=pad_multiple
    )
    flat, listed = (
        group_reader(p, batches, update_freq, pin=False, pad_multiple=pad_multiple)
        for p in (FlatPairs(pairs), pairs)
    )
    for first in range(0, len(batches), update_freq):
        for a, b in zip(flat(first), listed(first), strict=True):
            assert a.n_tokens == b.n_tokens
            for x, y in zip(a[:3], b[:3], strict=True):
                assert x.dtype == y.dtype == torch.int64 and torch.equal(x, y)


def test_ids_beyond_int32_are_refused() -> None:
    with pytest.raises(ValueError, match="2\\*\\*31"):
        FlatPairs([([2**31], [5])])


def test_the_feed_stores_lists_flat() -> None:
    pairs = random_pairs(100, seed=4)
    t = TrainConfig(max_len=20, max_tokens=200)
    feed = BatchFeed(pairs, t, distributed.World())
    kept = [p for p in pairs if max(len(p[0]), len(p[1])) + 1 <= 20]
    assert isinstance(feed.pairs, FlatPairs) and list(feed.pairs) == kept
    assert feed.n_filtered == len(pairs) - len(kept)


def test_collate_flat_takes_lengths_of_any_integer_type() -> None:
    """Unsigned lengths (a uint32 prepared folder's) would mix with int64 into float indices."""
    from transduce.data.batching import collate, collate_flat

    ids = np.array([5, 6, 7], dtype=np.int64)
    batch = collate_flat(
        (ids, np.array([3], dtype=np.uint32)), (ids[:1], np.array([1], dtype=np.uint32)), 8
    )
    want = collate([([5, 6, 7], [5])], 8)
    assert all(torch.equal(a, b) for a, b in zip(batch[:3], want[:3], strict=True))


def test_arrays_give_back_the_same_pairs_and_damaged_ones_are_refused() -> None:
    pairs = [([5, 6], [7]), ([], [8, 9, 10]), ([11], [])]
    flat = FlatPairs(pairs)
    arrays = flat.arrays()
    assert list(FlatPairs.from_arrays(arrays)) == pairs
    with pytest.raises(ValueError, match="a view"):
        flat.select(np.array([0])).arrays()
    short = {**arrays, "src_starts": arrays["src_starts"][:-1]}
    with pytest.raises(ValueError, match="src_starts must rise from 0 to the 3 ids"):
        FlatPairs.from_arrays(short)
    with pytest.raises(ValueError, match="different numbers of pairs"):
        FlatPairs.from_arrays(
            {**arrays, "tgt_ids": arrays["tgt_ids"][:0], "tgt_starts": np.zeros(1)}
        )
    with pytest.raises(ValueError, match="tgt_ids and tgt_starts must be arrays"):
        FlatPairs.from_arrays({k: v for k, v in arrays.items() if k != "tgt_ids"})
