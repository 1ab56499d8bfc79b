"""``train.compile``: the model's forward under ``torch.compile`` while it trains.

The module is compiled in place (``nn.Module.compile``: its ``__call__`` goes through the
compiled function), so its parameters, its ``state_dict`` keys (no ``_orig_mod.`` prefix) and
the checkpoints stay those of the plain model: a run may resume with compile switched on or off.
Under DistributedDataParallel the DDP wrapper is what gets compiled, as the torch docs advise
(compile after the wrap: Dynamo's DDPOptimizer then cuts the graph at the gradient buckets, so
the all-reduce still overlaps the backward). Validation runs the plain forward
(``CompiledForward.eager``): eval mode and its shapes would each be graphs of their own.

Compiling is lazy: the first update pays for it (forward and backward), and a new batch shape
may recompile, until Dynamo turns to dynamic shapes (``train.pad_multiple`` bounds the shapes).
The first update's time and the time Dynamo reports for compiling go to stderr and
``metrics.jsonl`` (``"split": "compile"``); the totals of the run to its summary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from transduce.errors import UserError

# torch.compile's backend: inductor (the one that compiles kernels, and the one the modes are
# of). Tests set "eager" (Dynamo's graph capture alone: the same wrapping, seconds less per graph)
BACKEND = "inductor"


def check_mode(mode: str | bool, device: torch.device) -> None:
    """A UserError for a ``train.compile`` that cannot work here: reduce-overhead is CUDA
    graphs, which a CPU has not (refused rather than quietly made ``default``). (Under
    torch.compile ``transduce.kernels`` leaves its CPU library operators, which inductor cannot
    lower, for plain ``F.linear``: ``kernels.matmul.use_onednn``.)"""
    if mode == "reduce-overhead" and device.type != "cuda":
        raise UserError(
            f"compile: reduce-overhead captures CUDA graphs, which need a CUDA device; "
            f"train.device is {device.type}: use compile: default (or false)"
        )


def _dynamo_seconds_and_graphs() -> tuple[float, int]:
    """Seconds Dynamo has spent compiling in this process, and the graphs it has made (torch's
    own bookkeeping, a private API: (0, 0) if it is not there)."""
    try:
        from torch._dynamo.utils import calculate_time_spent, counters

        seconds = float(calculate_time_spent().get("total_wall_time", 0.0))
        return seconds, int(counters["stats"].get("unique_graphs", 0))
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - another torch
        return 0.0, 0


class CompiledForward:
    """``net`` (the model, or its DDP wrapper) compiled in place with ``mode`` while it trains
    (``attach`` to ``release``), and the clock of its compiling; ``mode`` False: nothing is
    compiled and every method does nothing. A ``mode`` the device cannot do is a UserError now."""

    def __init__(
        self, net: torch.nn.Module, mode: str | bool, device: torch.device, precision: str
    ) -> None:
        self.net, self.mode = net, mode
        self.first_update_s: float | None = None
        self._started = 0.0
        self._base_seconds, self._base_graphs = _dynamo_seconds_and_graphs()
        if mode:
            check_mode(mode, device)

    @property
    def on(self) -> bool:
        return bool(self.mode)

    def attach(self) -> None:
        """The compiled forward from now on (as training starts; compiling waits for the first
        call)."""
        if not self.on:
            return
        if BACKEND == "inductor":
            self.net.compile(mode=str(self.mode))
        else:
            self.net.compile(backend=BACKEND)

    def release(self) -> None:
        """The plain forward again (after training: decoding and export use the model)."""
        if self.on:
            self.net._compiled_call_impl = None

    @contextmanager
    def eager(self) -> Iterator[None]:
        """The plain forward within the block (validation)."""
        compiled = self.net._compiled_call_impl
        self.net._compiled_call_impl = None
        try:
            yield
        finally:
            self.net._compiled_call_impl = compiled

    def start_update(self) -> None:
        """Called as an update starts: the first one's clock starts."""
        if self.on and self.first_update_s is None:
            self._started = time.monotonic()

    def timing_first_update(self) -> bool:
        """Whether the update under way is the first one, whose time is reported."""
        return self.on and self.first_update_s is None

    def end_update(self, step: int) -> dict[str, Any] | None:
        """Called as an update ends: after the first, its ``metrics.jsonl`` record."""
        if not self.on or self.first_update_s is not None:
            return None
        self.first_update_s = time.monotonic() - self._started
        return {"step": step, "split": "compile", **self.totals()}

    def totals(self) -> dict[str, Any]:
        """The first update's seconds (compiling included), Dynamo's compile seconds and graphs
        so far in this run (empty with compile off)."""
        if not self.on:
            return {}
        seconds, graphs = _dynamo_seconds_and_graphs()
        return {
            "compile_mode": self.mode,
            "first_update_s": round(self.first_update_s or 0.0, 2),
            "compile_s": round(seconds - self._base_seconds, 2),
            "compiled_graphs": graphs - self._base_graphs,
        }

    def line(self) -> str:
        """The stderr line after the first update."""
        t = self.totals()
        return (
            f"transduce: compile ({t['compile_mode']}): the first update took "
            f"{t['first_update_s']:.1f} s, {t['compile_s']:.1f} s of it compiling "
            f"({t['compiled_graphs']} graph(s))"
        )


__all__ = ["BACKEND", "CompiledForward", "check_mode"]
