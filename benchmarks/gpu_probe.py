"""The pieces of a training step timed alone on a GPU, each against its alternatives: which
attention kernel for short sentences, which layer norm, how to cast the working weights; and
one piece of a decoding step, a beam's top-k.

    python benchmarks/gpu_probe.py [--device cuda] [--quick]

    attention  softmax(Q K^T / sqrt(d_k)) V forward and backward at the paper batch's shapes
               (1024 sentences x 8 heads x 24 positions x 64) and SMALL's (64 x 4 x 24 x 64),
               bf16, three cases (no mask, causal, a padding mask), on each SDPA backend
               (cuDNN, flash, memory-efficient, math) and transduce's explicit formula, also
               at 12, 48, 64, 128 and 256 positions (~25k tokens each)
    norm       LayerNorm(x + Dropout(y)) forward and backward on (24576, 512) bf16: PyTorch's
               kernels, that sum compiled by inductor into fused kernels, Liger's Triton layer
               norm (when liger-kernel is installed)
    cast       the base model's float32 weights into a bfloat16 copy: ``_foreach_copy_`` (what
               ``WorkingWeights.refresh`` does), one copy per tensor, and one copy of a flat
               buffer
    topk       a beam step's candidates on decode_gpu.py's shapes (rows = batch 32 or 128 x beam
               4, the OPUS-MT vocabulary of 58,101), from bf16 logits: ``log_softmax`` in
               float32 then ``torch.topk`` (the CPU's way but for its chunks), the same with
               the chunked top-k of ``inference/topk.py``, a top-k of the logits themselves
               with a float32 log-sum-exp beside, and the tiles of ``kernels.log_softmax_topk``
               (Triton; the search's way on CUDA)

Prints one line per measurement (milliseconds, the median of --repeats timings of --iters
calls each, device-synchronised), then one JSON line of them all. On a CPU (``--device cpu``)
it is a dry run at tiny sizes: the same code paths, figures that mean nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step  # noqa: E402  (the model sizes and builders of the speed benchmark)

from transduce import kernels  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, iters: int, repeats: int) -> float:
    """Median milliseconds of one call of ``fn`` (after two warm-up calls)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / iters * 1e3)
    return statistics.median(times)


