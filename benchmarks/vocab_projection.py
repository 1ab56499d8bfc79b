"""The pre-softmax projection while decoding: the (V, D) weight as ``nn.Linear`` holds it, against
a contiguous (D, V) copy, for the rows of a decoding step.

    python benchmarks/vocab_projection.py [--threads 2] [--rounds 3]

For the SMALL (8000 x 256) and BASE (37000 x 512) vocabularies of benchmarks/decode.py and 1,
2, 4, 32 and 128 rows: ``F.linear(x, W)`` against ``x @ W_t`` with ``W_t = transposed(W)``, float32,
each the best of ``--rounds`` interleaved rounds; and what making ``W_t`` costs (once per
``DecodingModel``, ``transduce.kernels.projection.transposed`` against ``W.t().contiguous()``). This
is the measurement behind the (D, V) layout of ``DecodingModel``. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from transduce.kernels.projection import transposed
from transduce.runtime import tune_malloc

SIZES = {"small": (8000, 256), "base": (37000, 512)}
ROWS = (1, 2, 4, 32, 128)


def per_call_us(fn, calls: int) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def once_ms(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tune_malloc()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result: dict = {"threads": args.threads}
    print(f"{'size':6} {'rows':>5} {'linear us':>10} {'transposed us':>14} {'ratio':>6}")
    with torch.inference_mode():
        for name, (v, d) in SIZES.items():
            w = torch.randn(v, d)
            w_t = transposed(w)
            calls = 200 if name == "small" else 30
            for rows in ROWS:
                x = torch.randn(rows, d)
                best = {"linear": float("inf"), "transposed": float("inf")}
                for _ in range(args.rounds):  # interleaved: drift hits both alike
                    best["linear"] = min(best["linear"], per_call_us(lambda: F.linear(x, w), calls))
                    best["transposed"] = min(
                        best["transposed"], per_call_us(lambda: x @ w_t, calls)
                    )
                ratio = best["linear"] / best["transposed"]
                print(
                    f"{name:6} {rows:5d} {best['linear']:10.0f} {best['transposed']:14.0f} {ratio:6.2f}"
                )
                result[f"{name}_rows{rows}_linear_over_transposed"] = round(ratio, 2)
            blocked = once_ms(lambda: transposed(w), args.rounds)
            plain = once_ms(lambda: w.t().contiguous(), args.rounds)
            print(
                f"{name}: making W_t {blocked:.1f} ms (transposed) vs {plain:.1f} ms (.t().contiguous())"
            )
            result[f"{name}_transpose_ms"] = round(blocked, 1)
            result[f"{name}_t_contiguous_ms"] = round(plain, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
