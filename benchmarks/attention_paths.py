"""The fused attention kernel against the formula on the CPU, at training and decoding shapes.

``transduce.kernels.attention`` picks PyTorch's fused kernel or the explicit formula
(three batched matmuls and a softmax); this times both, so that the choice
(``FORMULA_MAX_KEYS_CPU_TRAINING``) rests on figures. Training rows time forward + backward,
with a key padding mask or the causal mask; decoding rows time one forward under
``torch.inference_mode``. H = 4 heads of 64, 2 threads by default.

    python benchmarks/attention_paths.py [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

H, K = 4, 64


def per_call_us(fn: Callable[[], object], reps: int) -> float:
    for _ in range(max(2, reps // 10)):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e6


def padding_mask(b: int, s: int) -> torch.Tensor:
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)  # (B, 1, 1, S), True = may attend
    mask[::3, ..., -min(4, s - 1) :] = False  # every third sentence shorter
    return mask


def training_rows() -> None:
    from transduce.kernels import attention

    print("training (forward + backward), ms per call")
    for b, s in ((160, 15), (64, 24), (32, 50), (16, 100), (4, 400)):
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(b, H, s, K, dtype=dtype, requires_grad=True) for _ in range(3))
            grad = torch.randn(b, H, s, K, dtype=dtype)
            row = []
            for name, path in (("kernel", "fused"), ("formula", "formula")):
                for kind, mask, causal in (
                    ("mask", padding_mask(b, s), False),
                    ("causal", None, True),
                ):

                    def step() -> None:
                        attention(q, k, v, mask, is_causal=causal, path=path).backward(grad)

                    row.append(f"{name}/{kind} {per_call_us(step, 20) / 1000:6.2f}")
            print(f"  B={b:3d} S={s:3d} {str(dtype)[6:]:8s} " + "  ".join(row))


def decoding_rows() -> None:
    from transduce.kernels import attention

    print("decoding (forward, inference mode), us per call")
    cases = {
        "beam 4 x 32 sentences, self-attention": lambda n: ((128, H, 1, K), (128, H, n, K), False),
        "beam 4 x 32 sentences, cross (20 keys, padded)": lambda n: (
            (32, H, 4, K),
            (32, H, 20, K),
            True,
        ),
        "greedy x 32, self-attention": lambda n: ((32, H, 1, K), (32, H, n, K), False),
        "batch 1, self-attention": lambda n: ((1, H, 1, K), (1, H, n, K), False),
    }
    with torch.inference_mode():
        for name, shapes in cases.items():
            for n in (5, 30):
                q_shape, kv_shape, padded = shapes(n)
                q, k, v = torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape)
                mask = padding_mask(kv_shape[0], kv_shape[2]) if padded else None
                kernel = per_call_us(lambda: attention(q, k, v, mask, path="fused"), 200)
                formula = per_call_us(lambda: attention(q, k, v, mask, path="formula"), 200)
                print(f"  {name:48s} {n:2d} cached: kernel {kernel:7.1f}  formula {formula:7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from transduce.runtime import tune_malloc

    tune_malloc()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    training_rows()
    decoding_rows()


if __name__ == "__main__":
    main()