def attention_cases(
    device: torch.device, shapes: dict[str, tuple[int, int, int, int]], dtype: torch.dtype
) -> dict[str, Callable[[], object] | None]:
    """name -> a forward-and-backward call (None where the backend refuses the case)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    calls: dict[str, Callable[[], object] | None] = {}
    for shape_name, (b, h, t, k) in shapes.items():
        g = torch.Generator(device="cpu").manual_seed(0)
        q, key, v = (
            torch.randn(b, h, t, k, generator=g).to(device, dtype).requires_grad_()
            for _ in range(3)
        )
        grad = torch.randn(b, h, t, k, generator=g).to(device, dtype)
        lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
        pad = (torch.arange(t)[None, :] < lengths[:, None]).to(device)[:, None, None, :]
        cases = {"none": (None, False), "causal": (None, True), "padding": (pad, False)}
        for case, (mask, causal) in cases.items():
            for name, backend in backends.items():

                def call(
                    mask: Tensor | None = mask,
                    causal: bool = causal,
                    backend: object = backend,
                    qkv: tuple[Tensor, ...] = (q, key, v, grad),  # this shape's, bound now
                ) -> None:
                    with sdpa_kernel([backend]):  # type: ignore[list-item]
                        out = F.scaled_dot_product_attention(
                            *qkv[:3], attn_mask=mask, is_causal=causal
                        )
                    torch.autograd.grad(out, qkv[:3], qkv[3])  # no .grad to accumulate into

                try:
                    call()
                    calls[f"attention/{shape_name}/{case}/{name}"] = call
                except RuntimeError:  # this backend cannot take this case here
                    calls[f"attention/{shape_name}/{case}/{name}"] = None

            def formula(
                mask: Tensor | None = mask,
                causal: bool = causal,
                qkv: tuple[Tensor, ...] = (q, key, v, grad),
            ) -> None:
                out = kernels.attention(*qkv[:3], mask, is_causal=causal, path="formula")
                torch.autograd.grad(out, qkv[:3], qkv[3])

            calls[f"attention/{shape_name}/{case}/formula"] = formula
    return calls


def norm_cases(
    device: torch.device, n: int, d: int, dtype: torch.dtype, compile_ok: bool
) -> dict[str, Callable[[], object] | None]:
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(n, d, generator=g).to(device, dtype).requires_grad_()
    y = torch.randn(n, d, generator=g).to(device, dtype).requires_grad_()
    w = torch.ones(d, device=device, dtype=dtype, requires_grad=True)
    b = torch.zeros(d, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(n, d, generator=g).to(device, dtype)

    def post_norm(x: Tensor, y: Tensor, w: Tensor, b: Tensor) -> Tensor:
        return F.layer_norm(x + F.dropout(y, 0.1, True), (d,), w, b, 1e-5)

    inputs = (x, y, w, b)

    def backward(out: Tensor) -> None:  # gradients returned, none accumulated in .grad
        torch.autograd.grad(out, inputs, grad, allow_unused=True)

    calls: dict[str, Callable[[], object] | None] = {
        "norm/add_dropout_layernorm/torch": lambda: backward(post_norm(x, y, w, b)),
        "norm/layernorm/torch": lambda: backward(F.layer_norm(x, (d,), w, b, 1e-5)),
    }
    if compile_ok:
        fused = torch.compile(post_norm, dynamic=False)
        calls["norm/add_dropout_layernorm/compiled"] = lambda: backward(fused(x, y, w, b))
    else:
        calls["norm/add_dropout_layernorm/compiled"] = None
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        def liger(x: Tensor) -> Tensor:
            return LigerLayerNormFunction.apply(x, w, b, 1e-5)

        calls["norm/layernorm/liger"] = lambda: backward(liger(x))
        calls["norm/add_dropout_layernorm/liger"] = lambda: backward(
            liger(x + F.dropout(y, 0.1, True))
        )
    except ImportError:
        calls["norm/layernorm/liger"] = None
        calls["norm/add_dropout_layernorm/liger"] = None
    if device.type != "cuda":  # Triton kernels need a GPU
        calls["norm/layernorm/liger"] = calls["norm/add_dropout_layernorm/liger"] = None
    return calls


def cast_cases(device: torch.device, size: dict[str, int]) -> dict[str, Callable[[], object]]:
    model, _ = train_step.build_transduce(size)
    master = [p.detach().to(device) for p in model.parameters()]
    working = [torch.empty_like(p, dtype=torch.bfloat16) for p in master]
    flat_master = torch.cat([p.reshape(-1) for p in master])
    flat_working = torch.empty_like(flat_master, dtype=torch.bfloat16)

    def per_tensor() -> None:
        for w, m in zip(working, master, strict=True):
            w.copy_(m)

    return {
        "cast/foreach_copy": lambda: torch._foreach_copy_(working, master),
        "cast/per_tensor": per_tensor,
        "cast/flat": lambda: flat_working.copy_(flat_master),
    }


def topk_cases(device: torch.device, shapes: dict[str, tuple[int, int]]) -> dict[str, Callable]:
    from transduce.inference.common import next_token_log_probs
    from transduce.inference.topk import topk_by_chunks

    calls: dict[str, Callable[[], object]] = {}
    g = torch.Generator(device=device).manual_seed(0)
    for label, (rows, vocab) in shapes.items():
        logits = (4 * torch.randn(rows, vocab, generator=g, device=device)).to(torch.bfloat16)

        def torch_topk(x: Tensor = logits) -> object:
            return next_token_log_probs(x, None).topk(4, dim=1)

        def chunked(x: Tensor = logits) -> object:
            return topk_by_chunks(next_token_log_probs(x, None), 4)

        def logits_lse(x: Tensor = logits) -> object:
            values, index = x.topk(4, dim=1)
            return values.float() - torch.logsumexp(x.float(), dim=1, keepdim=True), index

        calls[f"topk/{label}/log_softmax+topk"] = torch_topk
        calls[f"topk/{label}/log_softmax+chunked"] = chunked
        calls[f"topk/{label}/logits_topk+lse"] = logits_lse
        if kernels.log_softmax_topk_pays(device, 4):
            calls[f"topk/{label}/tiles"] = partial(kernels.log_softmax_topk, logits, 4, 0, 1)
        else:  # the search's way on this device is one of the above
            calls[f"topk/{label}/tiles"] = None
    return calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="fewer timings")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--only", default="", help="only the measurements whose names start so")
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16
    if device.type == "cuda":
        shapes = {
            "paper": (1024, 8, 24, 64),
            "small": (64, 4, 24, 64),
            "t12": (2048, 8, 12, 64),  # Multi30k's 25k-token batches: ~13 pieces a sentence
            "t48": (512, 8, 48, 64),
            "t64": (384, 8, 64, 64),
            "t128": (192, 8, 128, 64),  # where flash may beat the memory-efficient kernel:
            "t256": (96, 8, 256, 64),  # training turns flash off at every length
        }
        norm_n, d = 1024 * 24, 512
        size = train_step.SIZES["base"]
        beams = {"b128": (512, 58101), "b32": (128, 58101)}
    else:  # a dry run's sizes
        shapes = {"tiny": (4, 2, 6, 8)}
        norm_n, d = 64, 32
        size = {**train_step.SIZES["small"], "n_layers": 1, "d_model": 32, "d_ff": 64}
        beams = {"tiny": (8, 2000)}
    iters, repeats = (5, 3) if args.quick or device.type == "cpu" else (args.iters, args.repeats)
    calls: dict[str, Callable[[], object] | None] = {}
    calls.update(attention_cases(device, shapes, dtype))
    calls.update(norm_cases(device, norm_n, d, dtype, compile_ok=device.type == "cuda"))
    calls.update(cast_cases(device, size))
    calls.update(topk_cases(device, beams))
    results: dict[str, float | None] = {}
    for name, call in calls.items():
        if not name.startswith(args.only):
            continue
        if call is None:
            results[name] = None
            print(f"{name:45s}   (not available here)", flush=True)
            continue
        try:
            results[name] = round(timed(call, device, iters, repeats), 4)
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            results[name] = None
            print(f"{name:45s}   failed: {type(e).__name__}: {str(e)[:100]}", flush=True)
            continue
        print(f"{name:45s} {results[name]:9.4f} ms", flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        json.dumps(
            {
                "benchmark": "gpu_probe",
                "device": name,
                "torch": torch.__version__,
                "ms": results,
            }
        )
    )


if __name__ == "__main__":
    main()
