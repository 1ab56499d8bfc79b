"""Training pairs stored end to end in two integer arrays, so a batch is read by array indexing.

``collate`` of a list of pairs walks every sentence in Python (about 6 ms for a 25,000-token
batch on a 2-core CPU); the Trainer does that on a thread beside the one that launches a
GPU's kernels, and the two take turns at Python's lock. ``FlatPairs`` keeps each side's ids
end to end with each pair's start, so that the ids of any batch come out of one gather
(``ids_of``), with no Python step per sentence (benchmarks/RESULTS.md).

Layout (N pairs): ``ids[side]`` (total,) int32, the side's ids of pair 0, pair 1, ... end to
end; ``starts[side]`` (N + 1,) int64, pair i's ids are ``ids[side][starts[i]:starts[i + 1]]``;
``rows`` (M,) int64 or None, the pairs of a view (``select``), numbers into the N.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from transduce.data.batching import Pair, spans

SIDES = ("src", "tgt")


def _end_to_end(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``seqs`` end to end as int32 ids, and the (len + 1,) int64 offsets of each one's start."""
    lens = np.fromiter((len(x) for x in seqs), dtype=np.int64, count=len(seqs))
    starts = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(starts[-1]))
    if len(ids) and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise ValueError("token ids must lie in 0 .. 2**31 - 1")
    return ids.astype(np.int32), starts


class ArrayPairs(Sequence[Pair]):
    """A sequence of (source ids, target ids) lists held in arrays, read one pair at a time by
    the subclass's ``_pair(k)`` (0 <= k < len); here indexing, slices and iteration."""

    def _pair(self, k: int) -> Pair:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> Pair: ...
    @overload
    def __getitem__(self, i: slice) -> list[Pair]: ...
    def __getitem__(self, i: int | slice) -> Pair | list[Pair]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"pair {i} of {n}")
        return self._pair(i % n)

    def __iter__(self) -> Iterator[Pair]:
        return (self[k] for k in range(len(self)))

    def _through(self, rows: np.ndarray, view: np.ndarray | None) -> np.ndarray:
        """Numbers of this sequence (int array) -> numbers of the stored pairs through ``view``
        (a view's rows, or None); an IndexError outside 0 .. len - 1, which numpy would wrap."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"pair numbers must lie in 0 .. {len(self) - 1}")
        return rows if view is None else view[rows]


class FlatPairs(ArrayPairs):
    """A sequence of (source ids, target ids) lists, like a list of pairs, stored flat (see the
    module docstring); ``ids_of`` reads many pairs' ids at once, ``model_lengths`` and
    ``select`` serve batching (``data.batching.length_index``, ``select_pairs``)."""

    def __init__(self, pairs: Sequence[Pair]) -> None:
        self.ids: dict[str, np.ndarray] = {}
        self.starts: dict[str, np.ndarray] = {}
        for k, side in enumerate(SIDES):
            self.ids[side], self.starts[side] = _end_to_end([p[k] for p in pairs])
        self.rows: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.starts["src"]) - 1

    def arrays(self) -> dict[str, np.ndarray]:
        """The stored pairs as four arrays (``src_ids``, ``src_starts``, ``tgt_ids``,
        ``tgt_starts``; see the module docstring), for ``from_arrays``; not of a view."""
        if self.rows is not None:
            raise ValueError("arrays() of a view: select's views share their pairs' arrays")
        return {
            f"{s}_{k}": d[s] for s in SIDES for k, d in (("ids", self.ids), ("starts", self.starts))
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> FlatPairs:
        """The pairs of ``arrays()``; a ValueError where the arrays do not describe pairs (a
        damaged file): missing, of other kinds, starts not rising from 0 to the ids' length,
        or the two sides of different counts."""
        flat = cls([])
        for s in SIDES:
            ids, starts = arrays.get(f"{s}_ids"), arrays.get(f"{s}_starts")
            if not isinstance(ids, np.ndarray) or not isinstance(starts, np.ndarray):
                raise ValueError(f"{s}_ids and {s}_starts must be arrays")
            if ids.ndim != 1 or starts.ndim != 1 or len(starts) == 0:
                raise ValueError(f"{s}_ids and {s}_starts must be non-empty 1-d arrays")
            if starts[0] != 0 or starts[-1] != len(ids) or (np.diff(starts) < 0).any():
                raise ValueError(f"{s}_starts must rise from 0 to the {len(ids)} ids")
            flat.ids[s], flat.starts[s] = ids.astype(np.int32), starts.astype(np.int64)
        if len(flat.starts["src"]) != len(flat.starts["tgt"]):
            raise ValueError("the two sides hold different numbers of pairs")
        return flat

    def _pair_numbers(self, rows: np.ndarray) -> np.ndarray:
        """Numbers of this view (int array) -> numbers into the stored pairs."""
        return self._through(rows, self.rows)

    def _pair(self, k: int) -> Pair:
        pair = int(self._pair_numbers(np.array([k]))[0])
        sides = [self.ids[s][self.starts[s][pair] : self.starts[s][pair + 1]] for s in SIDES]
        return sides[0].tolist(), sides[1].tolist()

    def ids_of(self, rows: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray]:
        """rows (B,) int, numbers of this view -> (the ``side`` ids of those pairs end to end,
        in that order, (total,) int64; each one's length (B,) int64)."""
        pairs = self._pair_numbers(rows)
        starts = self.starts[side]
        first = starts[pairs]  # (B,)
        lens = starts[pairs + 1] - first  # (B,)
        return self.ids[side][spans(first, lens)].astype(np.int64), lens

    def model_lengths(self) -> np.ndarray:
        """(N, 2) int32: (source + EOS, BOS + target) lengths, read from the offsets."""
        table = np.stack([np.diff(self.starts[s]) for s in SIDES], axis=1)  # (N_stored, 2)
        if self.rows is not None:
            table = table[self.rows]
        return table.astype(np.int32) + 1

    def select(self, rows: np.ndarray) -> FlatPairs:
        """A view of the pairs numbered ``rows`` (int array, numbers of this view), sharing
        the arrays."""
        view = object.__new__(FlatPairs)
        view.__dict__.update(self.__dict__)
        view.rows = self._pair_numbers(rows)
        return view


__all__ = ["ArrayPairs", "FlatPairs"]
