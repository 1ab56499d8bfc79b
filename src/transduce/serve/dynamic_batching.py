"""Dynamic batching for the translation server: concurrent requests share one batched
``translate`` call.

Requests are put on a queue served by one worker thread. The worker takes the oldest request, then
keeps collecting requests for up to ``batch_wait_ms`` (or until the next one would take the batch
over ``max_batch_sentences``; a larger request is never split and forms a batch of its own), and
translates the whole batch with one ``translate`` call per distinct ``DecodeConfig`` and ``Work``
(``transduce.serve.work``: n-best lists, scores, alignments, prefixes, forced-decoding scores,
attention), so concurrent clients share the model's batched decoding. A sampling request is
decoded alone: its samples depend on its seed and on the batch it is drawn in, so alone they
depend on the request only. With ``batch_wait_ms = 0`` the worker still takes
whatever is already waiting when it becomes free (no added latency); ``max_batch_sentences = 1``
serves one request at a time. If a batch fails, its requests are translated again one by one, so
only the request that fails gets the error.

A request whose future is cancelled (the server does so when its client disconnects) gives its
sentences back to the queue limit at once and is taken off the queue, so that the sentences the
queue holds stay within the limit however many clients go away; if the worker has started on it,
its translations are dropped (the requests batched with it are answered as usual). Requests still
queued when the worker stops fail with ``ShuttingDown``.

Which thread decodes matters on the CPU. PyTorch's OpenMP runtime (GNU libgomp) lets the workers
of a parallel region spin between regions only while no more OpenMP threads exist than CPUs;
once a second thread starts parallel regions besides the main thread, which loaded the model,
its workers sleep between regions and each region wakes them: small products and attention
calls, and so one sentence at a time, ran much slower on a worker thread than on the main thread
(benchmarks/RESULTS.md). So ``server.serve`` runs this
worker loop on the main thread (``keep_in_caller_thread`` then ``run``) and the HTTP server on a
thread of its own; ``start`` gives the loop a thread of its own (tests, embedding).

Plain Python (threads and asyncio futures); ``transduce.serve.server`` puts HTTP in front.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from transduce.config import DecodeConfig
from transduce.serve.work import Work, do_work

__all__ = ["BatchingConfig", "DynamicBatcher", "ServerBusy", "ShuttingDown", "TranslatorLike"]


class TranslatorLike(Protocol):
    """What the server needs of a ``Translator``: the decoding settings of a request (the
    model's with the request's replaced) and ``translate`` with them."""

    def decode_config(
        self, *, beam: int | None = ..., alpha: float | None = ...
    ) -> DecodeConfig: ...

    def translate(
        self, sentences: Sequence[str], decode: DecodeConfig | None = ...
    ) -> list[str]: ...


# a minute: longer makes no sense for a batch waiting for company, and past ~9.2e12 ms the
# worker's queue wait overflows (threading.TIMEOUT_MAX) and ended the server
MAX_BATCH_WAIT_MS = 60_000.0


@dataclass(frozen=True)
class BatchingConfig:
    """How the worker groups requests: at most ``max_batch_sentences`` sentences per batch (a
    bigger request is a batch alone), waiting at most ``batch_wait_ms`` for more requests after
    the first one of a batch arrives."""

    max_batch_sentences: int = 64
    batch_wait_ms: float = 5.0

    def __post_init__(self) -> None:
        if self.max_batch_sentences < 1:
            raise ValueError(
                f"max_batch_sentences must be at least 1; got {self.max_batch_sentences}"
            )
        if not 0 <= self.batch_wait_ms <= MAX_BATCH_WAIT_MS:  # NaN too
            raise ValueError(
                f"batch_wait_ms must be a number from 0 to {MAX_BATCH_WAIT_MS:g}; got "
                f"{self.batch_wait_ms}"
            )


@dataclass(eq=False)  # compared by identity: the queue removes this very job
class _Job:
    sentences: list[Any]  # sentences, or the pairs that ``work`` takes (``serve.work``)
    decode: DecodeConfig
    work: Work  # what is asked of each sentence (``serve.work``)
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.monotonic)
    resolved: bool = False


class ServerBusy(Exception):
    """More sentences are waiting than the queue limit allows."""


class ShuttingDown(RuntimeError):
    """The worker stopped (the server is shutting down) before translating the request."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down")


