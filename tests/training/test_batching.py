"""Token batching (coverage, budget, determinism, low padding) and collation."""

import random

import numpy as np
import pytest
import torch

from transduce.data.batching import Batch, collate, model_lengths, padded_lengths, token_batches
from transduce.data.vocab import BOS, EOS, PAD


def _lengths(n: int = 400, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(2, 30), rng.randint(2, 30)) for _ in range(n)]


def _cost(batch: list[int], lengths: list[tuple[int, int]]) -> int:
    return len(batch) * max(max(lengths[i]) for i in batch)


@pytest.mark.parametrize("shuffle", [True, False])
def test_every_example_once_and_within_budget(shuffle: bool) -> None:
    lengths = _lengths()
    lengths[5] = (200, 3)  # longer than the budget: a batch of its own
    max_tokens = 120
    for epoch in range(3):
        batches = token_batches(lengths, max_tokens, seed=7, epoch=epoch, shuffle=shuffle)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(len(lengths)))
        for b in batches:
            assert b, "empty batch"
            assert _cost(b, lengths) <= max_tokens or len(b) == 1
        assert [5] in batches


def test_batches_are_reasonably_full() -> None:
    lengths = _lengths()
    batches = token_batches(lengths, 200, seed=1, epoch=0)
    # Sorted by length, most batches could not take one more example of their length.
    avg_cost = sum(_cost(b, lengths) for b in batches) / len(batches)
    assert avg_cost > 0.7 * 200


def test_same_seed_and_epoch_same_batches() -> None:
    lengths = _lengths()
    a = token_batches(lengths, 150, seed=3, epoch=2)
    b = token_batches(lengths, 150, seed=3, epoch=2)
    assert a == b
    c = token_batches(lengths, 150, seed=3, epoch=3)
    assert c != a
    d = token_batches(lengths, 150, seed=4, epoch=2)
    assert d != a


def test_no_shuffle_is_sorted_and_epoch_independent() -> None:
    lengths = _lengths()
    a = token_batches(lengths, 150, seed=3, epoch=0, shuffle=False)
    assert a == token_batches(lengths, 150, seed=9, epoch=5, shuffle=False)
    keys = [(lengths[i][1], lengths[i][0]) for b in a for i in b]
    assert keys == sorted(keys)


def _padding_fraction(batches: list[list[int]], lengths: list[tuple[int, int]]) -> float:
    real = padded = 0
    for b in batches:
        s, t = max(lengths[i][0] for i in b), max(lengths[i][1] for i in b)
        real += sum(lengths[i][0] + lengths[i][1] for i in b)
        padded += len(b) * (s + t)
    return 1 - real / padded


def test_less_padding_than_random_batches() -> None:
    lengths = _lengths(n=1000, seed=5)
    batches = token_batches(lengths, 240, seed=0, epoch=0)
    rng = random.Random(0)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    sizes = [len(b) for b in batches]
    random_batches, start = [], 0
    for size in sizes:  # same batch sizes, random membership
        random_batches.append(order[start : start + size])
        start += size
    ours, theirs = _padding_fraction(batches, lengths), _padding_fraction(random_batches, lengths)
    assert ours < 0.5 * theirs, (ours, theirs)


def test_collate() -> None:
    pairs = [([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14]), ([4, 4], [])]
    b = collate(pairs)
    assert isinstance(b, Batch)
    assert b.src.tolist() == [[5, 6, 7, EOS], [10, EOS, PAD, PAD], [4, 4, EOS, PAD]]
    assert b.tgt_in.tolist() == [
        [BOS, 8, 9, PAD, PAD],
        [BOS, 11, 12, 13, 14],
        [BOS, PAD, PAD, PAD, PAD],
    ]
    assert b.tgt_out.tolist() == [
        [8, 9, EOS, PAD, PAD],
        [11, 12, 13, 14, EOS],
        [EOS, PAD, PAD, PAD, PAD],
    ]
    assert b.n_tokens == 3 + 5 + 1
    assert b.n_tokens == int((b.tgt_out != PAD).sum())
    for t in (b.src, b.tgt_in, b.tgt_out):
        assert t.dtype == torch.long


def _random_pairs(rng: random.Random, n: int, longest: int) -> list[tuple[list[int], list[int]]]:
    def ids() -> list[int]:
        return [rng.randint(4, 20) for _ in range(rng.randint(0, longest))]

    return [(ids(), ids()) for _ in range(n)]


