"""Adam's step for training in bfloat16 working weights (``precision: bf16-weights``) in one
pass: float32 master weights stepped from the bfloat16 copy's gradients (or their own float32
ones, accumulated over batches or processes), the copy rewritten.

PyTorch's way takes three passes over the parameters: the gradients widened into float32 (6
bytes an element), its fused Adam (28) and the working copy cast anew (6), ~12% of BASE's CPU
step on the Intel AMX machine. The native kernel (``native.adam_bf16_copy``) reads and writes 28
bytes an element, and its numbers are torch's fused Adam's bit for bit (tests/kernels/
test_adam.py), so nothing about training changes but its speed (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from transduce.kernels import native


def bf16_copy_step_takes(masters: list[Tensor], working: list[Tensor]) -> bool:
    """Whether ``adam_bf16_copy`` can step ``masters`` (contiguous float32 CPU tensors) with
    ``working`` (their contiguous bfloat16 copies) as torch's fused Adam would: the native
    kernels built, not under torch.compile, and PyTorch's CPU kernels built for AVX2 or AVX-512
    (its plain build rounds the multiply-adds that this step fuses)."""
    return (
        all(_dense(p, torch.float32) for p in masters)
        and all(_dense(w, torch.bfloat16) for w in working)
        and torch.backends.cpu.get_cpu_capability().startswith(("AVX2", "AVX512"))
        and not torch.compiler.is_compiling()
        and native.available()
    )


def _dense(t: Tensor, dtype: torch.dtype) -> bool:
    return t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous()


@functools.lru_cache(maxsize=1)
def torch_vector_width() -> int:
    """The float lanes of PyTorch's CPU kernels here (16 where they run AVX-512, else 8): the
    last ``numel % width`` elements of a tensor go through its scalar loop, whose roundings the
    native step copies there."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


def adam_bf16_copy(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    working: list[Tensor],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    grad_scale: float,
) -> None:
    """``torch.optim.Adam(fused=True, decoupled_weight_decay=True)``'s step of ``params`` from
    ``grads`` (each bfloat16 or float32) times ``grad_scale`` (float32 rounding, as clipping
    multiplies), its state (``exp_avgs``, ``exp_avg_sqs``, ``steps``) updated in place and
    ``working`` set to the new ``params`` rounded to bfloat16; needs ``bf16_copy_step_takes``.
    The native kernel steps all but the last ``numel % torch_vector_width()`` elements of each
    tensor, torch's own kernel those (its scalar loop's roundings are its compiler's: none of
    BASE's tensors has such a tail)."""
    width = torch_vector_width()
    native.adam_bf16_copy(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        steps,
        working,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        grad_scale=grad_scale,
        vector_width=width,
    )
    for j, p in enumerate(params):
        body = p.numel() - p.numel() % width
        if body == p.numel():
            continue
        tail = p.view(-1)[body:]
        grad = grads[j].view(-1)[body:].float() * torch.tensor(grad_scale, dtype=torch.float32)
        adamw = torch._fused_adamw_ if weight_decay else torch._fused_adam_
        adamw(  # the step already counted by the native call
            [tail], [grad], [exp_avgs[j].view(-1)[body:]], [exp_avg_sqs[j].view(-1)[body:]], [],
            [steps[j]], amsgrad=False, lr=lr, beta1=betas[0], beta2=betas[1],
            weight_decay=weight_decay, eps=eps, maximize=False,
        )  # fmt: skip
        working[j].view(-1)[body:].copy_(tail)


__all__ = ["adam_bf16_copy", "bf16_copy_step_takes", "torch_vector_width"]
