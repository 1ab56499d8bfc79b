"""``train.precision: bf16-weights``: the model trains in bfloat16 working weights, cast from the
float32 master weights once per update (fairseq's ``--bf16``, Apex's O2).

Under autocast (``precision: bf16``) every weight is cast to bfloat16 at each forward pass, its
gradient cast back at each backward, and the activations move between float32 and bfloat16 around
every layer norm, residual sum and softmax (autocast runs those in float32): on an H200 these
copies were ~15% of the paper's base step (issue 40). Here a second module, a bfloat16 copy of the
model, runs forward and backward: its activations stay bfloat16 throughout (layer norms and
softmax accumulate in float32 inside their kernels), and the only casts are of the weights, once
per update, and of the gradients, once per batch (into float32, where the accumulation of
``update_freq`` batches happens).

Where the native kernels run (CPU), Adam's step writes the working copy in the same pass
(``step``; kernels/adam.py), torch's fused Adam bit for bit; an update of one batch on one
process skips the float32 gradients altogether: the norm is taken of the bfloat16 gradients (the
same number) and the step reads them.

The float32 model stays what the optimizer steps, what checkpoints hold, what validation and
decoding run and what a resume restores: checkpoints are those of any other run, and the working
copy is a function of the master weights, so a resume continues exactly.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from transduce.kernels import adam

WORKING_DTYPE = torch.bfloat16


class WorkingWeights:
    """A bfloat16 copy of ``master`` (``module``) for the forward and backward passes of
    training. ``refresh`` after every change of the master weights (an optimizer step, a
    resume); ``gradients_to_master`` after every backward pass."""

    def __init__(self, master: nn.Module) -> None:
        # a deep copy keeps tied weights tied (one tensor for embeddings and generator)
        self.module = copy.deepcopy(master).to(WORKING_DTYPE)
        self._master_params: list[torch.Tensor] = [
            p for p in master.parameters() if p.requires_grad
        ]
        self._working_params: list[torch.Tensor] = [
            p for p in self.module.parameters() if p.requires_grad
        ]
        self._working_of = {
            id(m): w for m, w in zip(self._master_params, self._working_params, strict=True)
        }

    def steps(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``step`` can make ``optimizer``'s next update from the working gradients:
        torch's fused Adam (decoupled decay, neither amsgrad nor maximize) with its state made
        for every parameter (its first update is torch's), on a CPU with the native kernels."""
        if not isinstance(optimizer, torch.optim.Adam) or not adam.bf16_copy_step_takes(
            self._master_params, self._working_params
        ):
            return False
        for group in optimizer.param_groups:
            if not _plain_fused_adam(group):
                return False
            for p in group["params"]:
                if id(p) not in self._working_of or not _adam_state(optimizer.state.get(p)):
                    return False
        return True  # (every group checked before any steps: no update is left half made)

    def gradients(self) -> list[torch.Tensor]:
        """The working copy's gradients (bfloat16), those there are."""
        return [p.grad for p in self._working_params if p.grad is not None]

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        grad_scale: float = 1.0,
        *,
        from_master: bool = False,
    ) -> None:
        """Adam's step of the master weights from the working gradients times ``grad_scale``
        (clipping's coefficient), the working weights rewritten from them, the working gradients
        cleared: what ``gradients_to_master``, ``optimizer.step()`` and ``refresh`` do, bit for
        bit, in one pass (needs ``steps(optimizer)``). ``from_master``: from the master weights'
        own float32 gradients instead (an update of several batches or processes, clipped
        already), which are cleared. Parameters without a gradient stay, as torch's Adam leaves
        them."""
        with torch.no_grad():
            for group in optimizer.param_groups:
                masters, grads = [], []
                for p in group["params"]:
                    grad = p.grad if from_master else self._working_of[id(p)].grad
                    if grad is not None:
                        masters.append(p)
                        grads.append(grad.contiguous())
                if not masters:
                    continue
                states = [optimizer.state[p] for p in masters]
                adam.adam_bf16_copy(
                    masters,
                    grads,
                    [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states],
                    [s["step"] for s in states],
                    [self._working_of[id(p)] for p in masters],
                    lr=group["lr"],
                    betas=group["betas"],
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    grad_scale=grad_scale,
                )
        if from_master:
            optimizer.zero_grad(set_to_none=True)
        self.clear_gradients()

    def clear_gradients(self) -> None:
        """The working copy's gradients dropped (an update skipped or made by ``step``)."""
        for p in self._working_params:
            p.grad = None

    def refresh(self) -> None:
        """The working weights cast anew from the master weights (one fused copy)."""
        with torch.no_grad():
            torch._foreach_copy_(self._working_params, self._master_params)

    def gradients_to_master(self) -> None:
        """The working copy's gradients added (in float32) to the master weights' and cleared:
        the batches of an update accumulate in float32, as under autocast. One fused copy for
        the first batch of an update (a cast per parameter was 127 kernels of SMALL's step)."""
        with torch.no_grad():
            fresh: list[tuple[torch.Tensor, torch.Tensor]] = []  # (master, working gradient)
            for working, master in zip(self._working_params, self._master_params, strict=True):
                grad = working.grad
                if grad is None:
                    continue
                if master.grad is None:
                    fresh.append((master, grad))
                else:  # a later batch of the update (update_freq > 1)
                    master.grad.add_(grad)
                working.grad = None
            if fresh:
                buffers = [torch.empty_like(master) for master, _ in fresh]
                torch._foreach_copy_(buffers, [grad for _, grad in fresh])
                for (master, _), buffer in zip(fresh, buffers, strict=True):
                    master.grad = buffer


def _plain_fused_adam(group: dict[str, Any]) -> bool:
    """A parameter group that ``WorkingWeights.step`` computes as torch does: fused, decoupled
    weight decay (or none), a float learning rate, no amsgrad, maximize or differentiable."""
    decoupled = group.get("decoupled_weight_decay", False) or group["weight_decay"] == 0
    return (
        bool(group.get("fused"))
        and decoupled
        and isinstance(group["lr"], float)
        and not any(group.get(key) for key in ("amsgrad", "maximize", "differentiable"))
        and not group.get("capturable")
    )


def _adam_state(state: dict[str, Any] | None) -> bool:
    """Adam's state of one parameter, made (after its first update) as the fused Adam keeps it:
    its moments contiguous (as the step reads them), its step count one float32 number."""
    if not state or not all(k in state for k in ("step", "exp_avg", "exp_avg_sq")):
        return False
    step = state["step"]
    moments = all(state[k].is_contiguous() for k in ("exp_avg", "exp_avg_sq"))
    return (
        moments
        and isinstance(step, torch.Tensor)
        and step.dtype == torch.float32
        and step.numel() == 1
    )


__all__ = ["WORKING_DTYPE", "WorkingWeights"]
