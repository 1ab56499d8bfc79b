"""The server's dynamic batching, without HTTP: batches formed in order, grouped by DecodeConfig
(and n-best size), the queue limit, and the batching settings checked."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref

import pytest

from transduce.config import DecodeConfig
from transduce.serve.dynamic_batching import (
    BatchingConfig,
    DynamicBatcher,
    ServerBusy,
)

TIMEOUT = 60.0  # seconds
GREEDY, BEAM_2, DEFAULT = DecodeConfig(beam=1), DecodeConfig(beam=2), DecodeConfig()


class Recorder:
    """A translator that upper-cases and records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def translate(self, sentences, decode=None):
        self.calls.append((tuple(sentences), decode))
        return [s.upper() for s in sentences]


def test_batcher_groups_by_decode_config() -> None:
    recorder = Recorder()
    batcher = DynamicBatcher(recorder, BatchingConfig(max_batch_sentences=5, batch_wait_ms=20))

    async def scenario() -> list:
        futures = [
            batcher.submit(["a"], GREEDY),
            batcher.submit(["b", "c"], BEAM_2),
            batcher.submit(["d"], DecodeConfig(beam=1)),
            batcher.submit(["e", "f"], GREEDY),
        ]
        batcher.start()  # all four are queued: they form batches in order
        return await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT)

    try:
        results = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert results == [["A"], ["B", "C"], ["D"], ["E", "F"]]
    # batch 1 = a, b c, d (4 sentences; e f would make 6 > 5), grouped by beam; batch 2 = e f
    assert recorder.calls == [(("a", "d"), GREEDY), (("b", "c"), BEAM_2), (("e", "f"), GREEDY)]
    stats = batcher.stats()
    assert (stats["batches"], stats["requests"], stats["max_batch_requests"]) == (2, 4, 3)
    assert stats["pending_sentences"] == 0


class NBestRecorder(Recorder):
    """Also gives n-best lists: the sentence upper-cased, then lower-cased, ... (n of them)."""

    def translate_nbest(self, sentences, nbest, decode=None):
        self.calls.append((tuple(sentences), decode, nbest))
        return [
            [_Hyp(s.upper() if i % 2 == 0 else s.lower()) for i in range(nbest)] for s in sentences
        ]


class _Hyp:
    def __init__(self, text: str) -> None:
        self.text = text


def test_nbest_requests_are_grouped_apart() -> None:
    recorder = NBestRecorder()
    batcher = DynamicBatcher(recorder, BatchingConfig(max_batch_sentences=8, batch_wait_ms=20))

    async def scenario() -> list:
        futures = [
            batcher.submit(["a"], GREEDY),
            batcher.submit(["b"], GREEDY, nbest=2),
            batcher.submit(["c"], GREEDY),
            batcher.submit(["d", "e"], GREEDY, nbest=2),
        ]
        batcher.start()
        return await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT)

    try:
        results = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert results == [["A"], [["B", "b"]], ["C"], [["D", "d"], ["E", "e"]]]
    assert recorder.calls == [(("a", "c"), GREEDY), (("b", "d", "e"), GREEDY, 2)]


def test_the_loop_can_run_in_a_thread_of_the_caller_s() -> None:
    # what server.serve does on the main thread; here a thread stands in for it
    recorder = Recorder()
    batcher = DynamicBatcher(recorder, BatchingConfig(batch_wait_ms=0))
    batcher.keep_in_caller_thread()
    batcher.start()  # the app's lifespan: starts no thread now
    assert batcher.alive  # requests queue until the caller runs the loop
    caller = threading.Thread(target=batcher.run)

    async def scenario() -> list:
        late = batcher.submit(["x"], DEFAULT)  # queued before the loop runs: served later
        caller.start()
        first = await asyncio.wait_for(late, TIMEOUT)
        assert batcher.alive
        second = await asyncio.wait_for(batcher.submit(["y"], DEFAULT), TIMEOUT)
        return [first, second]

    try:
        assert asyncio.run(scenario()) == [["X"], ["Y"]]
    finally:
        batcher.stop(timeout=TIMEOUT)
    caller.join(TIMEOUT)
    assert not caller.is_alive() and not batcher.alive
    assert [call[0] for call in recorder.calls] == [("x",), ("y",)]


