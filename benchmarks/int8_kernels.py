"""int8 projections for decoding on the CPU: which kernel multiplies x W^T + b fastest with W in
int8 (per-output-channel symmetric scales), against the float32 ``kernels.Projection``.

    python benchmarks/int8_kernels.py [--threads 2] [--rounds 5] [--quick]

Weights of the engine's projections (``DecodingModel``) for a d_model 512 / d_ff 2048 model
(qkv 1536x512, attention out 512x512, FFN in 2048x512, FFN out 512x2048) and a d_model 256 /
d_ff 1024 one, and the pre-softmax matrix for vocabularies of 8000 and 32000, each at 1, 4, 32,
128 (32 sentences x beam 4) and 640 (the encoder: 32 sentences x 20 tokens) rows. Candidates:

    fp32       ``kernels.Projection`` as the engine lays it out for float32 (the reference)
    fbgemm     ``torch.ops.quantized.linear_dynamic`` on fbgemm-prepacked weights (x quantised
               per tensor to uint8 on every call, inside the operator)
    fbgemm_rows  what ``Int8Projection`` runs below ``ONEDNN_MIN_ROWS`` rows: the same operator
               with x quantised per row (``fbgemm_linear_rows``: a guard row fixes the range,
               each row scaled to it)
    onednn     ``torch.ops.onednn.qlinear_pointwise`` on oneDNN-prepacked weights, x quantised per
               tensor to int8 in Python on every call (a new kernel for every new scale)
    onednn_rows  what ``Int8Projection`` runs from ``ONEDNN_MIN_ROWS`` rows where the CPU has AMX
               (``onednn_linear_rows``: x per row on a fixed grid, so one kernel; bit for bit
               fbgemm_rows' numbers); timed from 4 rows (one row took milliseconds at some shapes)
    int8pack   ``torch._weight_int8pack_mm``: int8 weights, float32 activations

oneDNN and int8pack are timed at 1 and 4 rows only: past that a call takes up to a second.
Each figure is the best of ``--rounds`` rounds, the candidates alternating within a round; the
table prints each candidate's time over fp32's (< 1: faster than float32) and the largest
relative error against x W_q^T + b (the dequantised weights in float32). Ends with one JSON line.
The measurement behind ``transduce.kernels.quantized``'s choice of kernel.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable

import torch

from transduce.kernels import Projection, ProjectionLayout
from transduce.kernels.quantized import (
    OnednnInt8,
    QuantizedWeight,
    cpu_int8_flags,
    fbgemm_linear,
    fbgemm_linear_rows,
    fbgemm_packed,
    onednn_linear_rows,
    quantize_weight,
)

SHAPES = {  # name -> (out, in)
    "qkv512": (1536, 512),
    "out512": (512, 512),
    "ffn_in512": (2048, 512),
    "ffn_out512": (512, 2048),
    "qkv256": (768, 256),
    "ffn_in256": (1024, 256),
    "vocab8k_256": (8000, 256),
    "vocab8k_512": (8000, 512),
    "vocab32k_512": (32000, 512),
}
ROWS = (1, 4, 32, 128, 640)
QUICK_SHAPES = ("qkv512", "vocab8k_256")
NAMES = ("fp32", "fbgemm", "fbgemm_rows", "onednn_rows", "onednn", "int8pack")
SLOW, SLOW_MAX_ROWS = ("onednn", "int8pack"), 4
ONEDNN_ROWS_MIN = 4  # onednn_rows from this many rows


def per_call_us(fn: Callable[[], object], seconds: float = 0.1) -> float:
    """Microseconds a call, over about ``seconds`` of calls after two warm-up calls."""
    fn()
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed > seconds and calls >= 3:
            return elapsed / calls * 1e6


def onednn_qlinear(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """x (N, in) -> x W^T + b through oneDNN's int8 inner product, x quantised per tensor to int8
    here (oneDNN takes its scale when it builds the kernel: a new kernel for every new scale)."""
    x_scale = float(x.abs().max()) / 127 or 1.0
    xq = torch.round(x * (1.0 / x_scale)).clamp_(-127, 127).to(torch.int8)
    zeros = torch.zeros(scale.numel(), dtype=torch.long)
    return torch.ops.onednn.qlinear_pointwise(
        xq, x_scale, 0, packed, scale, zeros, bias, 1.0, 0, torch.float32, "none", [None], ""
    )


def int8pack_linear(x: torch.Tensor, q: QuantizedWeight, bias: torch.Tensor) -> torch.Tensor:
    """x (N, in) float32 against int8 weights dequantised inside the kernel."""
    return torch._weight_int8pack_mm(x, q.weight, q.scale).add_(bias)


def candidates(w: torch.Tensor, b: torch.Tensor) -> dict[str, Callable[[torch.Tensor], object]]:
    q = quantize_weight(w)
    fp32 = Projection.of(w, b, ProjectionLayout.choose(w))
    fbgemm = fbgemm_packed(q, b)
    fbgemm_no_bias = fbgemm_packed(q, None)
    onednn = torch.ops.onednn.qlinear_prepack(q.weight, None)
    onednn_rows = OnednnInt8.of(q)
    return {
        "fp32": fp32,
        "fbgemm": lambda x: fbgemm_linear(x, fbgemm),
        # what Int8Projection runs: x quantised per row (a guard row, a scale a row)
        "fbgemm_rows": lambda x: fbgemm_linear_rows(x, fbgemm_no_bias, b),
        "onednn_rows": lambda x: onednn_linear_rows(x, onednn_rows, b),
        "onednn": lambda x: onednn_qlinear(x, onednn, q.scale, b),
        "int8pack": lambda x: int8pack_linear(x, q, b),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="two shapes, one round (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = QUICK_SHAPES if args.quick else tuple(SHAPES)
    rounds = 1 if args.quick else args.rounds
    results: dict[str, dict[str, dict[str, float]]] = {}
    print(f"{platform.machine()}, int8 flags {cpu_int8_flags()}, {args.threads} threads")
    print("time over fp32's (largest error relative to the output's largest magnitude)")
    print(f"{'shape':>13} {'rows':>4} " + " ".join(f"{n:>16}" for n in NAMES[1:]) + "  fp32")
    with torch.inference_mode():
        for name in shapes:
            out_f, in_f = SHAPES[name]
            g = torch.Generator().manual_seed(out_f + in_f)
            w = torch.randn(out_f, in_f, generator=g) / in_f**0.5
            b = torch.randn(out_f, generator=g) * 0.1
            fns = candidates(w, b)
            dequant = quantize_weight(w).dequantized()
            for rows in ROWS:
                x = torch.randn(rows, in_f, generator=g)
                ref = torch.addmm(b, x, dequant.t())
                # oneDNN's and int8pack's products take seconds past a few rows
                names = [
                    k
                    for k in NAMES
                    if (rows <= SLOW_MAX_ROWS or k not in SLOW)
                    and (rows >= ONEDNN_ROWS_MIN or k != "onednn_rows")
                ]
                best = dict.fromkeys(names, float("inf"))
                for _ in range(rounds):
                    for k in names:
                        fn = fns[k]
                        best[k] = min(best[k], per_call_us(lambda fn=fn: fn(x)))
                row = {
                    k: {
                        "us": round(best[k], 1),
                        "vs_fp32": round(best[k] / best["fp32"], 3),
                        "rel_err": round(float((fns[k](x) - ref).abs().max() / ref.abs().max()), 5),
                    }
                    for k in names
                }
                results[f"{name}_r{rows}"] = row
                cells = " ".join(
                    f"{row[k]['vs_fp32']:>7.2f} ({row[k]['rel_err']:.0e})"
                    if k in row
                    else f"{'-':>16}"
                    for k in NAMES[1:]
                )
                print(f"{name:>13} {rows:>4} {cells}  {best['fp32']:.0f} us", flush=True)
    print(json.dumps({"threads": args.threads, "int8_flags": cpu_int8_flags(), "results": results}))


if __name__ == "__main__":
    main()
