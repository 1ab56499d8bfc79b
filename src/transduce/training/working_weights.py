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

The float32 model stays what the optimizer steps, what checkpoints hold, what validation and
decoding run and what a resume restores: checkpoints are those of any other run, and the working
copy is a function of the master weights, so a resume continues exactly.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

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


__all__ = ["WORKING_DTYPE", "WorkingWeights"]