_STOP = object()


class DynamicBatcher:
    """One worker thread translating queued requests in batches (see the module docstring).

    ``submit`` is called from the event loop and returns an asyncio future resolved with the
    request's translations (or its exception). ``stats()`` gives counters for ``/health``.
    """

    def __init__(
        self,
        translator: TranslatorLike,
        batching: BatchingConfig = BatchingConfig(),
        *,
        max_queue_sentences: int = 8_192,
    ) -> None:
        self.translator = translator
        self.batching = batching
        self.max_queue_sentences = max_queue_sentences
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0  # sentences queued or being translated
        self._thread: threading.Thread | None = None
        self._caller_thread = False  # ``run`` drives the loop: ``start`` starts no thread
        self._stop_requested = False
        self._running = False
        self._finished = threading.Event()  # set when the loop returns
        self._stats = {
            "requests": 0,
            "sentences": 0,
            "batches": 0,
            "translate_calls": 0,
            "max_batch_requests": 0,
            "max_batch_sentences": 0,
            "failed_requests": 0,
            "cancelled_requests": 0,
        }

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Run the worker loop on a thread of its own (the app's lifespan calls this), unless
        ``keep_in_caller_thread`` said that ``run`` will."""
        with self._lock:
            if self._thread is not None or self._caller_thread:
                return
            self._stop_requested = False
            self._running = True  # alive from now on, before the thread gets going
            self._thread = threading.Thread(target=self.run, name="transduce-batcher", daemon=True)
        self._thread.start()

    def keep_in_caller_thread(self) -> None:
        """The loop will run in a thread of the caller's (``run``), not one that ``start``
        makes; requests queue until it does. Call it before the app starts."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the worker loop runs on a thread of its own already")
            self._caller_thread = True

    def run(self) -> None:
        """The worker loop, in the calling thread, until ``stop`` or ``request_stop`` (at once if
        one came first: the loop checks before each batch)."""
        self._finished.clear()
        self._running = True
        try:
            self._run()
        finally:
            self._running = False
            self._finished.set()

    def request_stop(self) -> None:
        """Ask the loop to end after the batch in progress, without waiting for it."""
        with self._lock:
            self._stop_requested = True
        self._queue.put(_STOP)  # wakes a loop waiting for requests

    def stop(self, timeout: float = 30.0) -> None:
        """End the loop after the batch in progress (waiting up to ``timeout`` seconds) and fail
        the requests still queued."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
        elif self._running:
            self._finished.wait(timeout)
        self._thread = None
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, _Job):
                self._resolve(job, None, ShuttingDown())
        if self._running:  # timed out mid-batch: the loop must still find the signal
            self._queue.put(_STOP)

    @property
    def alive(self) -> bool:
        """Whether requests get answered: the loop runs, or (``keep_in_caller_thread``) will."""
        return self._running or (self._caller_thread and not self._stop_requested)

    # -- requests ----------------------------------------------------------------------------
    def submit(
        self,
        sentences: list[Any],
        decode: DecodeConfig,
        nbest: int = 1,
        *,
        work: Work | None = None,
    ) -> asyncio.Future:
        """Queue one request (from the event loop), to be translated with ``decode``; raises
        ServerBusy over the queue limit, ShuttingDown once the worker was asked to stop. The
        future's result is one translation per sentence,
        or with ``nbest`` over 1 a list of up to ``nbest`` translations per sentence (the
        translator's ``translate_nbest``); with ``work``, what ``serve.work.do_work`` gives for
        it (``nbest`` then ignored).
        Cancelling the returned future withdraws the request (see the module docstring)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        job = _Job(sentences, decode, work or Work(nbest=nbest), future, loop)
        # a cancelled request frees its place in the queue limit now, not when the worker gets to it
        future.add_done_callback(lambda f: self._withdraw(job) if f.cancelled() else None)
        with self._lock:  # queued under the lock: ``stop`` drains no queue a job joins later
            if self._stop_requested:
                raise ShuttingDown
            if self._pending and self._pending + len(sentences) > self.max_queue_sentences:
                raise ServerBusy(
                    f"the server is busy ({self._pending} sentences waiting); try again later"
                )
            self._pending += len(sentences)
            self._queue.put(job)
        return future

    def _withdraw(self, job: _Job) -> None:
        with self._lock:
            if job.resolved:
                return
            job.resolved = True
            self._pending -= len(job.sentences)
            self._stats["cancelled_requests"] += 1
        self._unqueue(job)

    def _unqueue(self, job: _Job) -> None:
        """Take ``job`` off the queue if the worker has not taken it: a withdrawn job left there
        would hold its sentences, uncounted, until the worker got to it."""
        with self._queue.mutex, contextlib.suppress(ValueError):  # taken already
            self._queue.queue.remove(job)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self._stats, "pending_sentences": self._pending}

    # -- the worker --------------------------------------------------------------------------
    def _run(self) -> None:
        carry: _Job | None = None
        try:
            while not self._stop_requested:
                first = carry if carry is not None else self._queue.get()
                carry = None
                if first is _STOP:
                    return
                jobs, carry, stop = self._collect(first)
                try:
                    self._translate(jobs)
                except Exception as e:  # noqa: BLE001 - a bug here must not strand the requests
                    for job in jobs:
                        self._resolve(job, None, e)
                if stop:
                    return
        finally:
            if carry is not None:  # taken from the queue, not translated
                self._resolve(carry, None, ShuttingDown())

    def _collect(self, first: _Job) -> tuple[list[_Job], _Job | None, bool]:
        """The jobs of one batch starting with ``first``, the job that did not fit (kept for the
        next batch) and whether the stop signal arrived."""
        jobs = [first]
        n = len(first.sentences)
        deadline = time.monotonic() + self.batching.batch_wait_ms / 1000.0
        while n < self.batching.max_batch_sentences:
            remaining = deadline - time.monotonic()
            try:
                if remaining > 0:
                    job = self._queue.get(timeout=remaining)
                else:
                    job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                return jobs, None, True
            if job.resolved:  # withdrawn while queued: takes no room in the batch
                continue
            if n + len(job.sentences) > self.batching.max_batch_sentences:
                return jobs, job, False
            jobs.append(job)
            n += len(job.sentences)
        return jobs, None, False

    def _translate(self, jobs: list[_Job]) -> None:
        jobs = [job for job in jobs if not job.resolved]  # withdrawn (cancelled): no decoding
        if not jobs:
            return
        groups: dict[tuple[DecodeConfig, Work, int], list[_Job]] = {}
        for job in jobs:  # sampling: alone (see the module docstring)
            alone = id(job) if job.decode.sampling else 0
            groups.setdefault((job.decode, job.work, alone), []).append(job)
        n_sentences = sum(len(j.sentences) for j in jobs)
        with self._lock:
            s = self._stats
            s["batches"] += 1
            s["requests"] += len(jobs)
            s["sentences"] += n_sentences
            s["max_batch_requests"] = max(s["max_batch_requests"], len(jobs))
            s["max_batch_sentences"] = max(s["max_batch_sentences"], n_sentences)
        for (decode, work, _), group in groups.items():
            try:
                out = self._call([s for j in group for s in j.sentences], decode, work)
            except Exception as e:  # noqa: BLE001 - answered as a 500, the server goes on
                if len(group) == 1:
                    self._resolve(group[0], None, e)
                    continue
                for job in group:  # find the request(s) that fail; the others get answers
                    try:
                        self._resolve(job, self._call(job.sentences, decode, work), None)
                    except Exception as e1:  # noqa: BLE001
                        self._resolve(job, None, e1)
                continue
            start = 0
            for job in group:
                end = start + len(job.sentences)
                self._resolve(job, out[start:end], None)
                start = end

    def _call(self, sentences: list[Any], decode: DecodeConfig, work: Work) -> list[Any]:
        with self._lock:
            self._stats["translate_calls"] += 1
        out = do_work(self.translator, sentences, decode, work)
        if len(out) != len(sentences):
            raise RuntimeError(f"{len(sentences)} sentences gave {len(out)} translations")
        return out

    def _resolve(self, job: _Job, result: list[Any] | None, error: BaseException | None) -> None:
        with self._lock:
            if job.resolved:
                return
            job.resolved = True
            self._pending -= len(job.sentences)
            if error is not None:
                self._stats["failed_requests"] += 1

        def settle() -> None:
            if job.future.done():  # the client went away
                return
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the event loop is closed
            job.loop.call_soon_threadsafe(settle)