class Slow(Recorder):
    """Takes ``seconds`` for every call."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def translate(self, sentences, decode=None):
        time.sleep(self.seconds)
        return super().translate(sentences, decode)


def test_a_stop_that_times_out_still_ends_the_loop_and_fails_the_queue() -> None:
    batcher = DynamicBatcher(Slow(0.5), BatchingConfig(max_batch_sentences=1, batch_wait_ms=0))

    async def scenario() -> list:
        first, second = batcher.submit(["a"], DEFAULT), batcher.submit(["b"], DEFAULT)
        batcher.start()
        await asyncio.sleep(0.1)  # the worker is inside the first (0.5 s) batch
        stopper = asyncio.get_running_loop().run_in_executor(None, batcher.stop, 0.05)
        await stopper
        return await asyncio.wait_for(
            asyncio.gather(first, second, return_exceptions=True), TIMEOUT
        )

    first, second = asyncio.run(scenario())
    assert first == ["A"]  # the batch in progress is finished
    assert isinstance(second, RuntimeError) and "shutting down" in str(second)
    deadline = time.monotonic() + TIMEOUT
    while batcher.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not batcher.alive


def test_a_stop_before_the_caller_runs_the_loop_ends_it_at_once() -> None:
    batcher = DynamicBatcher(Recorder())
    batcher.keep_in_caller_thread()
    batcher.stop(timeout=TIMEOUT)
    assert not batcher.alive
    caller = threading.Thread(target=batcher.run)
    caller.start()
    caller.join(TIMEOUT)
    assert not caller.is_alive()


def test_a_loop_on_its_own_thread_cannot_move_to_the_caller_s() -> None:
    batcher = DynamicBatcher(Recorder())
    batcher.start()
    try:
        assert batcher.alive
        with pytest.raises(RuntimeError, match="thread of its own"):
            batcher.keep_in_caller_thread()
    finally:
        batcher.stop(timeout=TIMEOUT)
    assert not batcher.alive


def test_queue_limit_refuses_new_requests_until_the_queue_drains() -> None:
    batcher = DynamicBatcher(Recorder(), BatchingConfig(batch_wait_ms=0), max_queue_sentences=3)

    async def scenario() -> list:
        first = batcher.submit(["a", "b"], DEFAULT)  # queued, the worker not started yet
        with pytest.raises(ServerBusy, match="2 sentences waiting"):
            batcher.submit(["c", "d"], DEFAULT)
        batcher.start()
        done = await asyncio.wait_for(first, TIMEOUT)
        again = await asyncio.wait_for(batcher.submit(["c", "d"], DEFAULT), TIMEOUT)
        return [done, again]

    try:
        assert asyncio.run(scenario()) == [["A", "B"], ["C", "D"]]
    finally:
        batcher.stop()
    assert batcher.stats()["pending_sentences"] == 0


def test_a_cancelled_request_frees_its_place_at_once_and_is_not_translated() -> None:
    recorder = Recorder()
    batcher = DynamicBatcher(recorder, BatchingConfig(batch_wait_ms=0), max_queue_sentences=3)

    async def scenario() -> list:
        kept = batcher.submit(["a"], DEFAULT)  # queued, the worker not started yet
        gone = batcher.submit(["b", "c"], DEFAULT)
        with pytest.raises(ServerBusy):
            batcher.submit(["d"], DEFAULT)
        gone.cancel()  # its client went away
        await asyncio.sleep(0)  # the done callback runs
        assert batcher.stats()["pending_sentences"] == 1
        later = batcher.submit(["d", "e"], DEFAULT)  # its place is free
        batcher.start()
        return await asyncio.wait_for(asyncio.gather(kept, later), TIMEOUT)

    try:
        assert asyncio.run(scenario()) == [["A"], ["D", "E"]]
    finally:
        batcher.stop()
    assert all("b" not in call[0] for call in recorder.calls)
    stats = batcher.stats()
    assert (stats["cancelled_requests"], stats["failed_requests"], stats["requests"]) == (1, 0, 2)
    assert stats["pending_sentences"] == 0


def test_a_request_larger_than_the_queue_limit_is_taken_when_the_queue_is_empty() -> None:
    batcher = DynamicBatcher(Recorder(), BatchingConfig(), max_queue_sentences=2)

    async def scenario() -> list[str]:
        batcher.start()
        return await asyncio.wait_for(batcher.submit(["x", "y", "z"], DEFAULT), TIMEOUT)

    try:
        assert asyncio.run(scenario()) == ["X", "Y", "Z"]
    finally:
        batcher.stop()


def test_batching_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch_sentences"):
        BatchingConfig(max_batch_sentences=0)
    with pytest.raises(ValueError, match="batch_wait_ms"):
        BatchingConfig(batch_wait_ms=-1)
    with pytest.raises(ValueError, match="batch_wait_ms"):
        BatchingConfig(batch_wait_ms=float("nan"))
    with pytest.raises(ValueError, match="batch_wait_ms must be a number from 0 to 60000"):
        BatchingConfig(batch_wait_ms=1e13)  # the worker's wait overflowed, ending the server


class Gated(Recorder):
    """Holds every call until ``gate`` is set; ``entered`` is set once a call holds."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.entered = threading.Event(), threading.Event()

    def translate(self, sentences, decode=None):
        self.entered.set()
        assert self.gate.wait(TIMEOUT)
        return super().translate(sentences, decode)


class Sentence:
    """A sentence that tells (by a weak reference) whether anything still holds it."""


def test_withdrawn_requests_leave_the_queue_while_the_worker_is_busy() -> None:
    # 50 clients that went away while the worker was busy: their sentences are not kept in the
    # queue until the worker gets to them, past max_queue_sentences
    gated = Gated()
    batcher = DynamicBatcher(gated, BatchingConfig(batch_wait_ms=0), max_queue_sentences=3)

    async def scenario() -> tuple[list, list]:
        batcher.start()
        busy = batcher.submit(["a"], DEFAULT)
        await asyncio.get_running_loop().run_in_executor(None, gated.entered.wait, TIMEOUT)
        refs = []
        for _ in range(50):
            sentences = [Sentence(), Sentence()]
            refs += [weakref.ref(s) for s in sentences]
            batcher.submit(sentences, DEFAULT).cancel()  # within the limit: 1 + 2 <= 3
            del sentences
            await asyncio.sleep(0)  # the done callback runs
        gc.collect()
        held = [r for r in refs if r() is not None]
        later = batcher.submit(["b", "c"], DEFAULT)
        gated.gate.set()
        return held, await asyncio.wait_for(asyncio.gather(busy, later), TIMEOUT)

    try:
        held, answers = asyncio.run(scenario())
    finally:
        gated.gate.set()
        batcher.stop()
    assert held == [], f"{len(held)} sentences of withdrawn requests still held"
    assert answers == [["A"], ["B", "C"]]
    stats = batcher.stats()
    assert (stats["cancelled_requests"], stats["pending_sentences"]) == (50, 0)
