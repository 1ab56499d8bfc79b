"""ReadAhead: the next item is read on another thread while the caller works, and what the caller
gets is exactly what a synchronous read gives, errors included."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from transduce.data.batching import collate, group_reader
from transduce.data.read_ahead import ReadAhead


def test_reads_the_next_key_ahead_on_another_thread() -> None:
    threads: dict[int, str] = {}
    read_two = threading.Event()

    def read(key: int) -> int:
        threads[key] = threading.current_thread().name
        if key == 2:
            read_two.set()
        return key * 10

    with ReadAhead(read) as reader:
        assert reader.get(1, 2) == 10  # nothing ahead yet: read here
        assert read_two.wait(timeout=10)  # key 2 is read before anyone asks for it
        assert threads[1] == threading.current_thread().name
        assert threads[2] != threading.current_thread().name
        assert reader.get(2, None) == 20
    assert sorted(threads) == [1, 2]


def test_a_key_other_than_the_one_read_ahead_is_read_now() -> None:
    calls: list[int] = []

    def read(key: int) -> int:
        calls.append(key)
        return key * 10

    with ReadAhead(read) as reader:
        assert reader.get(0, 1) == 0
        assert reader.get(5, None) == 50  # 1 was read ahead; 5 was asked (a resume, say)
    assert 5 in calls


def test_an_error_while_reading_ahead_surfaces_at_its_key() -> None:
    def read(key: int) -> int:
        if key == 1:
            raise ValueError("shard 3 is truncated")
        return key

    with ReadAhead(read) as reader:
        assert reader.get(0, 1) == 0  # key 1 fails on the thread: not raised yet
        with pytest.raises(ValueError, match="shard 3 is truncated"):
            reader.get(1, None)


def test_read_ahead_gives_the_synchronous_batches() -> None:
    rng = np.random.default_rng(0)
    pairs = [
        (
            rng.integers(4, 50, size=rng.integers(1, 9)).tolist(),
            rng.integers(4, 50, size=rng.integers(1, 9)).tolist(),
        )
        for _ in range(40)
    ]
    batches = [np.arange(i, min(i + 3, 40)) for i in range(0, 40, 3)]
    read = group_reader(pairs, batches, update_freq=2, pin=False)
    starts = list(range(0, len(batches), 2))
    with ReadAhead(read) as reader:
        got = [reader.get(s, n) for s, n in zip(starts, [*starts[1:], None], strict=True)]
    for start, group in zip(starts, got, strict=True):
        expected = [collate([pairs[i] for i in b.tolist()]) for b in batches[start : start + 2]]
        assert len(group) == len(expected)
        for g, e in zip(group, expected, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(g[:3], e[:3], strict=True))
            assert g.n_tokens == e.n_tokens


def test_start_reads_a_key_ahead_that_get_then_takes() -> None:
    calls: list[int] = []
    done = threading.Event()

    def read(key: int) -> int:
        calls.append(key)
        done.set()
        return key * 10

    with ReadAhead(read) as reader:
        assert reader.get(0, None) == 0  # nothing started after it
        assert calls == [0]
        reader.start(1)
        assert done.wait(timeout=10)
        reader.start(1)  # already being read: not read twice
        assert reader.get(1, None) == 10
    assert calls == [0, 1]
