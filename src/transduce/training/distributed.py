"""Distributed data parallel training on PyTorch's own engine (torchrun + DDP).

``torchrun --nproc_per_node N -m transduce train ...`` starts N processes with RANK, WORLD_SIZE,
LOCAL_RANK and MASTER_ADDR/PORT in the environment; ``init_from_env`` joins them into one process
group (NCCL on GPUs, gloo on CPUs). Every rank reads its own shard of the same token-bucketed
batches; gradients are averaged by DistributedDataParallel (under precision bf16-weights by
``average_gradients``, over the float32 gradients); only rank 0 writes files.
"""

from __future__ import annotations

import datetime
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from transduce.device import resolve_device

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def init_from_env(device: str) -> tuple[World, torch.device]:
    """Join the process group torchrun describes (if any); return the world and this rank's
    device (``cuda`` becomes ``cuda:LOCAL_RANK``)."""
    dev = resolve_device(device)
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World(), dev
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        dev = resolve_device(f"cuda:{local_rank}")  # more processes than GPUs: a clear error
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        # While rank 0 learns the vocabulary the others wait in a collective: on a WMT sample
        # that can outlast the default timeouts (NCCL 10 minutes, gloo 30).
        dist.init_process_group(
            backend="nccl" if dev.type == "cuda" else "gloo", timeout=datetime.timedelta(hours=2)
        )
    return World(rank=rank, size=size, local_rank=local_rank), dev


def shard(batches: Sequence[T], world: World) -> list[T]:
    """This rank's share of ``batches``: every ``size``-th one, after dropping the remainder so
    that all ranks take the same number of steps (a rank with fewer would hang the others);
    ``BatchFeed`` says so on rank 0, once."""
    if not world.distributed:
        return list(batches)
    usable = len(batches) - len(batches) % world.size
    return list(batches[world.rank : usable : world.size])


def all_reduce_sum(values: Sequence[float], world: World, device: torch.device) -> list[float]:
    """Sum a few numbers over all ranks (identity when not distributed)."""
    if not world.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_gather_objects(obj: T, world: World) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` when not distributed."""
    if not world.distributed:
        return [obj]
    out: list[T] = [None] * world.size  # type: ignore[list-item]
    dist.all_gather_object(out, obj)
    return out


def wrap(model: torch.nn.Module, world: World) -> DistributedDataParallel | None:
    """``model`` under DistributedDataParallel when there are several ranks, else None."""
    if not world.distributed:
        return None
    # The only buffers (sinusoid tables) are equal on every rank: no need to sync them each
    # step. Newer torch renames the option; the old name still works there.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return DistributedDataParallel(model, broadcast_buffers=False)


def broadcast_parameters(model: torch.nn.Module, world: World) -> None:
    """Rank 0's parameters on every rank, as DistributedDataParallel makes them when it wraps a
    model (for a run that averages gradients itself: ``average_gradients``)."""
    if not world.distributed:
        return
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=0)


def average_gradients(params: Sequence[torch.nn.Parameter], world: World) -> None:
    """Each parameter's gradient made its mean over the ranks, as DistributedDataParallel's
    all-reduce makes it, in one all-reduce of the gradients flattened (a parameter without a
    gradient on this rank counts as zeros). For precision bf16-weights, whose float32 gradients
    are summed here rather than the bfloat16 ones of the copy that ran backward."""
    if not world.distributed or not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])  # one buffer: one collective
    dist.all_reduce(flat)
    flat /= world.size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def shutdown(*, together: bool = True) -> None:
    """Leave the process group, if this process joined one (NCCL warns at exit otherwise).

    A gloo worker thread frees the tensors of a finished collective after its caller already
    has the result, and freeing a tensor made in Python takes the GIL. A rank that goes straight
    on to exit can start finalizing the interpreter first; the thread then dies inside that
    destructor: "terminate called without an active exception", SIGABRT (pytorch#190489). So
    the GIL is let go before leaving: in a last barrier (``together``: every rank calls this,
    the run went well) and for a moment after it, which is all those threads need."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if together:
        dist.barrier()
    time.sleep(_LET_GO_SECONDS)
    dist.destroy_process_group()


_LET_GO_SECONDS = 0.05
