"""Rules that depend only on the kind of device that computes: the rest of the package asks these
rather than branching on ``device.type`` (tests/kernels/test_vendor_rules_live_in_kernels.py)."""

from __future__ import annotations

import torch


def reads_are_cheap(device: torch.device) -> bool:
    """Whether reading a small tensor's values back into Python costs no more than the work that
    made it: on a CPU every operator has finished when it returns; on a GPU a read waits for every
    kernel queued before it. Where reads are cheap, decoding may count rows and skip work by the
    count (the engine cache's in-place reorder, measured faster on CPUs: benchmarks/RESULTS.md);
    elsewhere one kernel over every row avoids the wait (not measured on a GPU)."""
    return device.type == "cpu"


def topk_by_chunks_pays(device: torch.device) -> bool:
    """Whether a wide row's top-k is found faster through its chunks' maxima
    (``inference.topk.chunked_topk``) than by ``torch.topk``: on CPUs, where ``torch.topk``
    sorts within every row (measured: benchmarks/RESULTS.md). On an H200 the chunks took 0.47 ms
    against ``torch.topk``'s 0.68 at 512 x 58,101, but the logits' tiles (``topk_tiles``) 0.175:
    beam search takes those on CUDA, and the chunks stay a CPU rule."""
    return device.type == "cpu"


def graphs_capture(device: torch.device) -> bool:
    """Whether work on ``device`` can be captured once as a CUDA graph and replayed with one
    launch (``torch.cuda.CUDAGraph``): CUDA devices (not measured on ROCm, whose HIP graphs
    PyTorch drives through the same API)."""
    return device.type == "cuda"


def kept_graph_bytes(device: torch.device) -> int:
    """The bytes of static decoding buffers (the shapes of CUDA-graph steps kept for later
    searches) one decoder may keep on ``device``: an eighth of a CUDA device's memory (a file's
    batches came in 17 shapes, the largest ~1.5 GiB in float32 for an OPUS-MT-sized model at
    batch_tokens 4000 and beam 4); 1 GiB elsewhere (the eager static steps of the tests)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory) // 8
    return 2**30


__all__ = ["graphs_capture", "kept_graph_bytes", "reads_are_cheap", "topk_by_chunks_pays"]
