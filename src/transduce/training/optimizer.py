"""The optimizer of section 5.3: Adam(beta1, beta2, eps), with optional decoupled weight decay.

The paper uses no weight decay. ``weight_decay`` > 0 adds the decoupled form of Loshchilov and
Hutter (2019, "AdamW"): every step multiplies a decayed parameter by ``1 - lr * weight_decay``
before the Adam update, independent of the gradient's scale. (Adam's own coupled L2 term, added to
the gradient, is divided by Adam's running gradient RMS, so it decays the weights with small
gradients most and those with large ones hardly at all; it is not offered.) Only matrices decay:
projections and embeddings (tied with the output projection), not biases or LayerNorm gains and
offsets, the usual split (BERT, GPT-2).
"""

from __future__ import annotations

from typing import Any

import torch


def fused_adam_supported(params: list[torch.nn.Parameter]) -> bool:
    """torch's fused Adam takes floating-point parameters on CPU or CUDA."""
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def parameter_groups(model: torch.nn.Module, *, weight_decay: float) -> list[dict[str, Any]]:
    """Adam's parameter groups: one group without weight decay (as in the paper); with
    ``weight_decay`` > 0, the matrices (``dim() >= 2``) with it and the rest without, in that
    order. One group when there is no decay keeps the optimizer state of older checkpoints
    loadable."""
    params = [p for p in model.parameters() if p.requires_grad]
    if weight_decay == 0:
        return [{"params": params, "weight_decay": 0.0}]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def _count(group: dict[str, Any]) -> int:
    return len(group["params"])


def saved_state_for(
    saved: dict[str, Any], optimizer: torch.optim.Optimizer, model: torch.nn.Module
) -> dict[str, Any]:
    """A checkpoint's optimizer state (``saved``, a ``state_dict``) made to fit ``optimizer``,
    built from the current config, before ``load_state_dict``: each parameter's moments as saved,
    the hyperparameters (betas, eps, weight_decay: what a resume may be allowed to change) the
    optimizer's own, and the learning rate as saved. Saved with one group (weight_decay 0) and
    loaded into two (> 0) or the reverse, the moments move to the parameters' new places (the
    groups' order is ``parameter_groups``'). Any other mismatch is left for ``load_state_dict``
    to refuse."""
    groups, old = optimizer.state_dict()["param_groups"], saved["param_groups"]
    lr = old[0].get("lr", 0.0) if old else 0.0
    if [len(g["params"]) for g in old] == [len(g["params"]) for g in groups]:
        merged = [{**g, "lr": o.get("lr", lr)} for g, o in zip(groups, old, strict=True)]
        return {"state": saved["state"], "param_groups": merged}
    if {len(old), len(groups)} != {1, 2}:
        return saved
    saved_groups = parameter_groups(model, weight_decay=len(old) - 1)  # 1 group or 2, as saved
    old_order = [id(p) for g in saved_groups for p in g["params"]]
    new_order = [id(p) for g in optimizer.param_groups for p in g["params"]]
    if sorted(old_order) != sorted(new_order) or len(old_order) != sum(map(_count, old)):
        return saved
    place = {pid: j for j, pid in enumerate(new_order)}
    state = {place[old_order[int(i)]]: s for i, s in saved["state"].items()}
    return {"state": state, "param_groups": [{**g, "lr": lr} for g in groups]}


def make_optimizer(
    model: torch.nn.Module,
    *,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float = 0.0,
) -> torch.optim.Adam:
    """Adam over ``model``'s parameters, learning rate 0 (the trainer sets it every step)."""
    groups = parameter_groups(model, weight_decay=weight_decay)
    return torch.optim.Adam(
        groups,
        lr=0.0,
        betas=betas,
        eps=eps,
        decoupled_weight_decay=True,  # no effect on a group with weight_decay 0
        # One kernel for all parameters instead of a loop of small ops; the same update
        # rule. (It does not bump the parameters' version counters: no cache may key on them.)
        fused=fused_adam_supported([p for g in groups for p in g["params"]]),
    )
