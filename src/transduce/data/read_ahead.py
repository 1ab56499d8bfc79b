"""Reading the next batches while the current step runs: one background thread, one item ahead.

A training step spends its time in PyTorch's kernels, which release the GIL; reading a batch's
pairs (from lists, or from a prepared dataset's memory-mapped shards: page faults on a cold
cache) and padding them into tensors is Python work that can run beside it. ``ReadAhead`` keeps
the order and the values exactly as a synchronous read would give them (reading draws no random
numbers), so exact resume and the step-for-step equality of runs are untouched; an error raised
while reading surfaces in the caller, at the item it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """``read(key)`` for the key asked now, while ``read(next_key)`` runs on a background thread.

    ``get(key, next_key)`` returns ``read(key)`` (the one read ahead when it was for ``key``, else
    read now) and starts reading ``next_key`` (None: nothing more to read, or not yet: ``start``
    begins a read later).
    """

    def __init__(self, read: Callable[[int], T]) -> None:
        self._read = read
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transduce-read-ahead")
        self._pending: tuple[int, Future[T]] | None = None
        self._closed = False

    def get(self, key: int, next_key: int | None) -> T:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == key:
            item = pending[1].result()  # re-raises what the read raised
        else:
            if pending is not None:
                pending[1].cancel()
            item = self._read(key)
        if next_key is not None:
            self.start(next_key)
        return item

    def start(self, key: int) -> None:
        """Begin reading ``key`` on the background thread, for a ``get(key, ...)`` to come (a
        read of another key pending is dropped); nothing once closed."""
        if self._closed or (self._pending is not None and self._pending[0] == key):
            return
        if self._pending is not None:
            self._pending[1].cancel()
        self._pending = (key, self._pool.submit(self._read, key))

    def close(self) -> None:
        """Drop what was read ahead; the thread ends once its current read does."""
        self._pending, self._closed = None, True
        self._pool.shutdown(wait=False, cancel_futures=True)  # a read not yet started is dropped

    def __enter__(self) -> ReadAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ReadAhead"]