def test_collate_properties_random() -> None:
    pairs = _random_pairs(random.Random(11), 17, longest=9)
    b = collate(pairs)
    assert b.src.shape == (17, max(len(s) for s, _ in pairs) + 1)
    assert b.tgt_in.shape == b.tgt_out.shape == (17, max(len(t) for _, t in pairs) + 1)
    for row, (s, t) in enumerate(pairs):
        src = b.src[row].tolist()
        assert src[: len(s) + 1] == [*s, EOS] and set(src[len(s) + 1 :]) <= {PAD}
        tin, tout = b.tgt_in[row].tolist(), b.tgt_out[row].tolist()
        n = len(t) + 1
        assert tin[0] == BOS and tout[n - 1] == EOS
        assert tin[1:n] == tout[: n - 1] == t
        assert set(tin[n:]) <= {PAD} and set(tout[n:]) <= {PAD}
    assert b.n_tokens == sum(len(t) + 1 for _, t in pairs)
    assert model_lengths(pairs) == [(len(s) + 1, len(t) + 1) for s, t in pairs]


def test_batch_to_keeps_n_tokens() -> None:
    b = collate([([5], [6, 7])])
    moved = b.to("cpu")
    assert moved.n_tokens == b.n_tokens == 3
    assert torch.equal(moved.src, b.src)


def test_pad_multiple_rounds_each_side_up_and_keeps_the_contents() -> None:
    pairs = _random_pairs(random.Random(3), 9, longest=20)
    plain, padded = collate(pairs), collate(pairs, pad_multiple=8)
    for a, b in zip(plain[:3], padded[:3], strict=True):
        assert b.shape[1] % 8 == 0 and a.shape[1] <= b.shape[1] < a.shape[1] + 8
        assert torch.equal(b[:, : a.shape[1]], a) and bool((b[:, a.shape[1] :] == PAD).all())
    assert padded.n_tokens == plain.n_tokens
    assert collate([([5] * 6, [6] * 15)], pad_multiple=8).src.shape == (1, 8)  # 7 -> 8
    assert collate([([5] * 7, [6] * 15)], pad_multiple=8).tgt_in.shape == (1, 16)  # 16 stays


def test_pad_multiple_budgets_the_padded_lengths() -> None:
    lengths = _lengths(n=500, seed=4)
    rounded = [tuple(int(n) for n in padded_lengths(torch.tensor(p).numpy(), 8)) for p in lengths]
    assert rounded[:3] != lengths[:3] and all(r % 8 == 0 for p in rounded for r in p)
    batches = token_batches(lengths, 160, seed=2, epoch=1, pad_multiple=8)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(_cost(b, rounded) <= 160 for b in batches)  # as collate will pad them
    assert batches == token_batches(rounded, 160, seed=2, epoch=1)


def _collate_row_by_row(pairs: list[tuple[list[int], list[int]]], multiple: int) -> Batch:
    """The reference: each row written on its own, as collate once did."""
    longest = np.array([max(len(s) for s, _ in pairs) + 1, max(len(t) for _, t in pairs) + 1])
    s_len, t_len = padded_lengths(longest, multiple).tolist()
    src = torch.full((len(pairs), s_len), PAD, dtype=torch.long)
    tgt_in = torch.full((len(pairs), t_len), PAD, dtype=torch.long)
    tgt_out = torch.full((len(pairs), t_len), PAD, dtype=torch.long)
    for row, (s, t) in enumerate(pairs):
        src[row, : len(s) + 1] = torch.tensor([*s, EOS])
        tgt_in[row, : len(t) + 1] = torch.tensor([BOS, *t])
        tgt_out[row, : len(t) + 1] = torch.tensor([*t, EOS])
    return Batch(src, tgt_in, tgt_out, sum(len(t) + 1 for _, t in pairs))


def test_collate_equals_writing_each_row() -> None:
    """collate builds a batch with a few array operations: the same tensors as writing each
    row, for lists, tuples and arrays, empty sides, one pair, and both pad multiples."""
    rng = random.Random(5)
    for trial in range(200):
        pairs = _random_pairs(rng, rng.randint(1, 25), longest=rng.choice([1, 9, 40]))
        given: list = pairs
        if trial % 3 == 1:
            given = [(tuple(s), tuple(t)) for s, t in pairs]
        elif trial % 3 == 2:
            given = [(np.array(s, dtype=np.int32), np.array(t, dtype=np.int64)) for s, t in pairs]
        multiple = rng.choice([1, 8])
        ours, ref = collate(given, multiple), _collate_row_by_row(pairs, multiple)
        for a, b in zip(ours[:3], ref[:3], strict=True):
            assert a.dtype == torch.long and torch.equal(a, b), (trial, a, b)
        assert ours.n_tokens == ref.n_tokens and isinstance(ours.n_tokens, int)
    big = [([70_000] * 3, [2**40])]  # ids past 16 and 32 bits kept
    assert collate(big).src.tolist() == [[70_000] * 3 + [EOS]]
    assert collate(big).tgt_out.tolist() == [[2**40, EOS]]
